"""CPU cost of the VLM policies: Stage 2 KV-cache reuse and Stage 1 "all findings" prefill.

Run: ``.venv/bin/python benchmarks/bench_policy.py [--threads 2] [--new-tokens 16]
[--model-dir DIR] [--size mid|medgemma-4b] [--dtype float32|bfloat16]``.

Model: the mid-size random ``Gemma3ForConditionalGeneration`` of
:func:`monailabel_xflow.policy.configs.build_random_vlm` (~200 M parameters, 256 tokens per
image as MedGemma, LoRA adapters "init" and "rev" of rank 16; ``--size medgemma-4b`` for the
full-size shapes), saved to a folder (a temporary one unless ``--model-dir`` is given; an
existing folder is reused) and loaded through :meth:`VLMPolicy.from_pretrained`, the path
users take.

Figures printed:

* **Stage 2**: the time of each of 4 turns of one revision conversation (one new observation a
  turn) with cache reuse and with re-reading the whole conversation; targets: with reuse, turn 4
  within 1.5x of turn 1, and 4 turns >= 2x faster than re-reading.
* **Stage 1**: ``stage1_many`` on the 7 "all findings" instructions against ``stage1`` on one
  (target <= 3x), batched (the default, one batched ``generate``) and exact
  (``batch_stage1=False``, one ``generate`` per instruction from the shared prefix), and against
  asking the 7 one by one.

Every call generates exactly ``--new-tokens`` tokens (``min_new_tokens`` is set on the model's
generation config for the benchmark only), so the figures do not depend on when a random model
happens to emit an end-of-turn token. The machine's load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from common import parse_args


def _load_avg() -> str:
    return " / ".join(f"{v:.2f}" for v in os.getloadavg())


def _states(image, instruction, n):
    from monailabel_xflow.geometry import Click, box_to_mask
    from monailabel_xflow.policy.base import RevisionState
    from monailabel_xflow.rendering import render_observation

    out, clicks = [], []
    for t in range(n):
        box = (0.5 - 0.04 * t, 0.45, 0.85, 0.85)
        mask = box_to_mask(box, image.shape)
        out.append(
            RevisionState(image, instruction, box, mask, list(clicks), render_observation(image, mask, clicks), t)
        )
        clicks.append(Click(t % 2 == 0, 0.45 + 0.03 * t, 0.6))
    return out


def _stage2(policy, image, instruction, reuse: bool, turns: int):
    policy.reuse_cache = reuse
    session = policy.start(image, instruction, (0.5, 0.45, 0.85, 0.85))
    times, cpu = [], []
    for s in _states(image, instruction, turns):
        t0, c0 = time.perf_counter(), time.process_time()
        session.step(s)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return times, cpu, session


def _timed(fn, *args):
    """``(result, wall seconds, process CPU seconds)`` of one call."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args)
    return out, time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--model-dir", type=Path, default=None)
    ap.add_argument(
        "--size",
        default="mid",
        choices=("tiny", "mid", "medgemma-4b"),
        help="random Gemma3 size to build (ignored when --model-dir holds a model)",
    )
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parse_args(ap, size="tiny", new_tokens=2, turns=2, threads=1)

    import torch

    from monailabel_xflow.instructions import Instruction, all_findings
    from monailabel_xflow.policy.configs import build_random_vlm
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy

    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}, load average before: {_load_avg()}")
    tmp = None
    root = args.model_dir
    if root is None:
        tmp = tempfile.TemporaryDirectory()
        root = Path(tmp.name)
    t0 = time.perf_counter()
    if (root / "base" / "config.json").is_file():
        vlm = (root / "base", root / "init", root / "rev")
    else:
        vlm = build_random_vlm(root, args.size, seed=0, adapters=True, dtype=args.dtype)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    policy = VLMPolicy.from_pretrained(
        *vlm, device="cpu", dtype=args.dtype, generation=GenerationSettings(max_new_tokens=args.new_tokens)
    )
    load_s = time.perf_counter() - t0
    policy.model.get_base_model().generation_config.min_new_tokens = args.new_tokens
    n_params = sum(p.numel() for p in policy.model.parameters())
    print(
        f"model: {n_params / 1e6:.0f} M parameters (with LoRA), build {build_s:.1f} s, load {load_s:.1f} s; "
        f"{args.new_tokens} new tokens per call"
    )

    rng = np.random.default_rng(0)
    image = rng.random((512, 448)).astype(np.float32)
    left = Instruction("effusion", ("left lung",))
    policy.stage1(image, left)  # warm-up

    print("\nStage 2: one conversation, seconds per turn, wall (CPU time of the process)")
    res = {}
    for reuse in (True, False):
        times, cpu, session = _stage2(policy, image, left, reuse, args.turns)
        res[reuse] = (times, cpu, session)
        label = "reuse cache" if reuse else "re-read    "
        print(
            f"  {label}: "
            + "  ".join(f"{t:6.2f} ({c:5.2f})" for t, c in zip(times, cpu, strict=False))
            + f"   total {sum(times):6.2f} ({sum(cpu):6.2f})"
            + f"   turn {args.turns}/turn 1 = {times[-1] / times[0]:.2f}x ({cpu[-1] / cpu[0]:.2f}x)"
            + f"   ({session.input_ids.shape[1]} tokens at the end)"
        )
    same = res[True][2].texts == res[False][2].texts
    for i, what in ((0, "wall"), (1, "CPU")):
        reuse_t, reread_t = res[True][i], res[False][i]
        print(
            f"  {what:4s}: reuse is {sum(reread_t) / sum(reuse_t):.2f}x faster over {args.turns} turns "
            f"(target >= 2x); turn {args.turns} = {reuse_t[-1] / reuse_t[0]:.2f}x turn 1 "
            f"(target <= 1.5x); re-read turn {args.turns} / reuse turn {args.turns} = "
            f"{reread_t[-1] / reuse_t[-1]:.2f}x"
        )
    print(f"  same text both ways: {same}")

    print("\nStage 1: seconds, wall (CPU time of the process)")
    findings = all_findings()
    (_, one, one_c) = _timed(policy.stage1, image, left)
    policy.batch_stage1 = False
    (many, many_s, many_c) = _timed(policy.stage1_many, image, findings)
    policy.batch_stage1 = True  # the default
    (batched, batched_s, batched_c) = _timed(policy.stage1_many, image, findings)
    (singles, singles_s, singles_c) = _timed(lambda: [policy.stage1(image, f) for f in findings])
    print(f"  one finding              {one:6.2f} ({one_c:6.2f})")
    print(
        f"  all findings (7), exact  {many_s:6.2f} ({many_c:6.2f})   = {many_s / one:.2f}x "
        f"({many_c / one_c:.2f}x) one finding (target <= 3x)"
    )
    print(
        f"  all findings (7), batched {batched_s:5.2f} ({batched_c:6.2f})   = {batched_s / one:.2f}x "
        f"({batched_c / one_c:.2f}x) one finding (target <= 3x)"
    )
    print(
        f"  all findings one by one  {singles_s:6.2f} ({singles_c:6.2f})   = {singles_s / many_s:.2f}x "
        f"({singles_c / many_c:.2f}x) stage1_many; same text: {many == singles}, "
        f"batched same text: {batched == singles}"
    )
    print(f"\nload average after: {_load_avg()}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
