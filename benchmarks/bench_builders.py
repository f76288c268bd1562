"""Builder throughput: training examples per second per core, and the projected wall time to
build the paper's sets (1.03 M π_init examples, 469 k π_rev examples) on N cores.

Runs the real builders (``monailabel_xflow.training.builders.build``) in one process on the
phantom questions of ``sample-data/`` (or ``--dataset SPEC``). rev-sft is timed twice: with the
labelled test-double segmenter (the cost of Algorithm 1, rendering and writing) and with the tiny
random Sam3Tracker (the real F_seg code path at toy size). A full-size F_seg adds its own encode
and decoder time per image (see bench_segmenter.py), which the projection prints separately.

    .venv/bin/python benchmarks/bench_builders.py [--cores 1 8 64] [--cases 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from common import parse_args

REPO = Path(__file__).resolve().parents[1]
PAPER = {"init-sft": 1_030_000, "rev-sft": 469_000}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default=f"mimic-ils:{REPO / 'sample-data' / 'ground-truth' / 'mimic_ils.json'}")
    p.add_argument("--cases", type=int, default=200, help="questions to build per kind")
    p.add_argument("--cores", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument(
        "--encode-s",
        type=float,
        default=97.0,
        help="full-size F_seg encode seconds per image on one CPU core pair (DESIGN §5)",
    )
    args = parse_args(p, argv, cases=6, cores=[1])
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # per-core figures
    import torch

    torch.set_num_threads(1)
    from monailabel_xflow.data.readers import read_dataset
    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.testing import ScriptedSegmenter
    from monailabel_xflow.training.builders import LungBoxes, build

    cases = []
    for split in ("train", "val", "test"):
        cases += read_dataset(args.dataset, split=split, kinds=("basic", "global", "lesion_inference")).cases
    cases = (cases * (args.cases // max(1, len(cases)) + 1))[: args.cases]
    positives = [c for c in cases if c.positive]
    lungs = LungBoxes.for_spec(args.dataset)

    class DoubleFromCase(ScriptedSegmenter):
        """The test double, its hidden object reset per image (it needs the ground truth)."""

        def __init__(self):
            self.cases = iter(positives)
            import numpy as np

            super().__init__(np.zeros((1, 1), bool))

        def set_image(self, image):
            from monailabel_xflow.geometry import resize_mask

            self.target = resize_mask(next(self.cases).load_mask(), image.shape)
            super().set_image(image)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny = load_segmenter(str(build_random_sam3(Path(tmp) / "sam", "tiny")))
        runs = [
            ("init-sft", cases, {"lung_boxes": lungs}),
            ("init-rl", cases, {}),
            ("rev-sft (test double)", positives, {"segmenter": DoubleFromCase()}),
            ("rev-sft (tiny SAM3)", positives, {"segmenter": tiny}),
        ]
        for name, these, kw in runs:
            kind = name.split(" ")[0]
            t0, c0 = time.perf_counter(), time.process_time()
            report = build(kind, these, Path(tmp) / name.replace(" ", "_"), progress=False, **kw)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            # Discarded trajectories cost as much as kept ones: count attempts for the rate.
            attempts = report.rows + report.rejected.get("trajectory discarded (no IoU gain)", 0)
            rows.append((name, len(these), attempts, wall, cpu))
            print(
                f"{name:24s} {len(these):4d} questions -> {report.rows:4d} examples kept of {attempts:4d} in "
                f"{wall:6.2f} s wall ({cpu:6.2f} s CPU): {attempts / cpu:7.1f} attempts/s per core; "
                f"rejected {report.rejected}",
                flush=True,
            )

    print(
        "\nProjected wall time for the paper's sets (CPU-bound, perfect sharding with --shard i/N; "
        "rev-sft counts attempts, so divide by the kept share a trained F_seg achieves):"
    )
    for name, _, n_rows, _, cpu in rows:
        kind = name.split(" ")[0]
        if kind not in PAPER or not n_rows:
            continue
        per_example = cpu / n_rows
        cells = ", ".join(f"{c} cores {PAPER[kind] * per_example / c / 3600:6.2f} h" for c in args.cores)
        print(f"  {name:24s} {PAPER[kind]:>9,d} examples: {cells}")
    print(
        f"  full-size F_seg in the rev-sft loop adds one encode per image ({args.encode_s:.0f} s on a 2-core CPU, "
        f"sub-second on a GPU): {PAPER['rev-sft'] * args.encode_s / 3600 / 24:.0f} CPU-pair days if each example "
        "were a new image; run rev-sft on GPU workers."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
