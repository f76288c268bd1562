"""F_seg fine-tuned on saved final labels, and when it may replace the serving one.

The app's train task (:mod:`monailabel_xflow.app.train`) runs :func:`finetune_from_labels` on the
datastore's final labels; this module decides what it trains on and whether the result is promoted:

* each finding's connected components of a label map become box prompts, specks (under
  :data:`monailabel_xflow.metrics.SPECK_FRACTION` of the image, the metrics' own speck rule) left
  out, the largest :data:`MAX_PROMPTS_PER_IMAGE` kept (:func:`component_prompts`);
* every :data:`HOLDOUT_EVERY`-th labeled image is held out of training (:func:`split_heldout`);
* F_seg is fine-tuned with SAM's interactive recipe (``interactive_rounds`` click rounds per
  prompt, as the demo F_seg was trained), so the clicks of an annotator keep moving the mask;
* a candidate is promoted only with finite weights and held-out mean IoUs not below the serving
  segmenter's on the same labels, box-only and after :data:`PROMOTION_CLICKS` clicks of the
  simulated annotator sent as 3D Slicer and OHIF send them (:func:`promotion_check`): a candidate
  that lost click response is kept aside;
* a run's progress and outcome go to ``train_stats.json`` (:class:`TrainProgress`), where 3D Slicer
  and MONAI Label's ``/train`` read them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.errors import InputError
from monailabel_xflow.files import atomic_write_json, swap_dir, temp_name
from monailabel_xflow.geometry import connected_components, mask_to_box
from monailabel_xflow.metrics import SPECK_FRACTION, mask_iou
from monailabel_xflow.task_options import TRAIN_DEFAULTS

logger = logging.getLogger(__name__)

MAX_PROMPTS_PER_IMAGE = 8
"""The largest components of an image that become prompts (bounds the decoder batch)."""


def component_prompts(
    label_hw: np.ndarray, min_share: float = SPECK_FRACTION, max_prompts: int = MAX_PROMPTS_PER_IMAGE
) -> list[tuple[tuple[float, float, float, float], np.ndarray]]:
    """``[(box, mask)]``: one box prompt per connected component (8-connectivity, as everywhere
    else) of each finding in a label map, specks (< ``min_share`` of the image) left out, at most
    ``max_prompts``, largest first."""
    min_px = max(1, int(np.ceil(min_share * label_hw.size)))
    found = [
        m
        for value in (int(v) for v in np.unique(label_hw) if v)
        for m in connected_components(label_hw == value, min_area_px=min_px)
    ]
    found.sort(key=lambda m: -int(m.sum()))
    return [(box, m) for m in found[:max_prompts] if (box := mask_to_box(m)) is not None]  # never None: m not empty


HOLDOUT_EVERY = 5
MAX_HELDOUT = 8
"""Every 5th labeled image (sorted by path; at least one, at most 8) is held out of training to
check the fine-tuned segmenter before it may replace the serving one."""


def split_heldout(labeled: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """``(held_out, train)``: every :data:`HOLDOUT_EVERY`-th item, at least one (the last) and
    at most :data:`MAX_HELDOUT`; a single labeled image is all training and nothing is held out."""
    if len(labeled) < 2:
        return [], list(labeled)
    picked = set(range(HOLDOUT_EVERY - 1, len(labeled), HOLDOUT_EVERY)) or {len(labeled) - 1}
    picked = set(sorted(picked)[:MAX_HELDOUT])
    return [x for i, x in enumerate(labeled) if i in picked], [x for i, x in enumerate(labeled) if i not in picked]


INTERACTIVE_SETTINGS: dict[str, float] = {
    "interactive_click_start": 0.7,
    "interactive_oracle_prob": 0.0,
    "interactive_mask_dropout": 0.5,
}
"""The fine-tune's interactive sessions, as in the demo F_seg's last stage (its model card): most
sessions start from a person's first click, every click drawn uniformly from the error region
(SAM's rule), half the click rounds without the previous logits (a client's request carries no
mask). ``interactive_rounds`` is the train request's option."""

