"""Recompute the table "π_rev's first decision on each Stage 1 lesion, beside the oracle's" of a
benchmark folder from its committed ``revisions.jsonl`` files, against the ground truth.

Until 2026-12-04 that table compared F_seg's own IoU *estimates* (the traces' ``iou`` fields),
not IoUs against the ground truth; ``eval.phantom_statistics.stop_decisions`` now measures the
latter. The phantoms are redrawn from the folder's recorded seed (``manifest.json``); every
question's id and ground-truth area must equal what the folder scored (its ``results.jsonl``; the
files' bytes may differ, PNG writers change). No model is run. Writes ``first-decisions.json``
into the folder.

    python reports/phantom-benchmark/dev-issue35/first_decisions.py BENCHMARK_FOLDER [SCRATCH]
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from monailabel_xflow.data.readers import read_mimic_ils
from monailabel_xflow.eval.phantom_benchmark import interleaved
from monailabel_xflow.eval.phantom_statistics import stop_decisions
from monailabel_xflow.training.demo_data import export_heldout


def redrawn_cases(folder: Path, scratch: Path) -> list:
    """The questions ``folder`` scored, redrawn into ``scratch`` from its manifest's seed and
    checked (id and ground-truth area) against its ``stage1+2/results.jsonl``."""
    manifest = json.loads((folder / "manifest.json").read_text())
    heldout = export_heldout(
        scratch / "data", seed=manifest["seed"], questions=manifest["questions"], size=manifest["size"], progress=False
    )
    cases = interleaved(read_mimic_ils(heldout, split="test", kinds=("basic", "global")).cases)
    lines = (folder / "stage1+2" / "results.jsonl").read_text().splitlines()
    scored = {r["case_id"]: r["stats"]["gt_area"] for r in map(json.loads, filter(str.strip, lines))}
    for c in cases:
        mask = c.load_mask()
        if scored.get(c.case_id) != (0 if mask is None else int(mask.sum())):
            raise SystemExit(f"{folder}: the redrawn question {c.case_id} is not the one it scored")
    return cases


def main(folder: Path, scratch: Path) -> dict:
    cases = redrawn_cases(folder, scratch)
    got = stop_decisions(folder / "stage1+2", folder / "oracle", cases)
    (folder / "first-decisions.json").write_text(json.dumps(got, indent=1) + "\n")
    print(json.dumps(got, indent=1))
    return got


def cli(main: Callable[[Path, Path], object]) -> None:
    """``python SCRIPT FOLDER [SCRATCH]``: ``main(folder, scratch)``, in a temporary scratch
    folder (where the phantoms are redrawn) unless one is given."""
    out = Path(sys.argv[1])
    if len(sys.argv) > 2:
        main(out, Path(sys.argv[2]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(out, Path(tmp))


if __name__ == "__main__":
    cli(main)
