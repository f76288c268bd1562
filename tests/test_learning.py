"""Learning checks in the default suite: a trainer must improve a measure a broken trainer would not.

* F_seg: a random tiny SAM3 fine-tuned on a few ellipses raises box-prompted IoU on held-out ones.

Tiny models on CPU, cut to run in about a minute; the figures are printed (``-s``). The π_init SFT
check is still ``slow`` (tests/test_training_sft.py::test_init_sft_learns_to_place_boxes).
"""

from __future__ import annotations

import numpy as np


def _ellipse_sample(seed: int):
    """A 128x160 image holding one bright ellipse (size and place drawn from ``seed``) and its mask."""
    from monailabel_xflow.training.segmenter import SegSample

    r = np.random.default_rng(seed)
    cy, cx, ry, rx = r.uniform(35, 90), r.uniform(40, 120), r.uniform(12, 25), r.uniform(15, 35)
    yy, xx = np.mgrid[:128, :160]
    mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1
    image = np.full(mask.shape, 0.3, np.float32)
    image[mask] = 0.8
    return SegSample(image, mask)


def test_segmenter_finetuning_raises_held_out_box_prompted_iou(tmp_path):
    """30 steps on 12 ellipses take a random tiny SAM3 from chance to near-perfect box-prompted
    IoU on 6 other ellipses (measured: 0.10 -> 0.97; 20 steps are not yet enough)."""
    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.training.config import SegmenterTrainConfig
    from monailabel_xflow.training.segmenter import box_prompted_iou, finetune_segmenter

    train, held_out = [_ellipse_sample(i) for i in range(12)], [_ellipse_sample(100 + i) for i in range(6)]
    base = build_random_sam3(tmp_path / "base", "tiny")
    before = box_prompted_iou(load_segmenter(str(base)), held_out)
    cfg = SegmenterTrainConfig(effective_batch=1, max_steps=30, learning_rate=2e-3, seed=0)
    result = finetune_segmenter(base, train, tmp_path / "ft", cfg, progress=False)
    after = box_prompted_iou(load_segmenter(str(tmp_path / "ft")), held_out)
    losses = result["losses"]
    print(f"\nF_seg held-out box-prompted IoU {before:.3f} -> {after:.3f} after {result['steps']} steps; "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert after > before + 0.3 and after > 0.6, (before, after)

