"""F_seg trained from random weights with SAM's interactive recipe and the click loss (dev experiment).

The section "A wider F_seg, trained from scratch" of README.md: a ``sam3_configs`` model of SIZE
("small": 128-wide, 4-layer ViT and 64-wide decoder, 1.35 M parameters; "tiny": the demo's
0.15 M) at the demo's 336-px input, trained from random weights on every lesion component of
the seed-0 phantoms 0..N-1 (256 px) with every click round supervised from the first step
(``interactive_rounds`` ROUNDS, half box and half click starts, clicks half the oracle's, mask
input dropped half the time) and the click loss (weight 1). A checkpoint every 500 steps, for
``xflow benchmark clicks --segmenter OUT/checkpoint-K``. The samples are cached in CACHE.npz.

    python reports/click-efficiency/from_scratch.py OUT SIZE STEPS N LR [ROUNDS] [CACHE] [SEED] [JITTER]

SEED (default 0) draws the random initialisation and, plus 7, the training order and clicks.
JITTER (default 0.1, the trainer's) moves each box edge by up to that fraction of the box's size,
in the plain and the interactive prompts alike.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from monailabel_xflow.eval.click_benchmark import phantom_components
from monailabel_xflow.segmenter.configs import build_random_sam3
from monailabel_xflow.training.config import SegmenterTrainConfig
from monailabel_xflow.training.segmenter import SegSample, finetune_segmenter

out, size, steps, phantoms, lr = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
rounds = int(sys.argv[6]) if len(sys.argv) > 6 else 6
cache = Path(sys.argv[7]) if len(sys.argv) > 7 else out.parent / f"samples-{phantoms}.npz"
seed = int(sys.argv[8]) if len(sys.argv) > 8 else 0
jitter = float(sys.argv[9]) if len(sys.argv) > 9 else 0.1
torch.set_num_threads(1)

if not cache.exists():
    images, owner, masks = [], [], []
    for i in range(phantoms):
        image, components = phantom_components(0, i, 256)
        owner += [len(images)] * len(components)
        masks += [c.mask for c in components]
        images.append(image.astype(np.float32))
    np.savez_compressed(cache, img=np.stack(images), idx=np.array(owner), masks=np.stack(masks))
stored = np.load(cache)
images, owner, masks = stored["img"], stored["idx"], stored["masks"]  # each stored[...] decompresses anew
samples = [SegSample(images[i], m) for i, m in zip(owner, masks, strict=True)]
print(len(samples), "lesion components", flush=True)

start = build_random_sam3(out.parent / f"{out.name}-random", size, seed, 336)
cfg = SegmenterTrainConfig(
    max_steps=steps, effective_batch=4, learning_rate=lr, focal_weight=1.0, encoder_lr_scale=1.0,
    layer_decay=1.0, grad_clip=1.0, seed=7 + seed, interactive_rounds=rounds, interactive_click_start=0.5,
    interactive_mask_dropout=0.5, interactive_oracle_prob=0.5, interactive_click_weight=1.0,
    box_jitter=jitter, interactive_box_jitter=jitter,
    checkpoint_every=500,
)  # fmt: skip
began = time.time()


def report(step: int, total: int, loss: float) -> None:
    if step % 25 == 0:
        print(f"step {step}/{total} loss {loss:.4f} {time.time() - began:.0f}s", flush=True)


result = finetune_segmenter(start, samples, out, cfg, progress=False, on_step=report)
losses = result["losses"]
print(json.dumps({"steps": result["steps"], "loss_first100": float(np.mean(losses[:100])),
                  "loss_last100": float(np.mean(losses[-100:])), "seconds": time.time() - began}))  # fmt: skip
