"""What 3D Slicer's MONAI Label module needs from the server's *next sample* answer.

Slicer opens a single-slice image without its "single file" option, so ITK's archetype reader
stacks every file of the folder whose name differs in one group of digits
(``phantom_1_00000.png``, ``phantom_1_00001.png`` ... would open as one volume).
:func:`single_file_sample` answers ``name`` = ``<image id>.<tag><ext>`` with ``tag`` eight letters
derived from the id, and ``path`` = that name alone (no server path), so Slicer downloads the image
under ``name``, where it opens alone. :func:`install` wraps ``/activelearning`` with it
(:mod:`.wraps`) and makes a stopped task's answer end with a ``details`` line
(:func:`stop_with_details`), which Slicer's *Stop* reads.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monailabel_xflow.app.wraps import install as install_patches
from monailabel_xflow.app.wraps import upstream

logger = logging.getLogger(__name__)

LAYER = "slicer"
"""Slicer's name in :mod:`.wraps` (its markers)."""


def letter_tag(image_id: str, length: int = 8) -> str:
    """``length`` lowercase letters derived from ``image_id`` (SHA-256, no digits)."""
    digest = hashlib.sha256(image_id.encode("utf-8")).digest()
    return "".join(chr(ord("a") + b % 26) for b in digest[:length])


def file_extension(path: str) -> str:
    """The image's extension as Slicer's readers need it (``.nii.gz`` kept whole)."""
    lower = path.lower()
    for double in (".nii.gz", ".nrrd.gz"):
        if lower.endswith(double):
            return path[-len(double) :]
    return Path(path).suffix


def single_file_name(image_id: str, path: str) -> str:
    """``<image id>.<letter tag><ext>``: a file name no other sample's name differs from in one
    digit group only (see the module docstring)."""
    return f"{image_id}.{letter_tag(image_id)}{file_extension(path)}"


def single_file_sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """``sample`` (MONAI Label's next-sample answer) with ``name`` the single-file name and
    ``path`` that name alone; an answer without ``id`` unchanged."""
    out = dict(sample)
    image_id = out.get("id")
    if not image_id:
        return out
    out["name"] = single_file_name(str(image_id), str(out.get("path") or out.get("name") or ""))
    out["path"] = out["name"]
    return out


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
    return task
