"""``xflow_uncertainty`` scoring: how unsure XFlow is about each unlabeled image.

For every image without a ``final`` label, XFlow answers the scoring instruction (default
"segment all findings") and the trace of each instruction whose finding it calls present gives
three numbers in ``[0, 1]``:

* ``disagreement`` d = 1 - IoU(M_0, M_T): Stage 1's union mask against the revised answer
  (π_rev had to change much -> Stage 1 was unsure);
* ``effort`` e = clicks used / (T x number of lesion boxes): the share of the click budget
  π_rev spent (T = max_clicks; 0 when T = 0);
* ``doubt`` q = 1 - mean of F_seg's own IoU estimates of the final lesion masks (0 if none).

The image's uncertainty is the mean of ``(d + e + q) / 3`` over the present findings, and 0 when
XFlow calls every finding absent (a presence call carries no confidence in this workflow).
Written with ``datastore.update_image_info(image_id, {"xflow_uncertainty": u,
"xflow_uncertainty_parts": {...}, "xflow_uncertainty_ts": epoch_s})`` for
:class:`~monailabel_xflow.label.strategy.XFlowUncertaintyStrategy` to read.

Request keys: ``instruction`` (text, default "segment all findings"), ``max_images`` (int, 0 =
all), ``images`` (list of ids to score, default: every unlabeled one), ``max_clicks``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Sequence

import numpy as np

from monailabel_xflow import rle
from monailabel_xflow.label import layout
from monailabel_xflow.label.errors import RequestError
from monailabel_xflow.label.infer import as_max_clicks
from monailabel_xflow.label.runtime import XFlowRuntime
from monailabel_xflow.metrics import mask_iou

logger = logging.getLogger(__name__)

INFO_KEY = "xflow_uncertainty"
DEFAULT_INSTRUCTION = "segment all findings"


def result_uncertainty(result: Any, max_clicks: int) -> dict[str, float] | None:
    """``{"disagreement", "effort", "doubt", "u"}`` of one present :class:`XFlowResult`
    (None when the finding was called absent)."""
    lesions = result.trace.lesions
    if not result.present or not lesions:
        return None
    shape = tuple(result.trace.image_size)
    m0 = np.zeros(shape, dtype=bool)
    for lesion in lesions:
        m0 |= rle.decode(lesion.initial_mask)
    d = 1.0 - mask_iou(m0, result.mask)
    clicks = sum(len(lesion.clicks) for lesion in lesions)
    e = clicks / (max_clicks * len(lesions)) if max_clicks > 0 else 0.0
    ious = [v for v in ((l.iou if l.iou is not None else l.initial_iou) for l in lesions) if v is not None]
    q = 1.0 - float(np.clip(np.mean(ious), 0.0, 1.0)) if ious else 0.0
    return {"disagreement": d, "effort": float(min(1.0, e)), "doubt": q, "u": (d + min(1.0, e) + q) / 3.0}


def image_uncertainty(results: Sequence[Any], max_clicks: int) -> tuple[float, dict[str, Any]]:
    """The image score (mean over present findings, 0 if none) and its parts per finding."""
    parts = {r.instruction.finding: p for r in results if (p := result_uncertainty(r, max_clicks)) is not None}
    score = float(np.mean([p["u"] for p in parts.values()])) if parts else 0.0
    return score, parts


def _base_scoring():
    from monailabel.interfaces.tasks.scoring import ScoringMethod

    return ScoringMethod


class XFlowUncertaintyScoring(_base_scoring()):
    """Scores unlabeled images with :func:`image_uncertainty` (see module docstring)."""

    def __init__(self, runtime: XFlowRuntime):
        super().__init__("XFlow uncertainty: Stage 1 / Stage 2 disagreement, click effort, F_seg IoU doubt")
        self.runtime = runtime

    def __call__(self, request: Mapping[str, Any], datastore: Any) -> dict[str, Any]:
        from monailabel.interfaces.datastore import DefaultLabelTag
        from monailabel_xflow.instructions import parse_instructions

        instructions = parse_instructions(str(request.get("instruction") or DEFAULT_INSTRUCTION))
        budget = as_max_clicks(request.get("max_clicks"))
        images = request.get("images") or datastore.get_unlabeled_images(DefaultLabelTag.FINAL)
        if not isinstance(images, (list, tuple)):
            raise RequestError(f"images must be a list of ids, got {images!r}")
        limit = int(request.get("max_images") or 0)
        images = list(images)[:limit] if limit > 0 else list(images)
        xflow = self.runtime.get()
        t_budget = xflow.max_clicks if budget is None else budget
        scores: dict[str, float] = {}
        failed: dict[str, str] = {}
        for image_id in images:
            try:
                image, _ = layout.load_image(datastore.get_image_uri(image_id), image_id)
                with self.runtime.lock:
                    results = xflow.run_all(image, max_clicks=budget, instructions=instructions)
            except ValueError as exc:  # an image XFlow cannot read: skip it, keep scoring the rest
                failed[image_id] = str(exc)
                logger.warning("xflow_uncertainty: skipping %s: %s", image_id, exc)
                continue
            score, parts = image_uncertainty(results, t_budget)
            datastore.update_image_info(image_id, {INFO_KEY: score, f"{INFO_KEY}_parts": parts,
                                                   f"{INFO_KEY}_ts": int(time.time())})
            scores[image_id] = score
            logger.info("xflow_uncertainty %s = %.4f", image_id, score)
        return {"scored": len(scores), "scores": scores, "failed": failed}
