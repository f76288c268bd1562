"""Latency breakdown of the XFlow workflow on one radiograph (random weights; CPU by default).

Builds a random Gemma3 policy model (``--vlm mid``: several hundred million parameters, with
the two LoRA adapters "init"/"rev") and a random SAM3 tracker (``--sam full``: the real 458 M
shape; ``--sam small``/``tiny`` for a quick run), saves both like real checkpoints, then
measures what a user waits for:

* load: the policy (base + 2 adapters) and the segmenter from disk;
* segmenter encode (``set_image``, once per image) and a second ``set_image`` (cache hit);
* Stage 1: prefill (``generate`` of 1 token) and decode (per token, from a full call of
  ``--max-new-tokens`` tokens); "all findings" (``stage1_many``, 7 instructions) per instruction,
  and end to end (``XFlow.run_all`` against ``XFlow.run`` of one finding, each on an image the
  segmenter has not encoded yet);
* segmenter decode: 1 box, 2 boxes batched;
* Stage 2: each of ``--turns`` π_rev turns (one growing conversation with KV-cache reuse) and
  the decoder call that follows it (box, all clicks so far, previous logits);
* end to end: ``XFlow.run`` with Stage 1 forced to "present, 1 box" (a random π_init says
  nothing parseable, so Stage 2 would never run) and the trace's own phase timings.

Timings do not depend on the weights, only on the shapes. Random policies emit text that is
not protocol, so the Stage 2 turns are driven directly (each turn generates
``--max-new-tokens`` tokens, a realistic length for ``<think>…</think><click>…</click>``).

Usage::

    .venv/bin/python benchmarks/bench_workflow.py                       # mid VLM + full SAM3
    .venv/bin/python benchmarks/bench_workflow.py --sam small           # quick run
    .venv/bin/python benchmarks/bench_workflow.py --vlm medgemma-4b --dtype bfloat16 --device cuda
    .venv/bin/python benchmarks/bench_workflow.py --markdown >> benchmarks/README.md
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import parse_args, synchronize

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SAMPLE = REPO / "tests" / "data" / "cxr" / "nih" / "images" / "00000129_000.png"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, str]] = []

    def add(self, phase: str, seconds: float, note: str = "") -> None:
        self.rows.append((phase, seconds, note))
        logging.info("%-40s %9.3f s  %s", phase, seconds, note)

    def text(self) -> str:
        width = max(len(r[0]) for r in self.rows)
        lines = [f"{'phase':{width}s}  {'seconds':>9s}  note", "-" * (width + 30)]
        lines += [f"{p:{width}s}  {s:9.3f}  {n}" for p, s, n in self.rows]
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = ["| phase | seconds | note |", "|---|---:|---|"]
        lines += [f"| {p} | {s:.3f} | {n} |" for p, s, n in self.rows]
        return "\n".join(lines)


def timed(fn, *args, **kwargs):
    """``(result, wall seconds)``; on a GPU, once its queued kernels have finished."""
    tick = time.perf_counter()
    out = fn(*args, **kwargs)
    synchronize()
    return out, time.perf_counter() - tick


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sam", choices=("tiny", "small", "full"), default="full", help="SAM3 tracker size")
    parser.add_argument(
        "--vlm",
        choices=("tiny", "mid", "medgemma-4b"),
        default="mid",
        help="Gemma3 policy size (medgemma-4b: the real 4.3 B architecture; use --dtype bfloat16)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "bfloat16", "float16"),
        help="policy weights dtype, built and loaded (default float32)",
    )
    parser.add_argument("--image", type=Path, default=SAMPLE, help="radiograph (PNG/JPEG/DICOM)")
    parser.add_argument("--max-new-tokens", type=int, default=16, help="tokens per policy call")
    parser.add_argument("--turns", type=int, default=4, help="Stage 2 turns (T)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--workdir", type=Path, default=None, help="where to save the models (default: a temp dir)")
    parser.add_argument("--markdown", action="store_true", help="print a README section (markdown) on stdout")
    args = parse_args(parser, sam="tiny", vlm="tiny", max_new_tokens=2, turns=1)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    for noisy in ("monailabel_xflow", "transformers", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from monailabel_xflow.geometry import Click, grow_box
    from monailabel_xflow.instructions import all_findings, parse_instruction
    from monailabel_xflow.policy.base import RevisionState
    from monailabel_xflow.policy.configs import build_random_vlm
    from monailabel_xflow.policy.protocol import BoxRef, Stage1Output, format_stage1
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy
    from monailabel_xflow.rendering import render_observation
    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.testing import ScriptedPolicy
    from monailabel_xflow.transforms import load_cxr
    from monailabel_xflow.workflow.xflow import XFlow

    table = Table()
    tmp = tempfile.TemporaryDirectory(prefix="bench-workflow-") if args.workdir is None else None
    root = Path(tmp.name) if tmp else args.workdir
    root.mkdir(parents=True, exist_ok=True)

    logging.info("building random models in %s (not timed as user latency)", root)
    vlm_dirs, t_build_vlm = timed(build_random_vlm, root / "vlm", size=args.vlm, seed=0, dtype=args.dtype)
    sam_dir, t_build_sam = timed(build_random_sam3, root / "sam3", size=args.sam, seed=0)

    generation = GenerationSettings(max_new_tokens=args.max_new_tokens)
    policy, t = timed(
        VLMPolicy.from_pretrained,
        str(vlm_dirs.base),
        init_adapter=str(vlm_dirs.init),
        rev_adapter=str(vlm_dirs.rev),
        device=args.device,
        dtype=args.dtype,
        generation=generation,
    )
    n_vlm = sum(p.numel() for p in policy.model.parameters())
    table.add("load policy (base + 2 adapters)", t, f"Gemma3 {args.vlm}, {n_vlm / 1e6:.1f} M params")
    segmenter, t = timed(load_segmenter, str(sam_dir), device=args.device)
    n_sam = sum(p.numel() for p in segmenter.model.parameters())
    table.add("load segmenter", t, f"SAM3 tracker {args.sam}, {n_sam / 1e6:.1f} M params")
    (image, meta), t = timed(load_cxr, args.image)
    table.add("load image", t, f"{args.image.name} {image.shape[0]}x{image.shape[1]}")

    instr = parse_instruction("Segment the effusion in the left lung.")
    fast = VLMPolicy(policy.model, policy.processor, GenerationSettings(max_new_tokens=1))
    if torch.device(args.device).type == "cuda":
        # A GPU's first calls of each shape pay for kernel selection and allocator growth, which
        # no later request does: spend them on other pixels (no cache holds these), once for every
        # kind of call timed below.
        other, warm_box = np.clip(image - 1e-3, 0, 1), (0.5, 0.5, 0.8, 0.8)

        def warm_up() -> None:
            segmenter.set_image(other)
            first = segmenter.predict([warm_box])
            segmenter.predict([warm_box], clicks=[[Click(True, 0.6, 0.6)]], previous=first.low_res_logits)
            fast.stage1(other, instr)
            policy.stage1(other, instr)
            mask = first.masks[0]
            view = render_observation(other, mask, [])
            policy.start(other, instr, warm_box).step(RevisionState(other, instr, warm_box, mask, [], view, 0))

        _, t = timed(warm_up)
        table.add("GPU warm-up (each call kind once)", t, "first CUDA calls; not a user cost")
    _, t = timed(segmenter.set_image, image)
    table.add("segmenter encode (set_image)", t, "once per image")
    _, t = timed(segmenter.set_image, image)
    table.add("segmenter set_image again", t, "embedding cache hit")

    _, t_prefill = timed(fast.stage1, image, instr)
    table.add("Stage 1 prefill (+1 token)", t_prefill, "image + prompt")
    _, t_full = timed(policy.stage1, image, instr)
    # A random model rarely emits an end-of-turn token, so it generates the full budget.
    n_tokens = args.max_new_tokens
    per_token = max(0.0, t_full - t_prefill) / max(1, n_tokens - 1)
    table.add("Stage 1 full call", t_full, f"up to {n_tokens} new tokens")
    table.add("Stage 1 decode per token", per_token, "(full - prefill) / (tokens - 1)")
    findings = all_findings()
    _, t = timed(policy.stage1_many, image, findings)
    table.add(
        "Stage 1 all findings, per instruction", t / len(findings), f"stage1_many over {len(findings)}: {t:.2f} s"
    )

    box = (0.55, 0.55, 0.85, 0.8)
    seg1, t = timed(segmenter.predict, [box])
    table.add("segmenter decode, 1 box", t)
    _, t = timed(segmenter.predict, [box, (0.6, 0.25, 0.75, 0.4)])
    table.add("segmenter decode, 2 boxes batched", t)

    # Stage 2: one growing conversation, each turn followed by the decoder call it triggers.
    session = policy.start(image, instr, box)
    mask, previous, clicks, current = seg1.masks[0], seg1.low_res_logits[0:1], [], box
    rng = np.random.default_rng(0)
    for turn in range(args.turns):
        state = RevisionState(
            image=image,
            instruction=instr,
            box=current,
            mask=mask,
            clicks=list(clicks),
            observation=render_observation(image, mask, clicks),
            step=turn,
        )
        _, t = timed(session.step, state)
        table.add(f"Stage 2 turn {turn + 1} (policy)", t, "KV cache reused" if policy.reuse_cache else "")
        click = Click(bool(turn % 2 == 0), float(rng.uniform(0.5, 0.9)), float(rng.uniform(0.5, 0.9)))
        clicks.append(click)
        current = grow_box(current, click)
        res, t = timed(segmenter.predict, [current], clicks=[list(clicks)], previous=previous)
        mask, previous = res.masks[0], res.low_res_logits[0:1]
        table.add(f"Stage 2 turn {turn + 1} (decoder, {len(clicks)} clicks)", t)

    # End to end through the workflow (encode is a cache hit here: the embedding is cached).
    stage1 = ScriptedPolicy(
        [format_stage1(Stage1Output([BoxRef("left lung", (0.5, 0.15, 0.9, 0.85))], True, [BoxRef("effusion", box)]))]
    )
    flow = XFlow(stage1, policy, segmenter, max_clicks=args.turns)
    result, t = timed(flow.run, image, instr)
    ends = [lesion.end for lesion in result.trace.lesions]
    table.add("XFlow.run, forced 1 box (end to end)", t, f"Stage 2 ended: {ends}")
    for key, value in result.trace.timings.items():
        table.add(f"  trace timing: {key}", value)

    # "All findings" against one finding, end to end on images the segmenter has not seen
    # (each run pays its own encode; run_all shares it, and the VLM prefix, over 7 findings).
    flow = XFlow(policy, policy, segmenter, max_clicks=args.turns)
    _, t_one = timed(flow.run, np.clip(image + 1e-3, 0, 1), instr)
    table.add("XFlow.run, one finding (end to end, new image)", t_one)
    _, t_all = timed(flow.run_all, np.clip(image + 2e-3, 0, 1))
    table.add(
        "XFlow.run_all, 7 findings (end to end, new image)", t_all, f"{t_all / t_one:.2f}x one finding (target <= 3x)"
    )

    header = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, device {args.device}, load average {os.getloadavg()[0]:.1f}; "
        f"peak RSS {peak_rss_mb():.0f} MB; "
        + (
            f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB; "
            if torch.cuda.is_available()
            else ""
        )
        + f"model build (not user latency): VLM {t_build_vlm:.1f} s, SAM3 {t_build_sam:.1f} s"
    )
    print(header)
    print(table.text())
    if args.markdown:
        print()
        print(f"## Workflow latency (`bench_workflow.py --sam {args.sam} --vlm {args.vlm}`)\n")
        print(
            f"{header}. Random weights (timings depend on shapes only); {args.max_new_tokens} new tokens "
            f"per policy call.\n"
        )
        print(table.markdown())
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
