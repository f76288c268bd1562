"""Paired per-lesion IoU changes of revision folders against a control (dev diagnostic, section 12).

Every folder holds a ``revisions.jsonl`` replayed behind the same cached Stage 1 (``replay.py``),
so lesions pair up by ``(case_id, lesion index)``. A lesion's IoU change is measured against the
ground-truth component its box was drawn for, as ``stop_decisions`` measures it. Prints each
folder's mean difference from CONTROL with a 95 % bootstrap interval over questions (2,000
replicates; a question's lesions are resampled together).

    python reports/phantom-benchmark/dev-issue35/paired.py BENCH CONTROL FOLDER [FOLDER ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from monailabel_xflow import rle
from monailabel_xflow.data.readers import read_mimic_ils
from monailabel_xflow.eval.phantom_statistics import _lesions
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.oracle import GroundTruthReviser

bench, control, folders = Path(sys.argv[1]), Path(sys.argv[2]), [Path(f) for f in sys.argv[3:]]
heldout = bench / "data" / "ground-truth" / "heldout.json"
cases = {c.case_id: c for c in read_mimic_ils(heldout, split="test", kinds=("basic", "global")).cases}


def gains(folder: Path) -> dict[tuple[str, int], float]:
    """``(case_id, lesion) -> IoU after revision - IoU before``, against the lesion's own component."""
    out = {}
    for (case_id, i), les in _lesions(folder / "revisions.jsonl", set(cases)).items():
        before, after = rle.decode(les["initial_mask"]), rle.decode(les["mask"])
        gt = cases[case_id].load_mask()
        target = GroundTruthReviser(np.zeros_like(before) if gt is None else gt).target(tuple(les["box"]))
        out[case_id, i] = mask_iou(after, target) - mask_iou(before, target)
    return out


base = gains(control)
for folder in folders:
    other = gains(folder)
    keys = [k for k in base if k in other]
    diff = np.array([other[k] - base[k] for k in keys])
    questions = sorted({k[0] for k in keys})
    rows = {q: [j for j, k in enumerate(keys) if k[0] == q] for q in questions}
    rng = np.random.default_rng(0)
    means = [
        diff[np.concatenate([rows[questions[p]] for p in rng.choice(len(questions), len(questions))])].mean()
        for _ in range(2000)
    ]
    low, high = np.percentile(means, [2.5, 97.5])
    print(f"{folder.name}: {len(keys)} lesions, {diff.mean():+.4f} [{low:+.4f}, {high:+.4f}]")
