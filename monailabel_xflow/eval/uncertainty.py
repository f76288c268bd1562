"""How unsure XFlow is about an image, from the traces of its answers (active learning).

The trace of each instruction whose finding XFlow calls present gives three numbers in ``[0, 1]``:

* ``disagreement`` d = 1 - IoU(M_0, M_T): Stage 1's union mask against the revised answer
  (π_rev had to change much -> Stage 1 was unsure);
* ``effort`` e = clicks used / (T x number of lesion boxes): the share of the click budget
  π_rev spent (T = max_clicks; 0 when T = 0);
* ``doubt`` q = 1 - mean of F_seg's own IoU estimates of the final lesion masks (0 if none).

The image's uncertainty is the mean of ``(d + e + q) / 3`` over the present findings, and 0 when
XFlow calls every finding absent (a presence call carries no confidence in this workflow).
The app's ``xflow_uncertainty`` scoring task (:mod:`monailabel_xflow.app.scoring`) stores it per image.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from monailabel_xflow import rle
from monailabel_xflow.metrics import mask_iou


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
    ious = [v for v in ((les.iou if les.iou is not None else les.initial_iou) for les in lesions) if v is not None]
    q = 1.0 - float(np.clip(np.mean(ious), 0.0, 1.0)) if ious else 0.0
    return {"disagreement": d, "effort": float(min(1.0, e)), "doubt": q, "u": (d + min(1.0, e) + q) / 3.0}


def image_uncertainty(results: Sequence[Any], max_clicks: int) -> tuple[float, dict[str, Any]]:
    """The image score (mean over present findings, 0 if none) and its parts per finding."""
    parts = {r.instruction.finding: p for r in results if (p := result_uncertainty(r, max_clicks)) is not None}
    score = float(np.mean([p["u"] for p in parts.values()])) if parts else 0.0
    return score, parts
