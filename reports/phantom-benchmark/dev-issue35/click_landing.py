"""Where π_rev's clicks land, from a benchmark folder's ``stage1+2/revisions.jsonl``, against the
ground truth: each executed click by polarity, inside or outside the mask it corrected, inside or
outside the lesion its box was drawn for (``GroundTruthReviser.target``; empty on a Stage 1 box
with no lesion), with the mean IoU change it caused. Then, offline, a guard: each revision cut
at π_rev's first positive click outside the current mask. No model is run.

    python reports/phantom-benchmark/dev-issue35/click_landing.py BENCHMARK_FOLDER [SCRATCH]
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from first_decisions import cli, redrawn_cases
from scipy.ndimage import distance_transform_edt

from monailabel_xflow import rle
from monailabel_xflow.geometry import point_to_pixel
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.oracle import GroundTruthReviser


def main(folder: Path, scratch: Path) -> dict:
    cases = {c.case_id: c for c in redrawn_cases(folder, scratch)}
    changes: dict[str, list[float]] = defaultdict(list)
    to_lesion, on_empty = [], 0  # positive clicks outside the mask: px to the lesion / on no lesion
    actual, guarded = [], []
    for line in (folder / "stage1+2" / "revisions.jsonl").read_text().splitlines():
        record = json.loads(line)
        gt = cases[record["case_id"]].load_mask()
        for les in record["lesions"]:
            first = rle.decode(les["initial_mask"])
            target = GroundTruthReviser(np.zeros_like(first) if gt is None else gt).target(tuple(les["box"]))
            prev, kept = first, None
            for step in les["steps"]:
                if step["action"] != "click":
                    continue
                click = step["click"]
                positive = click["polarity"] == "positive"
                row, col = point_to_pixel(click["point"][0], click["point"][1], prev.shape)
                after = rle.decode(step["mask"])
                kind = (
                    f"{'positive' if positive else 'negative'}, {'inside' if prev[row, col] else 'outside'} the mask, "
                    f"{'on' if target[row, col] else 'off'} the lesion"
                )
                changes[kind].append(mask_iou(after, target) - mask_iou(prev, target))
                if positive and not prev[row, col]:
                    if target.any():
                        to_lesion.append(float(distance_transform_edt(~target)[row, col]))
                    else:
                        on_empty += 1
                    if kept is None:
                        kept = prev
                prev = after
            base = mask_iou(first, target)
            final = rle.decode(les["mask"])
            actual.append(mask_iou(final, target) - base)
            guarded.append(mask_iou(final if kept is None else kept, target) - base)
    got = {
        "lesions": len(actual),
        "clicks": {k: {"n": len(v), "mean_iou_change": float(np.mean(v))} for k, v in sorted(changes.items())},
        "positive_outside_mask": {
            "on_boxes_without_lesion": on_empty,
            "px_to_lesion_median": float(np.median(to_lesion)) if to_lesion else None,
            "px_to_lesion": sorted(round(d, 1) for d in to_lesion),
        },
        "mean_iou_change_per_lesion": {"pi_rev": float(np.mean(actual)), "guarded": float(np.mean(guarded))},
    }
    print(json.dumps(got, indent=1))
    return got


if __name__ == "__main__":
    cli(main)
