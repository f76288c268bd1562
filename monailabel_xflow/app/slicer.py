"""What 3D Slicer's MONAI Label module needs from the MONAI Label server's answers.

:func:`install` wraps ``/activelearning`` (:mod:`.wraps`) so that a *next sample* answer names one
file (:func:`~monailabel_xflow.serving.slicer.single_file_sample`: Slicer would open numbered
file names as one series), and makes a stopped task's answer end with a ``details`` line
(:func:`stop_with_details`), which Slicer's *Stop* reads.
"""

from __future__ import annotations

import logging
from typing import Any

from monailabel_xflow.app.wraps import install as install_patches
from monailabel_xflow.serving.patching import upstream
from monailabel_xflow.serving.slicer import single_file_sample

logger = logging.getLogger(__name__)

LAYER = "slicer"
"""Slicer's name in :mod:`.wraps` (its markers)."""


def install() -> bool:
    """Wrap the next-sample endpoint and ``AsyncTask.stop`` (idempotent; server process only)."""
    import sys

    if sys.modules.get("monailabel.app") is None:
        return False
    from monailabel.endpoints import activelearning as endpoint

    def sample(strategy: str, params: dict | None = None, user: str | None = None) -> dict[str, Any]:
        return single_file_sample(upstream(endpoint, "sample", LAYER)(strategy, params, user))

    # each wraps whatever serves the name now (the guard's), under a marker of its own (app/wraps.py)
    target = "monailabel.endpoints.activelearning.sample"  # api_sample looks it up at call time
    if target in install_patches(
        LAYER, {target: sample, "monailabel.utils.async_tasks.task.AsyncTask.stop": stop_with_details}
    ):
        logger.info("next-sample answers name one file (Slicer reads numbered names as a series otherwise)")
    return True


STOPPED_LINE = "stopped at the user's request; the serving segmenter is unchanged"


def stop_with_details(method: str) -> Any:
    """``AsyncTask.stop`` whose stopped task always has a last ``details`` line: Slicer's
    ``onStopTraining`` indexes ``details[-1]`` even when it shows ``result``."""
    from monailabel.utils.async_tasks.task import AsyncTask

    task = upstream(AsyncTask, "stop", LAYER)(method)
    if isinstance(task, dict) and task.get("status") == "STOPPED":
        task.setdefault("details", []).append(f"{method}: {STOPPED_LINE}")
        if method == "train":  # the killed subprocess cannot end its progress record itself
            from monailabel.interfaces.utils.app import app_instance

            for trainer in getattr(app_instance(), "_trainers", {}).values():
                if hasattr(trainer, "stopped"):
                    trainer.stopped(STOPPED_LINE)
    return task