PROMOTION_CLICKS = 3
"""Clicks of the simulated annotator after which a candidate's held-out IoU must not fall below the
serving segmenter's (besides its box-only IoU): the first few clicks are what a person makes."""


def heldout_scores(
    weights: str | os.PathLike, held: Sequence[tuple[np.ndarray, list]], clicks: int = PROMOTION_CLICKS
) -> dict[str, float]:
    """A segmenter's mean IoU on held-out labels: box-only, and after ``clicks`` clicks.

    Box-only: each labelled component's tight box (as in training). Clicks: the click
    benchmark's simulated annotator clicks the component ``clicks`` times from an empty segment,
    each click a request with every click so far and no mask, as 3D Slicer and OHIF send them
    (:func:`~monailabel_xflow.workflow.xflow.client_session`); a user with no admissible click
    left stops, the IoU staying where it is.

    Returns:
        ``{"box": mean IoU@box, "clicks": mean IoU after ``clicks`` clicks}``.
    """
    from monailabel_xflow.policy.oracle import simulated_user
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.workflow.xflow import client_session

    seg = load_segmenter(str(weights), device="cpu")
    user = simulated_user(clicks)
    boxed: list[float] = []
    clicked: list[float] = []
    for image, prompts in held:
        seg.set_image(image)
        result = seg.predict([box for box, _ in prompts])
        boxed.extend(mask_iou(pred, truth) for pred, (_, truth) in zip(result.masks, prompts, strict=False))
        for _, truth in prompts:
            ious, _ = client_session(seg, image, truth, user)
            clicked.append(ious[-1] if ious else 0.0)
    return {"box": float(np.mean(boxed)), "clicks": float(np.mean(clicked))}


def weights_finite(weights: str | os.PathLike) -> bool:
    """Whether every floating-point tensor of a saved segmenter is finite."""
    import torch

    from monailabel_xflow.segmenter.sam3 import load_tracker_model

    state = load_tracker_model(str(weights)).state_dict()
    return all(bool(torch.isfinite(t).all()) for t in state.values() if t.is_floating_point())


def promotion_check(
    current: str | os.PathLike, candidate: str | os.PathLike, held: Sequence[tuple[np.ndarray, list]]
) -> dict[str, Any]:
    """May ``candidate`` replace ``current``? Only with finite weights and held-out mean IoUs not
    below the current segmenter's on the same labels (which it did not train on), box-only and
    after :data:`PROMOTION_CLICKS` clicks (:func:`heldout_scores`).

    Returns:
        ``{"promoted", "reason", "weights_finite", "heldout_iou_current", "heldout_iou_candidate",
        "heldout_clicks", "heldout_iou_clicks_current", "heldout_iou_clicks_candidate"}`` (IoUs
        None when not measured).
    """
    out: dict[str, Any] = {
        "weights_finite": weights_finite(candidate),
        "heldout_iou_current": None,
        "heldout_iou_candidate": None,
        "heldout_clicks": PROMOTION_CLICKS,
        "heldout_iou_clicks_current": None,
        "heldout_iou_clicks_candidate": None,
    }
    if not out["weights_finite"]:
        return {**out, "promoted": False, "reason": "kept aside: the fine-tuned weights are not finite"}
    if not held:
        return {
            **out,
            "promoted": False,
            "reason": "kept aside: no held-out label to check it on "
            "(save final labels with findings on at least 2 images)",
        }
    cur, new = heldout_scores(current, held), heldout_scores(candidate, held)
    out.update(
        heldout_iou_current=round(cur["box"], 6),
        heldout_iou_candidate=round(new["box"], 6),
        heldout_iou_clicks_current=round(cur["clicks"], 6),
        heldout_iou_clicks_candidate=round(new["clicks"], 6),
    )
    k = PROMOTION_CLICKS
    if not np.isfinite(new["box"]) or new["box"] < cur["box"]:
        reason = f"kept aside: held-out IoU {new['box']:.4f} is below the serving segmenter's {cur['box']:.4f}"
        return {**out, "promoted": False, "reason": reason}
    if not np.isfinite(new["clicks"]) or new["clicks"] < cur["clicks"]:
        reason = (
            f"kept aside: it lost click response: held-out IoU after {k} clicks (sent as 3D Slicer and OHIF "
            f"send them) {new['clicks']:.4f} is below the serving segmenter's {cur['clicks']:.4f}"
        )
        return {**out, "promoted": False, "reason": reason}
    reason = (
        f"promoted: held-out IoU {new['box']:.4f} >= {cur['box']:.4f}, after {k} clicks "
        f"{new['clicks']:.4f} >= {cur['clicks']:.4f}"
    )
    return {**out, "promoted": True, "reason": reason}


