"""``xflow benchmark phantom`` (ROSALIA beside XFlow on held-out phantoms, paper Tables 1 and 3) and
``xflow benchmark clicks`` (click efficiency of F_seg beside classical interactive algorithms).

Choices are made on the dev seed (the default); the report's run is ``--test``, once. Examples
(how ``reports/phantom-benchmark/`` and ``reports/click-efficiency/`` were made)::

    xflow benchmark phantom --test --questions 300 --out reports/phantom-benchmark \\
        --rosalia monailabel_xflow/rosalia/demo
    xflow benchmark clicks --out reports/click-efficiency/dev --phantoms 16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from monailabel_xflow.commands import int_in
from monailabel_xflow.data import PHANTOM_MAX_SIZE, PHANTOM_MIN_SIZE, PHANTOM_SEEDS

PHANTOM_SIDE = int_in(PHANTOM_MIN_SIZE, PHANTOM_MAX_SIZE)
PHANTOM_SEED = int_in(0, PHANTOM_SEEDS - 1)


def register(subparsers) -> None:
    from monailabel_xflow.eval.phantom_protocol import DEV_SEED, SPENT_TEST_SEEDS, TEST_SEED, TRAIN_SEED

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
    ph.add_argument(
        "--rosalia", default=None, metavar="DIR", help="ROSALIA model folder or config (omit to leave its row out)"
    )
    ph.add_argument("--questions", type=int, default=300, help="held-out questions (default 300, at least 6)")
    ph.add_argument(
        "--seed",
        type=PHANTOM_SEED,
        default=None,
        help=(
            f"phantom seed (default: the split's, {DEV_SEED} for dev, {TEST_SEED} for --test; "
            f"spent: {', '.join(map(str, SPENT_TEST_SEEDS))}; training: {TRAIN_SEED})"
        ),
    )
    ph.add_argument(
        "--test",
        action="store_true",
        help="the test split: the report's run, once, with the models chosen on the dev seed",
    )
    ph.add_argument("--size", type=PHANTOM_SIDE, default=256, help="phantom side in pixels (default 256, the demo's)")
    ph.add_argument(
        "--methods",
        default=None,
        metavar="LIST",
        help="comma-separated subset of rosalia,stage1,stage1+2,oracle (default: all available)",
    )
    ph.add_argument("--no-plots", action="store_true", help="skip the PNG plots and the contact sheet")
    ph.add_argument("--no-progress", action="store_true", help="no progress bars")
    ph.set_defaults(func=run)
    _register_clicks(sub)


def _register_clicks(sub) -> None:
    from monailabel_xflow.eval.click_benchmark import DEV_SEED, MAX_CLICKS, TEST_SEED
    from monailabel_xflow.policy.base import MAX_CLICKS_LIMIT
    from monailabel_xflow.policy.oracle import MIN_CLICK_DISTANCE_PX

    cl = sub.add_parser(
        "clicks",
        help="click efficiency of F_seg (IoU after k clicks, NoC) beside the random walker and watershed",
        description="Segment every lesion component of held-out phantoms with a simulated user's clicks "
        "(OracleClicker.next_click on each method's own mask) and report, as interactive segmentation does, "
        "the mean IoU after k = 0..K clicks, NoC@80/85/90 (never reached counts as K + 1) and the share of "
        "components reaching each threshold, with bootstrap 95 % intervals over phantoms, overall, per "
        "finding and per lesion size, and the curve as curve.png. F_seg is called as Stage 2 calls it (box, "
        "every click so far, the previous low-res logits); prompts: the true box + clicks, clicks only, and "
        "clicks as 3D Slicer and OHIF send them (each request every click so far, no mask: the click tool). "
        "Anchors seeded by the same user: scikit-image's random walker and marker watershed. Protocol: make "
        f"every choice on the dev seed ({DEV_SEED}, default); run --test (seed {TEST_SEED}) once, for the "
        "report. Resumable: OUT/results.jsonl gets one line per component, method and prompt, and a rerun "
        "skips finished lines; an OUT made with other settings or another F_seg is refused.",
    )
    cl.add_argument("--out", type=Path, required=True, metavar="DIR", help="benchmark folder (resumes if it exists)")
    cl.add_argument(
        "--model",
        default=None,
        metavar="CONFIG",
        help="models file whose segmenter (and backend, device) is scored (default: the committed demo)",
    )
    cl.add_argument(
        "--segmenter",
        default=None,
        metavar="WEIGHTS",
        help="F_seg weights to score instead (a Sam3TrackerModel folder, a sam3.pt file or a hub id)",
    )
    cl.add_argument(
        "--phantoms", type=int_in(1, 10**4), default=24, help="phantoms (default 24; every lesion component is scored)"
    )
    cl.add_argument("--size", type=PHANTOM_SIDE, default=256, help="phantom side in pixels (default 256, the demo's)")
    cl.add_argument(
        "--seed", type=PHANTOM_SEED, default=None, help=f"phantom seed on the dev split (default {DEV_SEED})"
    )
    cl.add_argument("--test", action="store_true", help=f"the test split (seed {TEST_SEED}): the report's run, once")
    cl.add_argument(
        "--max-clicks",
        type=int_in(1, MAX_CLICKS_LIMIT),
        default=MAX_CLICKS,
        help=f"K, clicks per component (default {MAX_CLICKS}, 1-{MAX_CLICKS_LIMIT})",
    )
    cl.add_argument(
        "--min-click-distance",
        type=float,
        default=MIN_CLICK_DISTANCE_PX,
        metavar="PX",
        help=f"the user's same-polarity click spacing in pixels (default {MIN_CLICK_DISTANCE_PX:g}, the oracle's)",
    )
    cl.add_argument("--methods", default=None, metavar="LIST", help="of fseg,random-walker,watershed (default all)")
    cl.add_argument("--prompts", default=None, metavar="LIST", help="subset of box,clicks,client (default all)")
    cl.add_argument("--no-prune", action="store_true", help="keep F_seg's stray components (Stage 2 prunes)")
    cl.add_argument(
        "--click-refinement",
        choices=("none", "brs"),
        default=None,
        help="make F_seg's masks agree with their clicks by backpropagation (segmenter/refine.py); "
        "default: the models file's, none with --segmenter",
    )
    cl.add_argument("--device", default=None, help="F_seg's device (default: the models file's, else CUDA if present)")
    cl.add_argument("--no-plots", action="store_true", help="skip curve.png")
    cl.add_argument("--no-progress", action="store_true", help="no progress bar")
    cl.set_defaults(func=run_clicks)


def run_clicks(args: argparse.Namespace) -> int:
    import logging

    from monailabel_xflow.eval.click_benchmark import (
        METHODS,
        PROMPTS,
        ClickBenchmarkError,
        render_table,
        run_click_benchmark,
    )
    from monailabel_xflow.workflow.model_config import DEMO_MODELS_FILE, ModelConfig, ModelConfigError, check_device

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else list(METHODS)
    prompts = [p.strip() for p in args.prompts.split(",") if p.strip()] if args.prompts else list(PROMPTS)
    backend, device, refinement = "transformers", args.device, args.click_refinement or "none"
    try:
        if args.segmenter:
            weights: str | None = args.segmenter
        elif "fseg" in methods:
            cfg = ModelConfig.load(args.model or str(DEMO_MODELS_FILE))
            weights = str(cfg.resolve("segmenter"))
            backend, device = cfg.segmenter_backend, device or cfg.device
            refinement = args.click_refinement or cfg.click_refinement
        else:
            weights = None
        check_device(device)  # before the phantoms are drawn
        summary = run_click_benchmark(
            args.out,
            weights,
            split="test" if args.test else "dev",
            seed=args.seed,
            phantoms=args.phantoms,
            size=args.size,
            max_clicks=args.max_clicks,
            min_click_distance_px=args.min_click_distance,
            methods=methods,
            prompts=prompts,
            prune=not args.no_prune,
            backend=backend,
            device=device,
            click_refinement=refinement,
            progress=not args.no_progress,
            plots=not args.no_plots,
        )
    except (ClickBenchmarkError, ModelConfigError, OSError, ValueError) as err:
        print(f"xflow benchmark clicks: {err}", file=sys.stderr)
        return 2
    print(render_table(summary))
    print(f"summary in {args.out / 'clicks.md'}")
    return 0


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
