"""What ``apps/xflow/main.py`` delegates to, so the app folder stays thin."""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

from monailabel_xflow.label.errors import ImageNotFoundError, http_errors
from monailabel_xflow.label.runtime import XFlowRuntime

logger = logging.getLogger(__name__)

EXTRA_EXTENSIONS = ("*.dcm", "*.jpeg")
"""Radiograph files a studies folder may hold besides MONAI Label's defaults (png, jpg, nii ...)."""


def app_description(runtime: XFlowRuntime) -> str:
    base = "XFlow: instruction-guided chest X-ray lesion segmentation (Stage 1 grounding + Stage 2 click revision)"
    return f"{base}. Models: {runtime.describe()}"


def init_datastore(app: Any, upstream: Callable[[], Any]) -> Any:
    """A DICOMweb URL goes through ``upstream`` (which calls the app's ``init_remote_datastore``);
    a folder gets :class:`~monailabel_xflow.label.datastore.XFlowLocalDatastore`."""
    if app.studies.startswith(("http://", "https://")):
        return upstream()
    from monailabel.config import settings

    from monailabel_xflow.label.datastore import XFlowLocalDatastore

    extensions = list(dict.fromkeys([*settings.MONAI_LABEL_DATASTORE_FILE_EXT, *EXTRA_EXTENSIONS]))
    return XFlowLocalDatastore(app.studies, extensions=extensions, auto_reload=settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD,
                               read_only=settings.MONAI_LABEL_DATASTORE_READ_ONLY)


def checked_infer(app: Any, upstream: Callable[..., Any], request: Mapping[str, Any], datastore: Any = None) -> Any:
    """``MONAILabelApp.infer`` with unknown image ids answered 404 (upstream passes ``""`` on)
    and every documented error type mapped to its HTTP status (:mod:`.errors`)."""
    with http_errors("infer"):
        request = dict(request)
        image = request.get("image")
        if isinstance(image, str) and image and not os.path.exists(image):
            store = datastore or app.datastore()
            if image not in store.list_images():
                raise ImageNotFoundError(f"unknown image {image!r}: the datastore has no such image")
            request["image_id"] = image
        return upstream(request, datastore)