def finetune_from_labels(
    pairs: Sequence[Mapping[str, str]],
    segmenter: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    steps: int = 10,
    lr: float = 1e-4,
    batch: int = 1,
    seed: int = 0,
    interactive_rounds: int = TRAIN_DEFAULTS["interactive_rounds"],
    on_step: Callable[[int, int, float | None], Any] | None = None,
) -> dict[str, Any]:
    """Fine-tune F_seg on a datastore's final labels with the package's F_seg trainer.

    Args:
        pairs: ``[{"image": path, "label": path}]`` (``datastore.datalist()``); labels are label
            maps of the image's size (values 0..7).
        segmenter: the weights to start from (folder, hub id or ``.pt``; see ``load_tracker_model``).
        output_dir: where a promoted model is saved (``save_pretrained``), trained in a
            temporary folder beside it and put in place by :func:`~monailabel_xflow.files.swap_dir`
            (fsync-ed, renamed), so a serving app never reads half a checkpoint, even after a
            kill; a rejected one goes to ``<output_dir>.rejected``.
        steps: optimiser steps; ``batch``: prompts per step (gradient accumulation).
        lr: AdamW learning rate of the decoder (the encoder gets the trainer's 0.6x).
        seed: prompt sampling and initialisation seed.
        interactive_rounds: simulated click rounds per prompt (SAM's interactive recipe,
            :func:`~monailabel_xflow.training.segmenter.interactive_loss`; 0: box prompts only).
        on_step: called with (0, steps, None) once the data are read and after every optimiser
            step with (done, total, loss), e.g. to publish progress.

    Returns:
        Stats: ``images`` (trained on), ``prompts``, ``steps``, ``losses``, ``loss_first``,
        ``loss_last``, ``heldout_images``, the
        :func:`~monailabel_xflow.training.promotion.promotion_check` keys, ``seconds``,
        ``output`` (where the model went), ``start_weights``.

    Raises:
        InputError: no labeled image holds a finding to train on.
    """
    import shutil

    from monailabel_xflow.training.config import SegmenterTrainConfig
    from monailabel_xflow.training.segmenter import SegSample, finetune_segmenter
    from monailabel_xflow.transforms.labels import read_label
    from monailabel_xflow.transforms.loading import load_cxr

    t0 = time.perf_counter()
    labeled = []  # (image path, image, prompts) of every pair whose label holds a finding
    for pair in sorted(pairs, key=lambda p: str(p["image"])):
        image, _ = load_cxr(pair["image"])
        prompts = component_prompts(read_label(pair["label"], (image.shape[0], image.shape[1])))
        if prompts:
            labeled.append((str(pair["image"]), image, prompts))
    if not labeled:
        raise InputError("nothing to train on: no final label holds a finding (save labels first)")
    held, train = split_heldout(labeled)
    samples = [SegSample(image, mask) for _, image, prompts in train for _, mask in prompts]
    cfg = SegmenterTrainConfig(
        learning_rate=float(lr),
        max_steps=int(steps),
        effective_batch=int(batch),
        seed=int(seed),
        interactive_rounds=int(interactive_rounds),
        interactive_click_start=INTERACTIVE_SETTINGS["interactive_click_start"],
        interactive_oracle_prob=INTERACTIVE_SETTINGS["interactive_oracle_prob"],
        interactive_mask_dropout=INTERACTIVE_SETTINGS["interactive_mask_dropout"],
    )
    output_dir = Path(output_dir)
    if on_step is not None:
        on_step(0, int(steps), None)
    tmp = temp_name(output_dir)  # a folder no reader looks at; removed at the next start if a kill leaves it
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    try:
        result = finetune_segmenter(str(segmenter), samples, tmp, cfg, progress=False, on_step=on_step)
        check = promotion_check(segmenter, tmp, [(image, prompts) for _, image, prompts in held])
        destination = output_dir if check["promoted"] else output_dir.with_name(output_dir.name + ".rejected")
        swap_dir(tmp, destination)  # whole: a serving app reads the old model or the new one, never half
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    losses = [float(v) for v in result["losses"]]
    stats = {
        "images": len(train),
        "prompts": len(samples),
        "steps": int(result["steps"]),
        "losses": losses,
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        "heldout_images": [path for path, _, _ in held],
        **check,
        "seconds": round(time.perf_counter() - t0, 3),
        "output": str(destination),
        "start_weights": str(segmenter),
    }
    log = logger.info if check["promoted"] else logger.warning
    log(
        "fine-tuned F_seg on %d prompts from %d images: loss %.4f -> %.4f; %s (%s)",
        len(samples),
        len(train),
        stats["loss_first"],
        stats["loss_last"],
        check["reason"],
        destination,
    )
    return stats


