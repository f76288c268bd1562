"""The one error tree of the package: every error class raised on purpose derives from
:class:`XFlowError`, through one of the bases below, and the base says what it means to a user.
The app answers HTTP by base class (:mod:`monailabel_xflow.app.errors`); the command line exits
with status 2 on any :class:`InputError`.

==========================  ======  ===================================================
base                        HTTP    meaning
==========================  ======  ===================================================
:class:`InputError`         422     input that is readable but wrong: a bad parameter, an
                                    unsupported finding, a click outside the image
:class:`BadRequestError`    400     input that cannot be read at all: a corrupt or
                                    non-image file, a lateral view, an id that could name
                                    a path
:class:`NotFoundError`      404     an id that names nothing
:class:`TooLargeError`      413     a body or parameter over its documented limit
:class:`ConflictError`      409     a change that conflicts with what a store holds
:class:`NotAllowedError`    405     an operation this store does not offer
:class:`UnavailableError`   503     the models are not configured or cannot be loaded now,
                                    or the PACS does not answer (:class:`PACSUnavailableError`)
:class:`StorageFullError`   507     no space left on the server's disk; nothing changed
==========================  ======  ===================================================

A plain :class:`XFlowError` (neither input nor availability) is a failure of the package itself.
Input errors are also ``ValueError``s and availability errors ``RuntimeError``s, so code that
catches the built-in types keeps working.
"""

from __future__ import annotations


class XFlowError(Exception):
    """Base of every error the package raises on purpose."""


class InputError(XFlowError, ValueError):
    """Readable but wrong input (HTTP 422)."""


class BadRequestError(InputError):
    """Input that cannot be read or must not be read (HTTP 400)."""


class NotFoundError(InputError, LookupError):
    """An id that names nothing (HTTP 404)."""


class TooLargeError(InputError):
    """A body or parameter over its documented size limit (HTTP 413)."""


class ConflictError(InputError):
    """A change that conflicts with what a store holds, e.g. new pixels under labelled ones (HTTP 409)."""


class NotAllowedError(InputError):
    """An operation a store does not offer, e.g. adding images to a PACS through the app (HTTP 405)."""


class UnavailableError(XFlowError, RuntimeError):
    """Models not configured or not loadable right now, or the PACS not answering (HTTP 503)."""


class StorageFullError(XFlowError, OSError):
    """No space left on the server's disk for a write; nothing was changed (HTTP 507)."""


HTTP_STATUS: dict[type[XFlowError], int] = {
    BadRequestError: 400,
    NotFoundError: 404,
    TooLargeError: 413,
    ConflictError: 409,
    NotAllowedError: 405,
    InputError: 422,
    UnavailableError: 503,
    StorageFullError: 507,
}
"""HTTP status of each base; an error takes the status of the first base in its MRO listed here."""


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of an error of the tree, or None (not an error the package documents)."""
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return None


class RequestError(InputError):
    """A request parameter of the wrong type or outside its range."""


class UnsafeIdError(BadRequestError, RequestError):
    """An id that is not a plain name (could name a path); see :func:`monailabel_xflow.parameters.check_id`."""


class RequestTooLargeError(TooLargeError, RequestError):
    """A request body or parameter over its documented size limit."""


class ImageNotFoundError(NotFoundError):
    """An image id the datastore does not hold (or a file that is gone)."""


class SessionNotFoundError(NotFoundError):
    """A session id the server does not hold (never created, removed, or expired)."""


class UploadError(BadRequestError):
    """An uploaded file whose name or content is not accepted
    (:func:`monailabel_xflow.transforms.uploads.store_upload`)."""


class ModelsNotConfiguredError(UnavailableError):
    """No weights are configured for a served model; the message says how to configure them."""


class ModelUnavailableError(UnavailableError):
    """Loading a served model failed recently; its runtime waits before it tries again
    (:class:`monailabel_xflow.workflow.runtime.LazyModel`)."""


class PACSUnavailableError(UnavailableError):
    """The DICOMweb PACS did not answer (stopped, unreachable, or an error of its own); the
    message names the PACS's URL (HTTP 503)."""
