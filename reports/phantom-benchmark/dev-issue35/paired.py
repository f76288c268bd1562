"""Paired per-lesion IoU changes of revision folders against a control (dev diagnostic, section 12).

Every folder holds a ``revisions.jsonl`` replayed behind the same cached Stage 1 (``replay.py``),
so lesions pair up by ``(case_id, lesion index)``; a lesion's IoU change is ``lesion_gains``'.
Prints each folder's mean difference from CONTROL with a 95 % bootstrap interval over questions (2,000
replicates; a question's lesions are resampled together).

    python reports/phantom-benchmark/dev-issue35/paired.py BENCH CONTROL FOLDER [FOLDER ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from replay import bench_cases

from monailabel_xflow.eval.phantom_statistics import lesion_gains

bench, control, folders = Path(sys.argv[1]), Path(sys.argv[2]), [Path(f) for f in sys.argv[3:]]
cases = bench_cases(bench)


base = lesion_gains(control, cases)
for folder in folders:
    other = lesion_gains(folder, cases)
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
