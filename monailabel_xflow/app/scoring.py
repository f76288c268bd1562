"""``xflow_uncertainty`` scoring: how unsure XFlow is about each unlabeled image.

For every image without a ``final`` label, XFlow answers the scoring instruction and
:func:`monailabel_xflow.eval.uncertainty.image_uncertainty` turns the traces into a value in
``[0, 1]``, stored as image info ``xflow_uncertainty`` (with ``_parts`` and ``_ts``) for
:class:`~monailabel_xflow.app.strategy.XFlowUncertaintyStrategy`. Request keys:
:func:`~monailabel_xflow.task_options.scoring_params`. An image already scored for the same file
(size, mtime), instruction, click budget and models is skipped (``cached``). The scoring
subprocess lowers its CPU priority before loading models
(:func:`lower_priority_if_background`). Everything a scoring run
computes (embeddings, answers) is kept in the workspace store, with the Stage 1 only answers to all
findings that 3D Slicer's Next Sample auto-runs (``XFlow.prepare``).
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from monailabel_xflow.app.wraps import upstream_class
from monailabel_xflow.eval.uncertainty import image_uncertainty
from monailabel_xflow.task_options import scoring_params
from monailabel_xflow.transforms import labels as label_io
from monailabel_xflow.workflow.runtime import XFlowRuntime

logger = logging.getLogger(__name__)

INFO_KEY = "xflow_uncertainty"

BACKGROUND_NICE = 10
"""CPU niceness MONAI Label's background task processes (scoring, training, batch infer) give
themselves, so that they never compete with the server's interactive requests."""


def background_task() -> str | None:
    """The method (``"scoring"``, ``"train"``, ``"batch_infer"`` ...) when this process is one of
    MONAI Label's background task subprocesses (``python -m monailabel.interfaces.utils.app -m
    METHOD``), else None."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", None) != "monailabel.interfaces.utils.app":
        return None
    argv = list(sys.argv)
    for flag in ("-m", "--method"):
        if flag in argv[:-1]:
            return argv[argv.index(flag) + 1]
    return None


def lower_priority_if_background() -> None:
    """In a background task subprocess, lower its CPU priority once (see :data:`BACKGROUND_NICE`)."""
    global _NICED
    if _NICED or background_task() is None:
        return
    _NICED = True
    try:
        os.nice(BACKGROUND_NICE)
        logger.info("background %s task: CPU niceness +%d (interactive first)", background_task(), BACKGROUND_NICE)
    except OSError:
        pass


_NICED = False


def _score_key(path: str, instruction: str, budget: int, models: str) -> str:
    """What a cached score depends on: the file (size, mtime), the question and the models."""
    import hashlib

    st = os.stat(path)
    text = f"{st.st_size}:{st.st_mtime_ns}:{instruction}:{budget}:{models}"
    return hashlib.sha256(text.encode()).hexdigest()[:32]


ScoringMethod: Any = upstream_class("monailabel.interfaces.tasks.scoring.ScoringMethod")


class XFlowUncertaintyScoring(ScoringMethod):
    """Scores unlabeled images with :func:`~monailabel_xflow.eval.uncertainty.image_uncertainty`."""

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
                image, _ = label_io.load_image(uri, image_id)
                results = xflow.run_all(image, max_clicks=budget, instructions=instructions)
                xflow.prepare(image)  # 3D Slicer's Next Sample auto-run, kept in the workspace store
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
