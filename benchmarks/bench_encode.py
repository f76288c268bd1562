"""A cheaper cold encode: F_seg's image encoder and the VLM's vision tower in float32, bfloat16
autocast and int8 dynamic quantisation (``torch.ao.quantization.quantize_dynamic`` on the linear
layers), timed in one run so the ratios compare like with like.

* **Demo weights** (``monailabel_xflow/demo/``): the demo XFlow answers "all findings" (Stage 1
  only) on the sample radiographs in float32; its lesion boxes are then segmented from each
  variant's embeddings and the masks compared with float32's (IoU; the option is kept only where
  every mask agrees at IoU >= 0.98).
* **Full-size architectures, random weights** (``--sam full``: the 458 M-parameter SAM3 tracker at
  1008 px; ``--vlm medgemma-4b``: MedGemma's SigLIP-so400m tower at 896 px): seconds per encode
  and the relative error of the output against float32 (a check of the kernels; random weights
  make masks meaningless, so boxes are decoded and their IoU reported as such).

Usage (keep it short on a shared machine; one run gives every ratio)::

    nice -n 10 .venv/bin/python benchmarks/bench_encode.py --threads 2
    .venv/bin/python benchmarks/bench_encode.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import parse_args

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VARIANTS = ("float32", "bfloat16", "int8")


def variants(device: str) -> tuple[str, ...]:
    """The variants ``device`` runs: dynamic int8 quantisation has CPU kernels only."""
    import torch

    return VARIANTS if torch.device(device).type == "cpu" else VARIANTS[:2]


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def variant_segmenter(base, variant: str):
    """A segmenter on ``base``'s model (or an int8 copy of it) encoding in ``variant``."""
    import torch

    from monailabel_xflow.segmenter.cache import EmbeddingCache
    from monailabel_xflow.segmenter.sam3 import Sam3Segmenter

    model = base.model
    precision = "bfloat16" if variant == "bfloat16" else "float32"
    if variant == "int8":
        model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
    return Sam3Segmenter(
        model, device=base.device, dtype=base.dtype, cache=EmbeddingCache(), encode_precision=precision, persist=False
    )


def timed_encode(seg, image) -> float:
    """Seconds of one cold encode of ``image``; on a GPU after a warm-up encode of other pixels
    (the first CUDA call pays for kernel selection, which no later radiograph does)."""
    import torch

    if seg.device.type == "cuda":
        seg.set_image(1.0 - image)
        torch.cuda.synchronize()
    start = time.perf_counter()
    seg.set_image(image)
    if seg.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def demo_agreement(images: list[Path], device: str) -> dict[str, tuple[float, float, int]]:
    """Per variant: (min IoU, mean IoU, masks compared) against float32 on the demo weights."""
    from monailabel_xflow.transforms import load_cxr
    from monailabel_xflow.workflow.model_config import DEMO_DIR, ModelConfig
    from monailabel_xflow.workflow.xflow import XFlow

    config = ModelConfig.from_file(DEMO_DIR / "models.yaml").with_overrides(device=device, encode_precision="float32")
    flow = XFlow.from_config(config)
    base = flow.segmenter
    segs = {v: variant_segmenter(base, v) for v in variants(device)}
    ious: dict[str, list[float]] = {v: [] for v in variants(device)[1:]}
    for path in images:
        image, _ = load_cxr(path)
        boxes = [les.box for r in flow.run_all(image, revise=False) for les in r.trace.lesions]
        boxes += [(0.1, 0.1, 0.5, 0.9), (0.5, 0.1, 0.9, 0.9)]  # both lungs, whatever Stage 1 said
        masks = {}
        for v, seg in segs.items():
            seg.set_image(image)
            masks[v] = seg.predict(boxes).masks
        for v in ious:
            ious[v] += [iou(a, b) for a, b in zip(masks["float32"], masks[v], strict=True) if a.any() or b.any()]
    return {v: (min(x) if x else 1.0, float(np.mean(x)) if x else 1.0, len(x)) for v, x in ious.items()}


