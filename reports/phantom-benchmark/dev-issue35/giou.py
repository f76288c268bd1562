"""Paired gIoU of Stage 2 variants against Stage 1 (dev diagnostic, section 16 of README.md).

The paper's gIoU (mean IoU over the positive questions, each level weighted equally) of a Stage 1
folder of a finished ``xflow benchmark phantom`` run (its ``results.jsonl``) and of each FOLDER:
a benchmark method's folder (``results.jsonl``) or a replay (``replay.py``'s ``scores.jsonl``)
on the same questions. Prints each FOLDER's gIoU and its difference from Stage 1 with a 95 %
bootstrap interval over phantoms (2,000 replicates), as the benchmark's claims table pairs them.

    python reports/phantom-benchmark/dev-issue35/giou.py BENCH FOLDER [FOLDER ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def per_question(folder: Path) -> dict[str, float]:
    """``case_id -> IoU`` (0 when both masks are empty)."""
    if (folder / "scores.jsonl").exists():
        stats = {r["case_id"]: r for r in map(json.loads, (folder / "scores.jsonl").open())}
    else:
        stats = {r["case_id"]: r["stats"] for r in map(json.loads, (folder / "results.jsonl").open())}
    return {k: s["intersection"] / s["union"] if s["union"] else 0.0 for k, s in stats.items()}


bench = Path(sys.argv[1])
questions = [json.loads(line) for line in (bench / "stage1" / "results.jsonl").open()]
positives = [q for q in questions if q["positive"]]
levels = sorted({q["level"] for q in positives})
phantom = np.array([q["case_id"].rsplit("_", 1)[0] for q in positives])
phantoms = sorted(set(phantom))
level = np.array([q["level"] for q in positives])
base = per_question(bench / "stage1")
b = np.array([base[q["case_id"]] for q in positives])
rng = np.random.default_rng(0)
draws = [rng.choice(len(phantoms), len(phantoms)) for _ in range(2000)]
rows_of = {p: np.flatnonzero(phantom == p) for p in phantoms}


def giou(values: np.ndarray, rows: np.ndarray) -> float:
    return float(np.mean([values[rows][level[rows] == lv].mean() for lv in levels if (level[rows] == lv).any()]))


everything = np.arange(len(positives))
print(f"stage1 gIoU {giou(b, everything):.3f}")
for name in sys.argv[2:]:
    other = per_question(Path(name))
    o = np.array([other[q["case_id"]] for q in positives])
    diff = o - b
    boot = [giou(diff, np.concatenate([rows_of[phantoms[i]] for i in d])) for d in draws]
    lo, hi = np.percentile(boot, [2.5, 97.5])
    print(f"{name}: gIoU {giou(o, everything):.3f}, minus Stage 1 {giou(diff, everything):+.3f} [{lo:+.3f}, {hi:+.3f}]")
