"""``xflow benchmark phantom``: ROSALIA beside XFlow on held-out phantoms (paper Tables 1 and 3).

Choices are made on the dev seed (the default); the report's run is ``--test``, once. Example
(how ``reports/phantom-benchmark/`` was made)::

    xflow benchmark phantom --test --questions 300 --out reports/phantom-benchmark \\
        --rosalia monailabel_xflow/rosalia/demo
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "benchmark",
        help="reproduce the paper's comparison on held-out phantoms "
        "(ROSALIA, XFlow Stage 1, Stage 1 + 2, oracle clicks)",
        description="Benchmarks that score several models on the same questions.",
    )
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    ph = sub.add_parser(
        "phantom",
        help="ROSALIA beside XFlow on held-out phantom questions",
        description="Score ROSALIA (if given), XFlow Stage 1 only, XFlow Stage 1 + 2 and XFlow with oracle "
        "clicks (Algorithm 1 holding the ground truth: the upper bound of revision) on held-out phantom "
        "questions balanced over chest/lung/zone and positive/negative. Writes OUT/<method>/ (xflow eval "
        "reports and predictions), OUT/benchmark.md and benchmark.json (Table 1 and Table 3 layouts, the "
        "effect of revision case by case, latency), levels.png, findings.png and contact-sheet.png. Three "
        "trivial baselines (never present; always present with the whole region the question names; that "
        "region only when the question names two or more regions, the questions' text shortcut) are in "
        "every table; every figure has a bootstrap 95 % interval over phantoms and every claim its paired "
        "interval. Protocol: make every choice on the dev seed (default); run --test once, for the report. "
        "Resumable: a rerun with the same --out continues where it stopped (records of another model are "
        "redone on the dev split); an --out made with another seed, size, question count or data is refused.",
    )
    ph.add_argument("--out", type=Path, required=True, metavar="DIR", help="benchmark folder (resumes if it exists)")
    ph.add_argument(
        "--model",
        default=None,
        metavar="CONFIG",
        help="XFlow models file (default: the committed demo, monailabel_xflow/demo/models.yaml)",
    )
    ph.add_argument("--rosalia", default=None, metavar="DIR", help="ROSALIA model folder (omit to leave its row out)")
    ph.add_argument("--questions", type=int, default=300, help="held-out questions (default 300, at least 6)")
    ph.add_argument(
        "--seed",
        type=int,
        default=None,
        help="phantom seed (default: the split's, 1000 for dev, 7301 for --test; the demo trains on 0)",
    )
    ph.add_argument(
        "--test",
        action="store_true",
        help="the test split: the report's run, once, with the models chosen on the dev seed",
    )
    ph.add_argument("--size", type=int, default=256, help="phantom side in pixels (default 256, the demo's)")
    ph.add_argument(
        "--methods",
        default=None,
        metavar="LIST",
        help="comma-separated subset of rosalia,stage1,stage1+2,oracle (default: all available)",
    )
    ph.add_argument("--no-plots", action="store_true", help="skip the PNG plots and the contact sheet")
    ph.add_argument("--no-progress", action="store_true", help="no progress bars")
    ph.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from monailabel_xflow.eval.evaluate import EvaluationError
    from monailabel_xflow.eval.phantom_benchmark import METHOD_TITLES, run_benchmark
    from monailabel_xflow.workflow.model_config import DEMO_MODELS_FILE, ModelConfigError

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.questions < 6:
        print("xflow benchmark phantom: --questions must be at least 6 (one per level and sign)", file=sys.stderr)
        return 2
    model = args.model or str(DEMO_MODELS_FILE)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    try:
        summary = run_benchmark(
            args.out,
            model,
            rosalia=args.rosalia,
            questions=args.questions,
            seed=args.seed,
            phantom_size=args.size,
            methods=methods,
            progress=not args.no_progress,
            plots=not args.no_plots,
            split="test" if args.test else "dev",
        )
    except (ValueError, ModelConfigError, OSError, EvaluationError) as err:
        print(f"xflow benchmark phantom: {err}", file=sys.stderr)
        return 2
    protocol = summary["protocol"]
    print(
        f"{protocol['split']} split, seed {protocol['seed']}, {summary['questions']} questions "
        "(value [bootstrap 95 % interval over phantoms])"
    )
    for m, s in summary["methods"].items():
        c = s["ci"]

        def fmt(key: str, c: dict[str, Any] = c) -> str:
            v = c[key]
            if v["value"] is None:
                return "—"
            return f"{v['value']:.3f}" + ("" if v["low"] is None else f" [{v['low']:.2f}, {v['high']:.2f}]")

        print(
            f"{METHOD_TITLES[m]:38s} gIoU {fmt('giou')}  cIoU {fmt('ciou')}  F1 {fmt('f1')}  "
            f"N-Acc {fmt('n_acc')}  ΔC {fmt('delta_c')}  specks {fmt('specks')}"
        )
    for claim in summary["bootstrap"]["claims"]:
        print(f"claim: {claim['claim']}: {claim['verdict']}")
    print(f"summary in {args.out / 'benchmark.md'}")
    errors = sum(s["errors"] for s in summary["methods"].values())
    if errors:
        print(
            f"xflow benchmark phantom: {errors} question(s) could not be scored (listed in the reports)",
            file=sys.stderr,
        )
        return 1
    return 0
