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
:class:`~monailabel_xflow.app.strategy.XFlowUncertaintyStrategy` to read.

Request keys (parsed by :func:`scoring_params`, 422 when bad): ``instruction`` (text, default
"segment all findings"), ``max_images`` (1..:data:`MAX_SCORING_IMAGES`, default
:data:`DEFAULT_SCORING_IMAGES`: a run is bounded), ``images`` (ids to score, default every
unlabeled one; duplicates dropped; an id with a path in it is refused, an unknown one skipped and
reported under ``skipped``), ``max_clicks`` (0..16).

Incremental: an image whose score was computed for the same file (size and modification time),
instruction, click budget and models is not scored again (``cached`` lists it); a new or
changed study is. Scoring runs in MONAI Label's scoring subprocess (also the one started when
the server starts), which lowers its own CPU priority before it loads models
(:func:`~monailabel_xflow.app.runtime.lower_priority_if_background`), so that it never
competes with the server's interactive requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monailabel_xflow import rle
from monailabel_xflow.app import layout
from monailabel_xflow.app.infer import as_max_clicks
from monailabel_xflow.app.runtime import XFlowRuntime, lower_priority_if_background
from monailabel_xflow.metrics import mask_iou

logger = logging.getLogger(__name__)

INFO_KEY = "xflow_uncertainty"
DEFAULT_INSTRUCTION = "segment all findings"
MAX_SCORING_IMAGES = 1000
DEFAULT_SCORING_IMAGES = 50


def scoring_params(request: Mapping[str, Any]) -> dict[str, Any]:
    """``instruction``, ``max_clicks``, ``images`` and ``max_images`` of a scoring request,
    parsed strictly (see module docstring).

    Raises:
        RequestError: a wrong type or out-of-range value (422); UnsafeIdError: an id that is a path (400).
    """
    from monailabel_xflow.app.requests import as_id_list, as_int, as_text
    from monailabel_xflow.instructions import MAX_INSTRUCTION_CHARS

    return {
        "instruction": as_text(request.get("instruction"), "instruction", MAX_INSTRUCTION_CHARS).strip()
        or DEFAULT_INSTRUCTION,
        "max_clicks": as_max_clicks(request.get("max_clicks")),
        "images": as_id_list(request.get("images"), "images", MAX_SCORING_IMAGES),
        "max_images": as_int(request.get("max_images"), "max_images", 1, MAX_SCORING_IMAGES, DEFAULT_SCORING_IMAGES),
    }


def _score_key(path: str, instruction: str, budget: int, models: str) -> str:
    """What a cached score depends on: the file (size, mtime), the question and the models."""
    import hashlib
    import os

    st = os.stat(path)
    text = f"{st.st_size}:{st.st_mtime_ns}:{instruction}:{budget}:{models}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


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


def _base_scoring() -> Any:
    from monailabel.interfaces.tasks.scoring import ScoringMethod

    return ScoringMethod


_ScoringMethod: Any = _base_scoring()  # monailabel ships no type information: the base is Any to mypy


class XFlowUncertaintyScoring(_ScoringMethod):
    """Scores unlabeled images with :func:`image_uncertainty` (see module docstring)."""

    def __init__(self, runtime: XFlowRuntime):
        super().__init__("XFlow uncertainty: Stage 1 / Stage 2 disagreement, click effort, F_seg IoU doubt")
        self.runtime = runtime

    def __call__(self, request: Mapping[str, Any], datastore: Any) -> dict[str, Any]:
        from monailabel_xflow.app.errors import http_errors

        with http_errors("xflow_uncertainty"):
            return self._run(request, datastore)

    def _run(self, request: Mapping[str, Any], datastore: Any) -> dict[str, Any]:
        from monailabel.interfaces.datastore import DefaultLabelTag

        from monailabel_xflow.instructions import parse_instructions

        params = scoring_params(request)
        instructions = parse_instructions(params["instruction"])
        budget = params["max_clicks"]
        known = set(datastore.list_images())
        asked = (
            params["images"]
            if params["images"] is not None
            else sorted(datastore.get_unlabeled_images(DefaultLabelTag.FINAL))
        )
        skipped = {i: "unknown image" for i in asked if i not in known}
        images = [i for i in asked if i in known][: params["max_images"]]
        from monailabel.interfaces.exception import ImageNotFoundException

        from monailabel_xflow.errors import InputError

        lower_priority_if_background()  # the scoring subprocess yields the CPU to the server
        xflow = self.runtime.get()
        t_budget = xflow.max_clicks if budget is None else budget
        models = self.runtime.describe()
        scores: dict[str, float] = {}
        failed: dict[str, str] = {}
        cached: list[str] = []
        for image_id in images:
            try:
                uri = datastore.get_image_uri(image_id)
                key = _score_key(uri, params["instruction"], t_budget, models)
                info = datastore.get_image_info(image_id) or {}
                if info.get(f"{INFO_KEY}_key") == key and isinstance(info.get(INFO_KEY), (int, float)):
                    cached.append(image_id)
                    continue
                image, _ = layout.load_image(uri, image_id)
                results = xflow.run_all(image, max_clicks=budget, instructions=instructions)
            except (InputError, ImageNotFoundException, OSError) as exc:  # unreadable or vanished: skip, keep scoring
                failed[image_id] = str(exc)[:300]
                logger.warning("xflow_uncertainty: skipping %s: %s", image_id, exc)
                continue
            score, parts = image_uncertainty(results, t_budget)
            datastore.update_image_info(
                image_id,
                {
                    INFO_KEY: score,
                    f"{INFO_KEY}_parts": parts,
                    f"{INFO_KEY}_ts": int(time.time()),
                    f"{INFO_KEY}_key": key,
                },
            )
            scores[image_id] = score
            logger.info("xflow_uncertainty %s = %.4f", image_id, score)
        if skipped:
            logger.warning("xflow_uncertainty: skipped unknown ids %s", sorted(skipped)[:20])
        return {"scored": len(scores), "scores": scores, "failed": failed, "skipped": skipped, "cached": cached}
