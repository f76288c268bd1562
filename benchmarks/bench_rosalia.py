"""ROSALIA vs XFlow: per-question latency on the CPU, both demo models, measured in one run.

Loads the committed XFlow demo (``monailabel_xflow/demo/``) and the committed ROSALIA demo
(``monailabel_xflow/rosalia/demo/``; a random ROSALIA of the same ``demo`` size when it is not
installed: latency depends on shapes, not on weights), then on the same phantom radiographs asks
both the same questions and prints, per question:

* image encode (each model's ``set_image``: SAM3 tracker for XFlow, SAM + CLIP pixels for ROSALIA);
* ROSALIA: one greedy generation + one single-mask decoding (``RosaliaPredictor.predict``);
* XFlow Stage 1 only (``XFlow.run(..., revise=False)``) and Stage 1 + 2 (``XFlow.run``, up to the
  model configuration's click budget);

and the ratios XFlow / ROSALIA, all measured in this process, alternating the models question by
question so that machine load hits both alike. Medians over the questions.

What a GPU run would add: the same script with ``--device cuda`` times both on the GPU, where the
policies' token-by-token decoding (XFlow's Stage 1 text and up to four Stage 2 turns, each a
generate call) dominates even more than on the CPU, as the convolution/attention work of SAM-style
decoders shrinks to milliseconds; the ratio of generated tokens (XFlow's protocol text vs ROSALIA's
short answer) then sets the latency ratio. At the real sizes (LISA-7B vs MedGemma-4B + SAM3) the
per-token cost of the 7B Llama also weighs against ROSALIA.

Usage::

    .venv/bin/python benchmarks/bench_rosalia.py                    # 6 images x 4 questions
    .venv/bin/python benchmarks/bench_rosalia.py --images 2 --markdown
"""

from __future__ import annotations

import argparse
import logging
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import parse_args

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

QUESTIONS = (
    "Segment the effusion in the left lung.",
    "Segment the cardiomegaly.",
    "Segment the opacity in the right lung base.",
    "Segment the edema in the right lung.",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=6, help="phantom images of sample-data/ to use")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--markdown", action="store_true", help="print a README section on stdout")
    parser.add_argument(
        "--questions",
        type=int,
        default=len(QUESTIONS),
        choices=range(1, len(QUESTIONS) + 1),
        metavar=f"1..{len(QUESTIONS)}",
        help="questions per image (default all)",
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=None, help="XFlow policy tokens per call (default the demo's)"
    )
    parser.add_argument("--max-clicks", type=int, default=None, help="XFlow Stage 2 clicks (default the demo's)")
    args = parse_args(parser, images=1, questions=1, max_new_tokens=8, max_clicks=1)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from monailabel_xflow.rosalia.configs import build_random_rosalia
    from monailabel_xflow.rosalia.predictor import RosaliaPredictor
    from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_DIR
    from monailabel_xflow.transforms import load_cxr
    from monailabel_xflow.workflow.model_config import demo_config
    from monailabel_xflow.workflow.xflow import XFlow

    config = demo_config()
    if config is None:
        print("the XFlow demo (monailabel_xflow/demo/) is not installed", file=sys.stderr)
        return 2
    config = config.with_overrides(device=args.device, max_new_tokens=args.max_new_tokens, max_clicks=args.max_clicks)
    t = time.perf_counter()
    xflow = XFlow.from_config(config)
    load_xflow = time.perf_counter() - t
    tmp = None
    rosalia_dir = ROSALIA_DEMO_DIR
    rosalia_note = "committed ROSALIA demo"
    if not (ROSALIA_DEMO_DIR / "rosalia.json").is_file():
        tmp = tempfile.TemporaryDirectory(prefix="bench-rosalia-")
        rosalia_dir = build_random_rosalia(Path(tmp.name) / "rosalia", "demo")
        rosalia_note = "random ROSALIA of the demo size (demo not installed)"
    t = time.perf_counter()
    rosalia = RosaliaPredictor.from_pretrained(rosalia_dir, device=args.device)
    load_rosalia = time.perf_counter() - t
    n_rosalia = sum(p.numel() for p in rosalia.model.parameters())

    images = sorted((REPO / "sample-data").glob("phantom_*.png"))[: args.images]
    if not images:
        print("no phantom images in sample-data/", file=sys.stderr)
        return 2
    times: dict[str, list[float]] = {k: [] for k in ("rosalia_encode", "xflow_encode", "rosalia", "stage1", "stage12")}
    for path in images:
        image, _ = load_cxr(path)
        t = time.perf_counter()
        rosalia.set_image(image)
        times["rosalia_encode"].append(time.perf_counter() - t)
        t = time.perf_counter()
        xflow.segmenter.set_image(image)
        times["xflow_encode"].append(time.perf_counter() - t)
        for q in QUESTIONS[: args.questions]:
            t = time.perf_counter()
            rosalia.predict(q)
            times["rosalia"].append(time.perf_counter() - t)
            t = time.perf_counter()
            xflow.run(image, q, revise=False)
            times["stage1"].append(time.perf_counter() - t)
            t = time.perf_counter()
            xflow.run(image, q)
            times["stage12"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [
        ("load ROSALIA", load_rosalia, f"{rosalia_note}, {n_rosalia / 1e6:.1f} M params"),
        ("load XFlow", load_xflow, "committed XFlow demo (policy + 2 adapters + SAM3 tracker)"),
        ("encode image: ROSALIA (SAM + CLIP)", med["rosalia_encode"], f"median of {len(images)} images"),
        ("encode image: XFlow (SAM3 tracker)", med["xflow_encode"], ""),
        ("question: ROSALIA (1 generate + 1 decode)", med["rosalia"], f"median of {len(times['rosalia'])}"),
        ("question: XFlow Stage 1", med["stage1"], ""),
        ("question: XFlow Stage 1 + 2", med["stage12"], f"max {config.max_clicks} clicks"),
    ]
    ratios = [
        ("XFlow Stage 1 / ROSALIA", med["stage1"] / med["rosalia"]),
        ("XFlow Stage 1 + 2 / ROSALIA", med["stage12"] / med["rosalia"]),
    ]
    cpu = platform.processor() or platform.machine()
    machine = f"{cpu}, torch {torch.__version__}, {torch.get_num_threads()} threads, {args.device}"
    if args.markdown:
        print(f"### ROSALIA vs XFlow per question (demo sizes, {machine})\n")
        print("| phase | seconds | note |\n|---|---:|---|")
        for name, sec, note in rows:
            print(f"| {name} | {sec:.3f} | {note} |")
        print()
        for name, r in ratios:
            print(f"- {name}: **{r:.2f}x**")
    else:
        print(f"ROSALIA vs XFlow, {machine}")
        for name, sec, note in rows:
            print(f"  {name:<44} {sec:8.3f} s  {note}")
        for name, r in ratios:
            print(f"  {name:<44} {r:8.2f} x")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