STATS_FILE = "train_stats.json"


def close_progress(path: str | os.PathLike, reason: str) -> bool:
    """End a run's open progress record in ``train_stats.json`` with ``reason``, when the run ended
    without an outcome (stopped, failed): ``promoted`` false, ``total_time`` set. Left open, Slicer
    and ``/info`` showed the run at its last step for good. A finished record is left as it is.

    Returns:
        Whether it wrote.
    """
    import datetime

    path = Path(path)
    try:
        stats = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(stats, dict) or not stats or "total_time" in stats:
        return False
    elapsed = datetime.timedelta(seconds=int(max(0.0, time.time() - float(stats.get("start_ts") or time.time()))))
    atomic_write_json(path, {**stats, "promoted": False, "reason": reason, "total_time": str(elapsed)}, indent=1)
    return True


class TrainProgress:
    """Publishes a fine-tuning run's progress in ``train_stats.json`` (rewritten atomically) under
    the keys MONAI Label's trainers publish and 3D Slicer reads; ``total`` optimiser steps are
    published as ``total_epochs``, ``best_metric`` is the serving segmenter's held-out mean IoU."""

    def __init__(self, path: str | os.PathLike, total: int):
        import datetime

        self._timedelta = datetime.timedelta
        self.path = Path(path)
        self.total = int(total)
        self.start = time.time()
        previous = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.best_metric = float(previous.get("best_metric") or 0.0)

    def _elapsed(self) -> str:
        return str(self._timedelta(seconds=int(time.time() - self.start)))

    def _write(self, stats: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, stats, indent=1)  # the server reads it while training runs: never half a file

    def step(self, step: int, total: int | None = None, loss: float | None = None) -> None:
        """Publish ``step`` of ``total`` optimiser steps done (running: ``current_time``)."""
        self.total = int(total or self.total)
        self._write(
            {
                "epoch": int(step),
                "total_epochs": self.total,
                "best_metric": self.best_metric,
                "start_ts": int(self.start),
                "current_time": self._elapsed(),
                "loss": None if loss is None else float(loss),
            }
        )

    def done(self, stats: Mapping[str, Any]) -> dict[str, Any]:
        """Publish the outcome: ``stats`` plus ``epoch = total_epochs``, ``total_time`` and
        ``best_metric`` (held-out IoU of the segmenter serving now; unchanged when not measured)."""
        serving = stats.get("heldout_iou_candidate") if stats.get("promoted") else stats.get("heldout_iou_current")
        if serving is not None:
            self.best_metric = float(serving)
        out = {
            **stats,
            "epoch": int(stats.get("steps", self.total)),
            "total_epochs": self.total,
            "best_metric": self.best_metric,
            "start_ts": int(self.start),
            "total_time": self._elapsed(),
        }
        self._write(out)
        return out
