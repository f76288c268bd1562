"""The one place where XFlow's error types become HTTP answers of the MONAI Label server.

MONAI Label 0.8.5 installs no exception handler: anything a task raises becomes a bare
``500 Internal Server Error`` without a message. Our tasks and datastores therefore run their
work inside :func:`http_errors`, which re-raises the documented error types as
:class:`fastapi.HTTPException` with the error's message as ``detail`` (JSON ``{"detail": ...}``):

=====================================  ======  ============================================
error                                  status  meaning
=====================================  ======  ============================================
:class:`ImageNotFoundError`, MONAI      404     unknown image id
Label's ``ImageNotFoundException``
``CXRLoadError`` (transforms)          400     not a loadable frontal radiograph (corrupt,
                                               non-image, multi-slice, lateral view ...)
``InstructionError`` (instructions)    422     empty, over-long or unsupported instruction
``GeometryError`` (geometry)           422     clicks outside the image, bad indices
``XFlowError`` (workflow)              422     bad workflow input (mask size, nothing to revise)
:class:`UnsafeIdError`                 400     an id that could name a path (separators,
                                               ``..``, NUL, over-long); one message whatever
                                               exists
:class:`RequestTooLargeError`          413     a body or ``params`` over the documented limit
:class:`RequestError`                  422     a bad request parameter (type, range, work)
:class:`LabelError`                    422     a label of the wrong size or with values
                                               outside 0..7
:class:`ModelsNotConfiguredError`      503     no XFlow weights configured (says how)
``ModelConfigError`` (models)          503     the configured weights cannot be loaded
:class:`ModelUnavailableError`         503     the last load failed; retried after a back-off
                                               (the message gives the reason and when)
=====================================  ======  ============================================

Anything else propagates unchanged (a 500: a bug, not bad input). The error types of other
modules are looked up lazily so that importing this module stays light.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Iterator

logger = logging.getLogger(__name__)


class RequestError(ValueError):
    """A request parameter of the wrong type or outside its range."""


class UnsafeIdError(RequestError):
    """An id that is not a plain name (could name a path); see :func:`.requests.check_id`."""


class RequestTooLargeError(RequestError):
    """A request body or parameter over its documented size limit."""


class LabelError(ValueError):
    """A label file that does not fit its image (size) or the vocabulary (values 0..7)."""


class ImageNotFoundError(LookupError):
    """An image id the datastore does not hold."""


class ModelsNotConfiguredError(RuntimeError):
    """The app was started without XFlow weights; the message says how to configure them."""


class ModelUnavailableError(RuntimeError):
    """Loading the models failed recently; the runtime waits before it tries again."""


# (module, class name, HTTP status); modules are imported on first use only. First match wins.
_TABLE: tuple[tuple[str, str, int], ...] = (
    (__name__, "ImageNotFoundError", 404),
    ("monailabel.interfaces.exception", "ImageNotFoundException", 404),
    ("monailabel_xflow.transforms.loading", "CXRLoadError", 400),
    ("monailabel_xflow.instructions", "InstructionError", 422),
    ("monailabel_xflow.geometry", "GeometryError", 422),
    ("monailabel_xflow.workflow.xflow", "XFlowError", 422),
    (__name__, "UnsafeIdError", 400),
    (__name__, "RequestTooLargeError", 413),
    (__name__, "RequestError", 422),
    (__name__, "LabelError", 422),
    (__name__, "ModelsNotConfiguredError", 503),
    (__name__, "ModelUnavailableError", 503),
    ("monailabel_xflow.workflow.model_config", "ModelConfigError", 503),
)


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception maps to, or None when it is not a documented input error."""
    for module, name, status in _TABLE:
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):  # a module not written yet: nothing to map
            continue
        if isinstance(exc, cls):
            return status
    return None


def _message(exc: BaseException) -> str:
    msg = getattr(exc, "msg", None)  # MONAILabelException keeps its text in .msg
    return str(msg if isinstance(msg, str) else exc)


@contextlib.contextmanager
def http_errors(what: str = "") -> Iterator[None]:
    """Run a block and turn the documented error types into ``HTTPException(status, detail)``.

    Args:
        what: a short prefix for the message (e.g. ``"xflow"``), naming the task that failed.
    """
    try:
        yield
    except Exception as exc:
        from fastapi import HTTPException

        if isinstance(exc, HTTPException):
            raise
        status = status_of(exc)
        if status is None:
            raise
        detail = f"{what}: {_message(exc)}" if what else _message(exc)
        logger.warning("request refused (%d): %s", status, detail)
        raise HTTPException(status_code=status, detail=detail) from exc
