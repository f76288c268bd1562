"""Where XFlow's errors become HTTP answers of the MONAI Label server, and the app's own errors.

MONAI Label 0.8.5 installs no exception handler: anything a task raises is a bare 500. Tasks and
datastores run inside :func:`http_errors`, which re-raises every error of the package's tree
(:mod:`monailabel_xflow.errors`) as ``HTTPException`` with its message as ``detail`` and the status
of its base (:func:`status_of`: 400 bad request, 404 not found, 405 not allowed, 409 conflict,
413 too large, 422 input, 503 unavailable or the PACS not answering, 507 disk full: any
``OSError`` of a full disk counts, whoever raised it: :mod:`monailabel_xflow.serving.errors`);
:func:`error_response`, the server's exception handler, answers the same for errors that escape.
Anything else stays a 500 (a bug, not bad input).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from monailabel_xflow.errors import (  # noqa: F401  (the request and model errors: re-exported for the app)
    ImageNotFoundError,
    ModelsNotConfiguredError,
    ModelUnavailableError,
    RequestError,
    RequestTooLargeError,
    SessionNotFoundError,
    UnsafeIdError,
)
from monailabel_xflow.serving.errors import answer_detail, answer_status
from monailabel_xflow.transforms.labels import LabelError  # noqa: F401  (a label file that does not fit: 422)

logger = logging.getLogger(__name__)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status of an error (:func:`~monailabel_xflow.serving.errors.answer_status`: by base
    class for the package's tree, 507 for a full disk), 404 for MONAI Label's unknown image; None
    for anything else (not a documented input error)."""
    status = answer_status(exc)
    if status is None and type(exc).__name__ == "ImageNotFoundException":
        from monailabel.interfaces.exception import ImageNotFoundException

        status = 404 if isinstance(exc, ImageNotFoundException) else None
    return status


@contextlib.contextmanager
def http_errors(what: str = "") -> Iterator[None]:
    """Run a block and turn the documented error types into ``HTTPException(status, detail)``.

    Args:
        what: a short prefix for the message (e.g. ``"xflow"``), naming the task that failed.
    """
    try:
        yield
    except Exception as caught:
        from fastapi import HTTPException

        if isinstance(caught, HTTPException):
            raise
        exc = as_pacs_error(caught)
        status = status_of(exc)
        if status is None:
            raise
        detail = answer_detail(exc, status, what)
        logger.warning("request refused (%d): %s", status, detail)
        raise HTTPException(status_code=status, detail=detail) from caught


def as_pacs_error(exc: BaseException) -> BaseException:
    """``exc``, or the PACS (``--studies``, a DICOMweb URL) not answering as a 503 naming it
    (:func:`~monailabel_xflow.data.pacs.pacs_failure`)."""
    from monailabel.config import settings

    from monailabel_xflow.data.pacs import pacs_failure

    studies = str(settings.MONAI_LABEL_STUDIES or "")
    if not studies.startswith(("http://", "https://")):
        return exc
    return pacs_failure(exc, studies) or exc


async def error_response(request: Any, exc: BaseException) -> Any:
    """The server's exception handler (installed by :mod:`.guard`): documented error types, bad JSON
    in a form field and MONAI Label's input errors -> ``{"detail": ...}`` with their status; anything
    else a logged 500 without internals."""
    import json

    from fastapi.responses import JSONResponse
    from monailabel.interfaces.exception import MONAILabelException

    exc = as_pacs_error(exc)
    status = status_of(exc)
    if status is None and isinstance(exc, (json.JSONDecodeError, MONAILabelException)):
        status = 422
    if status is None:  # registered for a base class but not a documented input error: a bug
        logger.error("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); see the server log"}, status_code=500)
    json_error = isinstance(exc, json.JSONDecodeError)
    detail = f"a form field is not valid JSON ({exc})" if json_error else answer_detail(exc, status)
    logger.warning("request refused (%d): %s", status, detail)
    return JSONResponse({"detail": detail}, status_code=status)
