"""What 3D Slicer's MONAI Label module needs from the server's *next sample* answer.

The module (``plugins/slicer/MONAILabel/MONAILabel.py``, ``onNextSampleButton``) opens the
sample's ``path`` with ``slicer.util.loadVolume`` when that file exists on its machine, else
downloads ``/datastore/image?image=<id>`` into Slicer's cache folder under the sample's ``name``;
either way it names the volume node after ``name``. Slicer loads a single-slice image without
its "single file" option: ``vtkMRMLVolumeArchetypeStorageNode`` (``SingleFile = 0``) hands it to
``vtkITKArchetypeImageSeriesReader``, which asks ``itk::ArchetypeSeriesFileNames`` for every file
of the folder whose name differs from the archetype in one group of digits only, and stacks
them as one volume. A studies folder of ``phantom_1_00000.png``, ``phantom_1_00001.png`` ...
(or a cache folder where such names were downloaded before) would open as one multi-slice
volume instead of the radiograph asked for.

:func:`single_file_sample` therefore answers with

* ``name``: ``<image id>.<tag><ext>``, ``tag`` eight letters derived from the id (no digits), so
  no other image's file name can differ from it in one digit group only;
* ``path``: that name in a folder of its own (a hard link, else a copy, of the datastore's file
  under the system temporary folder), so a Slicer on the server's machine opens exactly that
  file; a ``path`` that is not a regular file (e.g. a DICOMweb series folder) is dropped, so the
  module downloads the image instead.

:func:`install` wraps MONAI Label's ``/activelearning`` endpoint function with it (server
process only), the same way :mod:`.guard` wraps the infer route, and makes a stopped task's
answer end with a ``details`` line (:func:`stop_with_details`), which Slicer's *Stop* reads.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

VIEW_FOLDER = "xflow-slicer-samples"
"""Folder under the system temporary folder holding one sub-folder per sample handed out."""


def letter_tag(image_id: str, length: int = 8) -> str:
    """``length`` lowercase letters derived from ``image_id`` (SHA-256, no digits)."""
    digest = hashlib.sha256(image_id.encode("utf-8")).digest()
    return "".join(chr(ord("a") + b % 26) for b in digest[:length])


def file_extension(path: str) -> str:
    """The image's extension as Slicer's readers need it (``.nii.gz`` kept whole)."""
    lower = path.lower()
    for double in (".nii.gz", ".nrrd.gz"):
        if lower.endswith(double):
            return path[-len(double):]
    return Path(path).suffix


def single_file_name(image_id: str, path: str) -> str:
    """``<image id>.<letter tag><ext>``: a file name no other sample's name differs from in one
    digit group only (see the module docstring)."""
    return f"{image_id}.{letter_tag(image_id)}{file_extension(path)}"


def single_file_view(path: str, name: str, root: str | os.PathLike | None = None) -> str:
    """``path`` under ``name`` alone in a folder of its own (hard link, else copy; reused when
    already there with the same size and time), for a Slicer on this machine to open.

    Returns:
        The view's path: ``<root>/<sha256(path)[:16]>/<name>``.
    """
    root = Path(root or tempfile.gettempdir()) / VIEW_FOLDER
    folder = root / hashlib.sha256(os.path.realpath(path).encode("utf-8")).hexdigest()[:16]
    view = folder / name
    source = os.stat(path)
    if view.is_file() and (view.stat().st_size, int(view.stat().st_mtime)) == (source.st_size, int(source.st_mtime)):
        return str(view)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(path, tmp)
    os.replace(tmp, view)
    return str(view)


def single_file_sample(sample: Mapping[str, Any], root: str | os.PathLike | None = None) -> dict[str, Any]:
    """A next-sample answer that Slicer opens as exactly one image (see the module docstring).

    Args:
        sample: MONAI Label's answer (``id``, ``path``, ``name`` and the image info).
        root: where the single-file views go (default the system temporary folder).

    Returns:
        A copy with ``name`` and ``path`` replaced (``path`` dropped when it is not a regular
        file); an answer without ``id`` unchanged.
    """
    out = dict(sample)
    image_id, path = out.get("id"), out.get("path")
    if not image_id:
        return out
    out["name"] = single_file_name(str(image_id), str(path or out.get("name") or ""))
    if isinstance(path, str) and os.path.isfile(path):
        out["path"] = single_file_view(path, out["name"], root)
    else:
        out.pop("path", None)
    return out


def install() -> bool:
    """Wrap MONAI Label's next-sample endpoint function with :func:`single_file_sample`
    (idempotent; only in the server process, where ``monailabel.app`` is loaded).

    Returns:
        Whether the wrapper is (now) installed.
    """
    import sys

    if sys.modules.get("monailabel.app") is None:
        return False
    from monailabel.endpoints import activelearning as endpoint

    if not hasattr(endpoint, "_xflow_upstream_sample"):
        upstream = endpoint._xflow_upstream_sample = endpoint.sample

        def sample(strategy: str, params: dict | None = None, user: str | None = None) -> dict[str, Any]:
            return single_file_sample(upstream(strategy, params, user))

        endpoint.sample = sample  # api_sample looks it up at call time
        logger.info("next-sample answers name one file (Slicer reads numbered names as a series otherwise)")
    from monailabel.utils.async_tasks.task import AsyncTask

    if not hasattr(AsyncTask, "_xflow_upstream_stop"):
        AsyncTask._xflow_upstream_stop = staticmethod(AsyncTask.stop)
        AsyncTask.stop = staticmethod(stop_with_details)
    return True


STOPPED_LINE = "stopped at the user's request; the serving segmenter is unchanged"


def stop_with_details(method: str) -> Any:
    """MONAI Label's ``AsyncTask.stop`` whose stopped task always has a last ``details`` line.

    Slicer's ``onStopTraining`` shows ``status.get("result", status.get("details", [])[-1])``;
    Python evaluates that default first, so a task stopped before it logged a line (empty
    ``details``) raised ``IndexError`` in Slicer and left its buttons stale.
    """
    from monailabel.utils.async_tasks.task import AsyncTask

    task = AsyncTask._xflow_upstream_stop(method)
    if isinstance(task, dict) and task.get("status") == "STOPPED":
        task.setdefault("details", []).append(f"{method}: {STOPPED_LINE}")
    return task
