"""The ``xflow`` train task: fine-tune F_seg on the saved final labels (small and real).

MONAI Label's "train" request runs :class:`XFlowSegmenterTrainTask` (in a subprocess the server
starts). It calls :func:`finetune_from_labels`, which

1. reads every (image, final label) pair of the datastore (``datastore.datalist()``);
2. splits each finding's label into connected components; each component is one training
   sample (specks under 0.1 % of the image are left out, at most 8 per image, the largest);
   all-zero ("no finding") labels give none and are skipped (they teach the policies, not F_seg);
3. runs the package's F_seg trainer
   (:func:`monailabel_xflow.training.segmenter.finetune_segmenter`: jittered box + click
   prompts, 20·focal + dice + IoU loss, AdamW, the paper's recipe) for ``steps`` optimiser steps;
4. saves the model in ``<model_dir>/xflow_segmenter/`` (``save_pretrained``, loadable by
   :func:`monailabel_xflow.segmenter.load_segmenter`) and ``train_stats.json`` beside it.

The serving app picks the new weights up at the next request (see
:meth:`~monailabel_xflow.label.runtime.XFlowRuntime.get`). The policies' trainers come from
:mod:`monailabel_xflow.training`; this task trains F_seg only.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from monailabel_xflow.label import layout
from monailabel_xflow.label.errors import RequestError
from monailabel_xflow.label.runtime import XFlowRuntime

logger = logging.getLogger(__name__)

TRAINED_SEGMENTER_DIR = "xflow_segmenter"
STATS_FILE = "train_stats.json"


MIN_COMPONENT_SHARE = 0.001
"""Components smaller than this share of the image are specks (DESIGN §8), not lesions to prompt."""

MAX_PROMPTS_PER_IMAGE = 8
"""The largest components of an image that become prompts (bounds the decoder batch)."""


def component_prompts(label_hw: np.ndarray, min_share: float = MIN_COMPONENT_SHARE,
                      max_prompts: int = MAX_PROMPTS_PER_IMAGE) -> list[tuple[tuple[float, float, float, float], np.ndarray]]:
    """``[(box, mask)]``: one box prompt per connected component (8-connectivity, as everywhere
    else) of each finding in a label map, specks (< ``min_share`` of the image) left out, at most
    ``max_prompts``, largest first."""
    from monailabel_xflow.geometry import mask_to_box
    from monailabel_xflow.oracle import connected_components

    min_px = max(1, int(np.ceil(min_share * label_hw.size)))
    found = [m for value in (int(v) for v in np.unique(label_hw) if v)
             for m in connected_components(label_hw == value, min_area_px=min_px)]
    found.sort(key=lambda m: -int(m.sum()))
    return [(mask_to_box(m), m) for m in found[:max_prompts]]


def finetune_from_labels(
    pairs: Sequence[Mapping[str, str]],
    segmenter: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    steps: int = 10,
    lr: float = 1e-4,
    batch: int = 1,
    seed: int = 0,
) -> dict[str, Any]:
    """Fine-tune F_seg on a datastore's final labels with the package's F_seg trainer.

    Args:
        pairs: ``[{"image": path, "label": path}]`` (``datastore.datalist()``); labels are label
            maps of the image's size (values 0..7).
        segmenter: the weights to start from (folder, hub id or ``.pt``; see ``load_tracker_model``).
        output_dir: where the fine-tuned model is saved (``save_pretrained``), replaced in one
            rename so a serving app never reads half a checkpoint.
        steps: optimiser steps; ``batch``: prompts per step (gradient accumulation).
        lr: AdamW learning rate of the decoder (the encoder gets the trainer's 0.6x).
        seed: prompt sampling and initialisation seed.

    Returns:
        Stats: ``images``, ``prompts``, ``steps``, ``losses``, ``loss_first``, ``loss_last``,
        ``seconds``, ``output``, ``start_weights``.

    Raises:
        RequestError: no labeled image holds a finding to train on.
    """
    import shutil

    from monailabel_xflow.training.config import SegmenterTrainConfig
    from monailabel_xflow.training.segmenter import SegSample, finetune_segmenter
    from monailabel_xflow.transforms.loading import load_cxr

    t0 = time.perf_counter()
    samples, images = [], 0
    for pair in pairs:
        image, _ = load_cxr(pair["image"])
        prompts = component_prompts(layout.read_label(pair["label"], image.shape))
        samples.extend(SegSample(image, mask) for _, mask in prompts)
        images += bool(prompts)
    if not samples:
        raise RequestError("nothing to train on: no final label holds a finding (save labels first)")
    cfg = SegmenterTrainConfig(learning_rate=float(lr), max_steps=int(steps), effective_batch=int(batch), seed=int(seed))
    output_dir = Path(output_dir)
    tmp = output_dir.with_name(output_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    result = finetune_segmenter(str(segmenter), samples, tmp, cfg, progress=False)
    old = output_dir.with_name(output_dir.name + ".old")
    if output_dir.exists():
        output_dir.rename(old)
    tmp.rename(output_dir)
    shutil.rmtree(old, ignore_errors=True)
    losses = [float(v) for v in result["losses"]]
    stats = {"images": images, "prompts": len(samples), "steps": int(result["steps"]), "losses": losses,
             "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
             "seconds": round(time.perf_counter() - t0, 3), "output": str(output_dir), "start_weights": str(segmenter)}
    (output_dir.parent / STATS_FILE).write_text(json.dumps(stats, indent=1))
    logger.info("fine-tuned F_seg on %d prompts from %d images: loss %.4f -> %.4f (%s)", len(samples), images,
                stats["loss_first"], stats["loss_last"], output_dir)
    return stats


def _base_train_task():
    from monailabel.interfaces.tasks.train import TrainTask

    return TrainTask


class XFlowSegmenterTrainTask(_base_train_task()):
    """MONAI Label train task running :func:`finetune_segmenter` on the final labels.

    Args:
        runtime: the app's model configuration (the segmenter to start from).
        model_dir: where the fine-tuned segmenter and its stats go.
    """

    def __init__(self, runtime: XFlowRuntime, model_dir: str | os.PathLike):
        super().__init__("Fine-tune XFlow's segmenter F_seg (prompt encoder + mask decoder) on saved final labels")
        self.runtime = runtime
        self.model_dir = Path(model_dir)

    def config(self) -> dict[str, Any]:
        return {"steps": 10, "lr": 1e-4, "batch": 1, "seed": 0}

    def stats(self) -> dict[str, Any]:
        path = self.model_dir / STATS_FILE
        return json.loads(path.read_text()) if path.is_file() else {}

    def __call__(self, request: Mapping[str, Any], datastore: Any) -> dict[str, Any]:
        req = {**self.config(), **dict(request)}
        start = trained_segmenter(self.model_dir) or self.runtime.config.segmenter
        if not start:
            from monailabel_xflow.label.errors import ModelsNotConfiguredError
            from monailabel_xflow.label.runtime import HOW_TO_CONFIGURE

            raise ModelsNotConfiguredError(HOW_TO_CONFIGURE)
        if start == self.runtime.config.segmenter:
            start = str(self.runtime.config.resolve("segmenter"))
        try:
            steps, lr, batch, seed = int(req["steps"]), float(req["lr"]), int(req["batch"]), int(req["seed"])
        except (TypeError, ValueError) as exc:
            raise RequestError(f"steps, lr, batch and seed must be numbers: {exc}") from exc
        pairs = datastore.datalist()
        logger.info("xflow train: %d labeled images, start from %s", len(pairs), start)
        return finetune_from_labels(pairs, start, self.model_dir / TRAINED_SEGMENTER_DIR, steps=steps, lr=lr,
                                    batch=batch, seed=seed)


def trained_segmenter(model_dir: str | os.PathLike | None) -> str | None:
    """The fine-tuned segmenter folder in ``model_dir`` if training has written one."""
    if not model_dir:
        return None
    path = Path(model_dir) / TRAINED_SEGMENTER_DIR
    return str(path) if (path / "config.json").is_file() else None
