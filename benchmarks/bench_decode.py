"""Where a policy token goes: the per-token decode cost of π_init, LoRA served three ways.

``bench_workflow.py`` on a GPU measured MedGemma-4B's shapes decoding at ~0.15 s per token, which
is far above what the card's arithmetic needs: the host, not the GPU, sets the pace. This script
separates the suspects on one model built in memory on the device (random weights, the LoRA
adapters "init" and "rev" of :func:`monailabel_xflow.policy.configs.build_random_vlm`):

* **served**: the peft model with both adapters unmerged, the structure
  :meth:`VLMPolicy.from_pretrained` serves (every language-model linear layer runs base + LoRA A
  + LoRA B);
* **merged**: "init" merged into the base weights (``merge_adapter``; peft's wrappers stay);
* **plain**: ``merge_and_unload``, a bare ``Gemma3ForConditionalGeneration`` with "init" in it.
* **loaded** (``--checkpoint``): the same shapes saved by ``build_random_vlm`` and loaded through
  :meth:`VLMPolicy.from_pretrained`, the path a server takes (``bench_workflow.py`` measured a
  per-token cost twice the in-memory one on a GPU; this row tells the loading path apart).

For each: Stage 1 on one radiograph with 1 and with ``--new-tokens`` forced new tokens (median
of ``--repeat``), per-token = (long - short) / (tokens - 1), wall and process CPU seconds. CPU
seconds near wall seconds on a GPU mean the device waits for Python and kernel launches.

Run::

    .venv/bin/python benchmarks/bench_decode.py --size medgemma-4b --dtype bfloat16 --device cuda
    .venv/bin/python benchmarks/bench_decode.py --size mid --threads 2          # CPU
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
from common import parse_args, synchronize


def timed(fn, repeat: int) -> tuple[float, float]:
    """Median wall and process-CPU seconds of ``repeat`` calls (after queued GPU work ends)."""
    walls, cpus = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        synchronize()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def decode_whole_budget(model, new_tokens: int) -> None:
    """Make ``model`` (a peft model) decode exactly ``new_tokens``: a random model's EOS would end
    calls early and unevenly, so every long call does equal work."""
    generation = model.get_base_model().generation_config
    generation.eos_token_id, generation.min_new_tokens = None, new_tokens


def build_policy(size: str, device: str, dtype: str, new_tokens: int):
    """A random Gemma3 policy with adapters "init" and "rev", built in memory on ``device``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Gemma3ForConditionalGeneration

    from monailabel_xflow.policy.configs import LORA_TARGET_MODULES, SIZES, build_processor, gemma3_config
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy

    processor = build_processor(size)
    config = gemma3_config(size, processor.tokenizer)
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = Gemma3ForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(default)
    r = SIZES[size]["lora_r"]
    lora = LoraConfig(r=r, lora_alpha=2 * r, target_modules=LORA_TARGET_MODULES, init_lora_weights=False)
    model = get_peft_model(model, lora, adapter_name="init")
    model.add_adapter("rev", lora)
    model.set_adapter("init")
    model.eval()
    decode_whole_budget(model, new_tokens)
    return VLMPolicy(model, processor, GenerationSettings(max_new_tokens=new_tokens))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("tiny", "mid", "medgemma-4b"), default="mid")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--profile", action="store_true", help="also print the served call's top operators")
    parser.add_argument(
        "--checkpoint", action="store_true", help="also time the model saved and loaded as users load it"
    )
    args = parse_args(parser, size="tiny", new_tokens=3, repeat=1)
    # min_new_tokens (equal work per long call) exceeds the short call's budget of 1: expected.
    warnings.filterwarnings("ignore", message="Unfeasible length constraints")
    import torch

    from monailabel_xflow.instructions import parse_instruction
    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    policy = build_policy(args.size, args.device, args.dtype, args.new_tokens)
    print(
        f"Gemma3 {args.size} ({sum(p.numel() for p in policy.model.parameters()) / 1e6:.0f} M parameters with LoRA), "
        f"{args.dtype}, {args.device}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"built in {time.perf_counter() - t0:.1f} s; {args.new_tokens} tokens per long call, median of {args.repeat}"
    )
    image = np.random.default_rng(0).random((512, 448)).astype(np.float32)
    instruction = parse_instruction("Segment the effusion in the left lung.")

    def measure(label: str, pol: VLMPolicy) -> None:
        short = VLMPolicy(pol.model, pol.processor, GenerationSettings(max_new_tokens=1))
        pol.stage1(image, instruction)  # warm-up: first-call kernel selection and allocations
        (w1, c1), (wn, cn) = (
            timed(lambda: short.stage1(image, instruction), args.repeat),
            timed(lambda: pol.stage1(image, instruction), args.repeat),
        )
        n = max(1, args.new_tokens - 1)
        print(
            f"  {label:8s} prefill+1 {w1:7.3f} s   {args.new_tokens} tokens {wn:7.3f} s   "
            f"per token {1000 * (wn - w1) / n:8.1f} ms wall, {1000 * (cn - c1) / n:8.1f} ms CPU"
        )

    print("\nStage 1, π_init:")
    measure("served", policy)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=activities) as prof:
            policy.stage1(image, instruction)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))
    policy.model.merge_adapter()
    measure("merged", policy)
    policy.model.unmerge_adapter()
    plain = policy.model.merge_and_unload()
    measure("plain", VLMPolicy(plain, policy.processor, policy.generation))
    if args.checkpoint:
        import tempfile

        from monailabel_xflow.policy.configs import build_random_vlm

        del plain, policy
        with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
            folders = build_random_vlm(tmp, args.size, seed=0, dtype=args.dtype)
            loaded = VLMPolicy.from_pretrained(
                *folders,
                device=args.device,
                dtype=args.dtype,
                generation=GenerationSettings(max_new_tokens=args.new_tokens),
            )
            decode_whole_budget(loaded.model, args.new_tokens)
            measure("loaded", loaded)
    if torch.cuda.is_available():
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
