"""MIMIC-ILS pipeline speed on CPU: images per second per stage, and the projected time for
377,000 images (MIMIC-CXR's frontal studies, the scale the paper ran at).

Run: ``.venv/bin/python benchmarks/bench_ils.py [--size 1024] [--n 12] [--high-recall]``.

Writes a phantom set (``--n`` images at ``--size`` px), then times every step of the pipeline on
it: the report side (section choice and medspaCy structuring of the set's ``reports.csv``), then
the image side with the findings a perfect structurer would give (``phantom_truth``, so every
run does the same image work). BLAS threads are pinned to one, so the figures are per core. The
four vision stages here are the phantom stand-ins (regenerating a phantom is what "anatomy" and
"healthy" cost); real models replace them, so the table also gives the pipeline's own work
(structuring, reading, Algorithm 1, pairs, writing) alone: the part that stays on the CPU
whatever models run on the GPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from pathlib import Path  # noqa: E402

from common import parse_args  # noqa: E402

from monailabel_xflow.data.export import export_set  # noqa: E402
from monailabel_xflow.ils import masks as alg  # noqa: E402
from monailabel_xflow.ils.phantom_truth import truth_inputs  # noqa: E402
from monailabel_xflow.ils.pipeline import PipelineConfig, _stages_for, analyse_study, process_study  # noqa: E402

TARGET = 377_000
STAGES = ("structure", "read", "anatomy", "healthy", "locations", "detector", "algorithm1", "pairs", "write")
STAND_INS = ("anatomy", "healthy", "locations", "detector")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--n", type=int, default=12)
    ap.add_argument("--high-recall", action="store_true")
    a = parse_args(ap, size=256, n=2)
    thresholds = alg.HIGH_RECALL_THRESHOLDS if a.high_recall else alg.DEFAULT_THRESHOLDS
    with tempfile.TemporaryDirectory() as tmp:
        root, out = Path(tmp) / "set", Path(tmp) / "out"
        export_set(root, a.n, seed=11, size=a.size)
        inputs = truth_inputs(root)
        timings: dict[str, float] = {}
        try:  # the report side: choosing the section and structuring it (medspaCy rules)
            from monailabel_xflow.data.mimic_ils import read_reports_csv
            from monailabel_xflow.ils.report import choose_section, structure_section

            texts = [r["report"] for r in read_reports_csv(root / "reports.csv")]
            structure_section(choose_section(texts[0]).text)  # warm-up: builds the medspaCy pipelines
            t0 = time.perf_counter()
            for text in texts:
                structure_section(choose_section(text).text)
            timings["structure"] = time.perf_counter() - t0
        except ImportError:
            print("medspaCy is not installed: the structure stage is left out")
        config = PipelineConfig(out, None, root, thresholds)
        stages = _stages_for(config)
        analyse_study(inputs[0], stages, thresholds)  # warm-up: imports, caches
        t0 = time.perf_counter()
        for inp in inputs:
            analyse_study(inp, stages, thresholds, timings=timings)
        analysed = time.perf_counter() - t0
        t0 = time.perf_counter()
        for inp in inputs:
            process_study(inp, config)  # the same analysis again, plus writing PNGs and the record
        timings["write"] = max(0.0, time.perf_counter() - t0 - analysed)
    findings = sum(len(i.findings) for i in inputs)
    total = sum(timings.values())
    own = sum(v for k, v in timings.items() if k not in STAND_INS)
    print(
        f"{a.n} phantoms at {a.size} px, {findings} reported findings, thresholds "
        f"{'halved' if a.high_recall else 'default'}; one core"
    )
    print(f"{'stage':<12} {'ms/image':>9} {'images/s':>9} {'share':>6}")
    for name in STAGES:
        sec = timings.get(name, 0.0) / a.n
        tag = " (phantom stand-in)" if name in STAND_INS else ""
        print(
            f"{name:<12} {1000 * sec:>9.1f} {1 / sec if sec else float('inf'):>9.2f} "
            f"{timings.get(name, 0.0) / total:>6.1%}{tag}"
        )
    per, own_per = total / a.n, own / a.n
    print(f"{'all':<12} {1000 * per:>9.1f} {1 / per:>9.2f}")
    print(
        f"{TARGET:,} images, everything above: {TARGET * per / 3600:.1f} h on one core, "
        f"{TARGET * per / 3600 / 16:.1f} h on 16 cores"
    )
    print(
        f"{TARGET:,} images, the pipeline's own CPU work ({1000 * own_per:.0f} ms/image; real stage models "
        f"extra): {TARGET * own_per / 3600:.1f} h on one core, {TARGET * own_per / 3600 / 16:.1f} h on 16 cores"
    )


if __name__ == "__main__":
    main()