def sam_full(size: str, device: str, image: np.ndarray) -> dict[str, tuple[float, float, float]]:
    """Per variant: (seconds per encode, relative error of the last level, mean box IoU)."""
    import torch

    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter

    with tempfile.TemporaryDirectory(prefix="bench-encode-") as tmp:
        base = load_segmenter(build_random_sam3(Path(tmp) / "sam3", size=size, seed=0), device=device)
    boxes = [(0.1, 0.1, 0.5, 0.9), (0.5, 0.1, 0.9, 0.9), (0.3, 0.3, 0.7, 0.7)]
    out: dict[str, tuple[float, float, float]] = {}
    ref_emb, ref_masks = None, None
    for v in variants(device):
        seg = variant_segmenter(base, v)
        seconds = timed_encode(seg, image)
        emb = seg._embeddings[-1].float()
        masks = seg.predict(boxes).masks
        if ref_emb is None:
            ref_emb, ref_masks = emb, masks
        err = float((emb - ref_emb).norm() / ref_emb.norm().clamp_min(1e-12))
        out[v] = (seconds, err, float(np.mean([iou(a, b) for a, b in zip(ref_masks, masks, strict=True)])))
        del seg
        if v == "int8":
            torch.cuda.empty_cache() if device.startswith("cuda") else None
    return out


def vision_tower(size: str, device: str) -> dict[str, tuple[float, float]]:
    """Per variant: (seconds per image, relative error of the output) of the VLM's SigLIP tower."""
    import torch
    from transformers import SiglipVisionModel

    from monailabel_xflow.policy.configs import gemma3_config

    torch.manual_seed(0)
    config = gemma3_config(size)
    tower = SiglipVisionModel(config.vision_config).eval().to(device)
    side = config.vision_config.image_size
    pixels = torch.rand(1, 3, side, side, device=device) * 2 - 1
    if torch.device(device).type == "cuda":
        with torch.no_grad():
            tower(pixel_values=pixels)  # warm-up: kernel selection is a first-call cost
    out: dict[str, tuple[float, float]] = {}
    ref = None
    for v in variants(device):
        model = tower
        if v == "int8":
            model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(tower), {torch.nn.Linear}, dtype=torch.qint8)
        ctx = (
            torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
            if v == "bfloat16"
            else torch.autocast(device_type=torch.device(device).type, enabled=False)
        )
        start = time.perf_counter()
        with torch.no_grad(), ctx:
            hidden = model(pixel_values=pixels).last_hidden_state.float()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        ref = hidden if ref is None else ref
        out[v] = (seconds, float((hidden - ref).norm() / ref.norm().clamp_min(1e-12)))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sam", choices=("tiny", "small", "full"), default="full", help="random SAM3 tracker size")
    parser.add_argument("--vlm", choices=("tiny", "mid", "medgemma-4b", "none"), default="medgemma-4b")
    parser.add_argument("--images", type=int, default=4, help="sample radiographs for the demo-weights check")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="cpu")
    args = parse_args(parser, sam="tiny", vlm="tiny", images=1)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import torch

    from monailabel_xflow.transforms import load_cxr
    from monailabel_xflow.weights import cpu_has_bf16

    if args.threads:
        torch.set_num_threads(args.threads)
    images = sorted((REPO / "sample-data").glob("phantom_*.png"))[: args.images]
    print(f"device {args.device}, {torch.get_num_threads()} threads, CPU bf16 units: {cpu_has_bf16()}")

    demo = demo_agreement(images, args.device)
    print(f"\ndemo weights, {len(images)} images: masks against float32")
    for v, (lo, mean, n) in demo.items():
        print(f"  {v:9s} min IoU {lo:.4f}  mean IoU {mean:.4f}  ({n} masks)")

    image, _ = load_cxr(images[0])
    sam = sam_full(args.sam, args.device, image)
    print(f"\nSAM3 tracker ({args.sam}, random weights): get_image_embeddings")
    for v, (s, err, box_iou) in sam.items():
        ratio = sam["float32"][0] / s
        print(f"  {v:9s} {s:8.2f} s  {ratio:5.2f}x  rel. error {err:.4f}  box-mask IoU {box_iou:.4f}")
    if args.vlm != "none":
        tower = vision_tower(args.vlm, args.device)
        print(f"\nVLM vision tower ({args.vlm}, random weights)")
        for v, (s, err) in tower.items():
            print(f"  {v:9s} {s:8.2f} s  {tower['float32'][0] / s:5.2f}x  rel. error {err:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
