"""MONAI Label settings the XFlow app sets for itself, whichever command starts the server.

MONAI Label reads its settings (``monailabel.config.settings``) from the environment once, when it
is imported. Five of upstream's defaults do not suit a radiograph server, so :class:`XFlowApp
<monailabel_xflow.app.xflow_app.XFlowApp>` sets them when it is created (:func:`apply`), each only
where it is still at MONAI Label's default (a value set in the environment wins): upstream's own
``monailabel start_server --app apps/xflow``, ``xflow serve`` and MONAI Label's scoring / train
subprocesses (which create the app again) all serve the same app.

* ``MONAI_LABEL_DICOMWEB_SEARCH_FILTER`` = :data:`SEARCH_FILTER` (CR/DX series are the images;
  upstream lists CT, and ``{}`` would list SEG label series as images);
* ``MONAI_LABEL_DICOMWEB_CACHE_EXPIRY`` = 10 s: upstream's 7200 s hides new series and labels for
  two hours;
* ``MONAI_LABEL_DATASTORE_FILE_EXT`` = :data:`FILE_EXTENSIONS`, the files a studies folder lists:
  radiographs, not upstream's ``*.tif``, ``*.svs`` and ``*.xml`` (pathology);
* ``MONAI_LABEL_DICOMWEB_CACHE_PATH`` = ``<app folder>/cache/dicomweb`` (unless
  ``MONAI_LABEL_DATASTORE_CACHE_PATH``, its new name, is set) and ``MONAI_LABEL_SESSION_PATH`` =
  ``<app folder>/cache/sessions``: beside the server's ``logs/`` and ``model/``, instead of the
  user's ``~/.cache/monailabel``.

``--conf dicomweb_search_filter`` still overrides the filter
(:func:`monailabel_xflow.app.datastore.search_filter`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SEARCH_FILTER: dict[str, str] = {"Modality": "CR,DX"}
"""The DICOMweb series that are images: radiographs."""

CACHE_EXPIRY_S = 10
"""Seconds a DICOMweb listing (series, SEG labels) is reused before the PACS is asked again."""

FILE_EXTENSIONS = ["*.nii.gz", "*.nii", "*.nrrd", "*.png", "*.jpg", "*.jpeg", "*.dcm"]
"""The files of a studies folder that are images (a variable set in the environment wins; the
local datastore always adds ``*.dcm`` and ``*.jpeg``)."""


def defaults(app_dir: str | os.PathLike, current: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings :func:`apply` would set for an app served from ``app_dir``: those that
    ``current`` (default: MONAI Label's ``settings`` now) leaves at MONAI Label's own default.

    A value set otherwise (an environment variable, MONAI Label's ``.env`` file) wins. The
    environment alone cannot tell: ``monailabel start_server`` exports every setting, defaults
    included, before the app is created. The cache folder stays unset when its newer name
    ``MONAI_LABEL_DATASTORE_CACHE_PATH`` is set.
    """
    from monailabel.config import settings

    fields = type(settings).model_fields
    now = settings.model_dump() if current is None else current
    folder = Path(app_dir).expanduser().resolve()
    wanted: dict[str, Any] = {
        "MONAI_LABEL_DICOMWEB_SEARCH_FILTER": dict(SEARCH_FILTER),
        "MONAI_LABEL_DICOMWEB_CACHE_EXPIRY": CACHE_EXPIRY_S,
        "MONAI_LABEL_DATASTORE_FILE_EXT": list(FILE_EXTENSIONS),
        "MONAI_LABEL_SESSION_PATH": str(folder / "cache" / "sessions"),
    }
    if now.get("MONAI_LABEL_DATASTORE_CACHE_PATH") == fields["MONAI_LABEL_DATASTORE_CACHE_PATH"].default:
        wanted["MONAI_LABEL_DICOMWEB_CACHE_PATH"] = str(folder / "cache" / "dicomweb")
    return {key: value for key, value in wanted.items() if now.get(key) == fields[key].default}


def apply(app_dir: str | os.PathLike) -> dict[str, Any]:
    """Set :func:`defaults` in MONAI Label's ``settings`` (before the app builds its datastore and
    sessions); returns what it set, which the log lists."""
    from monailabel.config import settings

    values = defaults(app_dir)
    for key, value in values.items():
        setattr(settings, key, value)
    if values:
        logger.info("MONAI Label settings for radiographs: %s", ", ".join(f"{k}={v}" for k, v in values.items()))
    return values
