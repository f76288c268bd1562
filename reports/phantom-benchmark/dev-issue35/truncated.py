"""π_rev's revisions cut short after the fact, from a benchmark folder's traces (dev diagnostic, section 13).

No model runs. Each Stage 1 lesion's trace in ``METHOD/revisions.jsonl`` holds the mask after
every turn and F_seg's own IoU estimate of it. A rule keeps a prefix of the turns, and the
lesion's IoU change against the ground truth (``lesion_gains``) is recomputed for the mask the
prefix ends on:

* ``estimate MARGIN``: stop before the first click whose mask F_seg estimates no better than the
  previous mask by MARGIN (a self-check without the ground truth);
* ``budget``: keep the first 1..4 clicks, of either polarity, or only while they are positive
  (or negative).

    python reports/phantom-benchmark/dev-issue35/truncated.py BENCH METHOD estimate MARGIN
    python reports/phantom-benchmark/dev-issue35/truncated.py BENCH METHOD budget
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from replay import bench_cases

from monailabel_xflow.eval.phantom_statistics import lesion_gains

Rule = Callable[[int, dict[str, Any], float], bool]  # (click index, step, previous estimate) -> keep it


def truncated_gain(folder: Path, cases: list, keep: Rule) -> float:
    """Mean IoU change per lesion when each trace ends before the first click ``keep`` rejects."""
    with tempfile.TemporaryDirectory() as scratch:
        traced = (folder / "revisions.jsonl").read_text().splitlines()
        with open(Path(scratch) / "revisions.jsonl", "w") as out:
            for line in traced:
                record = json.loads(line)
                for lesion in record["lesions"]:
                    mask, estimate = lesion["initial_mask"], lesion["initial_iou"]
                    for k, step in enumerate(lesion.get("steps", [])):
                        if step.get("action") != "click" or not keep(k, step, estimate):
                            break
                        mask, estimate = step["mask"], step["iou"]
                    lesion["mask"] = mask
                out.write(json.dumps(record) + "\n")
        return float(np.mean(list(lesion_gains(Path(scratch), cases).values())))


def main(bench: Path, method: str, mode: str, margin: float = 0.0) -> None:
    cases = bench_cases(bench)
    folder = bench / method
    print(f"{bench.name}/{method}: as traced {truncated_gain(folder, cases, lambda k, s, e: True):+.4f} per lesion")
    if mode == "estimate":
        gain = truncated_gain(folder, cases, lambda k, s, e: s["iou"] >= e + margin)
        print(f"  stop when F_seg's estimate rises by less than {margin}: {gain:+.4f}")
        return
    for budget in (1, 2, 3, 4):
        for polarity in ("any", "positive", "negative"):
            gain = truncated_gain(
                folder, cases, lambda k, s, e, b=budget, p=polarity: k < b and p in ("any", s["click"]["polarity"])
            )
            print(f"  first {budget} click(s), {polarity}: {gain:+.4f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], *(float(a) for a in sys.argv[4:]))
