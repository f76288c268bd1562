"""The XFlow app's guard around MONAI Label 0.8.5's web server.

MONAI Label has no hook for request validation: its infer route copies the client's ``params``
over the request (so ``{"image": "/any/path"}`` used to read any file the server can read), it
has no body limit, and anything unexpected is a bare 500. The app calls :func:`install` when it
starts; from then on, in the server process:

* **every request** passes :class:`GuardMiddleware`: bodies over
  :func:`~monailabel_xflow.app.requests.max_body_bytes` are refused (413, from the declared
  length before anything is read, else when the count passes the limit); the id-valued query
  parameters ``image``, ``id``, ``label``, ``tag``, ``session_id`` and the session path segment
  must be plain ids (:func:`~monailabel_xflow.app.requests.check_id`, one 400 whatever
  exists); routes that would replace model files or serve whole-slide images (``PUT/DELETE
  /model/...``, ``/infer/wsi...``) answer 405/404 (weights change through the train task);
* **infer requests** (``POST /infer/{model}``) go through :func:`guarded_run_inference`: the
  ``params`` JSON is parsed with its limits and may not set ``image``, ``label``, ``session``,
  ``save_label``, ``label_tag`` ... (:data:`~monailabel_xflow.app.requests.RESERVED_PARAMS`);
  the image is the ``image`` id, an uploaded ``file`` or a session's image. Only inside this
  route does :func:`~monailabel_xflow.app.xflow_app.checked_infer` accept the server's own upload
  and session paths (:func:`upload_paths_allowed`); everywhere else an image is a datastore id;
* **sessions** (``PUT /session/``) take plain uploads only (:func:`guarded_create_session`);
* **train, scoring and batch-infer requests** are validated (:func:`validate_task_request`)
  before MONAI Label starts their subprocess, so a bad value is a 422 now, not a log line later;
* **errors** of the documented types (:mod:`.errors`), malformed JSON form fields and MONAI
  Label's own input errors become 4xx with a ``detail`` instead of a bare 500.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from typing import Any, Iterator
from urllib.parse import parse_qsl

from monailabel_xflow.app.errors import RequestError, UnsafeIdError, http_errors, status_of
from monailabel_xflow.app.requests import as_int, check_id, max_body_bytes, parse_params

logger = logging.getLogger(__name__)

ID_QUERY_KEYS = ("image", "id", "label", "tag", "session_id")
MAX_UPLOAD_NAME_CHARS = 255
_UPLOADS = contextvars.ContextVar("xflow_upload_paths_allowed", default=False)


def upload_paths_allowed() -> bool:
    """True inside :func:`guarded_run_inference`, whose ``image``/``label`` paths are the server's
    own temporary uploads or session files (client params cannot set them there)."""
    return _UPLOADS.get()


@contextlib.contextmanager
def _allow_uploads() -> Iterator[None]:
    token = _UPLOADS.set(True)
    try:
        yield
    finally:
        _UPLOADS.reset(token)


def _check_upload_name(upload: Any, field: str) -> None:
    name = getattr(upload, "filename", None) or ""
    if len(name) > MAX_UPLOAD_NAME_CHARS or "\x00" in name:
        raise RequestError(f"uploaded {field} file name is over {MAX_UPLOAD_NAME_CHARS} characters or holds NUL")


def guarded_run_inference(background_tasks, model, image="", session_id="", params="{}", file=None, label=None,
                          output=None):
    """MONAI Label's ``run_inference`` after the checks of the module docstring."""
    from monailabel.endpoints import infer as endpoint

    with http_errors("infer"):
        parse_params(params)
        if session_id:
            check_id(session_id, "session")
        elif not file:
            if not image:
                raise RequestError("give an image id (`?image=ID`), upload a `file`, or give a `session_id`")
            check_id(image, "image")
        for upload, field in ((file, "image"), (label, "label")):
            if upload is not None:
                _check_upload_name(upload, field)
    with _allow_uploads():
        return endpoint._xflow_upstream_run_inference(background_tasks, model, image, session_id, params, file,
                                                      label, output)


MAX_SESSION_FILES = 16


def guarded_create_session(background_tasks, uncompress=False, expiry=0, files=()):
    """MONAI Label's ``create_session`` for plain uploads only: no archives (an archive could
    unpack outside the session folder), at most :data:`MAX_SESSION_FILES` files, each named by
    a plain file name (upstream joins the client's name to its folder)."""
    from monailabel.endpoints import session as endpoint

    with http_errors("session"):
        if uncompress:
            raise RequestError("compressed session uploads are not accepted: upload the image file(s)")
        if len(files) > MAX_SESSION_FILES:
            raise RequestError(f"{len(files)} files in one session; at most {MAX_SESSION_FILES}")
        for upload in files:
            _check_upload_name(upload, "session")
            name = getattr(upload, "filename", "") or ""
            if name:
                check_id(name, "session file name")
        as_int(expiry, "expiry", 0, 7 * 24 * 3600)
    return endpoint._xflow_upstream_create_session(background_tasks, uncompress, expiry, files)


def validate_task_request(method: str, request: dict) -> None:
    """Parse a train / scoring / batch-infer request before MONAI Label starts its subprocess
    (where a bad value would only fail later, in the log).

    Raises:
        RequestError, UnsafeIdError: as the task itself would.
    """
    from monailabel_xflow.app.requests import as_id_list

    if method == "train":
        from monailabel_xflow.app.train import train_params

        train_params(request)
    elif method == "scoring":
        from monailabel_xflow.app.scoring import scoring_params

        scoring_params(request)
    elif method == "batch_infer":
        if not isinstance(request.get("images", "all"), str):
            as_id_list(request.get("images"), "images")
        elif request.get("images", "all") not in ("all", "labeled", "unlabeled"):
            raise RequestError("images must be 'all', 'labeled', 'unlabeled' or a list of image ids")
        if request.get("label_tag"):
            check_id(request.get("label_tag"), "label tag")
        as_int(request.get("max_batch_size"), "max_batch_size", 0, 100_000)
        as_int(request.get("max_workers"), "max_workers", 0, 16)


def guarded_async_run(method, request=None, params=None, force_sync=False, enqueue=False):
    """``AsyncTask.run`` after :func:`validate_task_request` on the merged request."""
    from monailabel.utils.async_tasks.task import AsyncTask

    merged = {**(request or {}), **(params if isinstance(params, dict) else {})}
    with http_errors(method):
        if params is not None and not isinstance(params, dict):
            raise RequestError(f"{method} parameters must be a JSON object")
        validate_task_request(method, merged)
    return AsyncTask._xflow_upstream_run(method, request, params, force_sync, enqueue)


# --- ASGI middleware ----------------------------------------------------------------------------

async def _send_json(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def refusal(method: str, path: str, query: bytes) -> tuple[int, str] | None:
    """``(status, detail)`` when a request is refused before any endpoint runs, else None."""
    segments = path.split("/")
    if any(s == ".." for s in segments) or "\x00" in path:
        return 400, "invalid path"
    if segments[1:2] == ["model"] and method in ("PUT", "DELETE", "POST"):
        return 405, "model files are not replaced over HTTP: the xflow train task and the models configuration change them"
    if segments[1:3] in (["infer", "wsi"], ["infer", "wsi_v2"]):
        return 404, "whole-slide inference is not served by the XFlow app"
    if segments[1:2] == ["session"] and len(segments) > 2 and segments[2]:
        try:
            check_id(segments[2], "session")
        except UnsafeIdError as exc:
            return 400, str(exc)
    try:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, strict_parsing=False)
    except ValueError:
        return 400, "malformed query string"
    for key, value in pairs:
        if key in ID_QUERY_KEYS and value != "":
            what = {"id": "image", "tag": "label tag", "session_id": "session"}.get(key, key)
            try:
                check_id(value, what)
            except UnsafeIdError as exc:
                return 400, str(exc)
    return None


class GuardMiddleware:
    """Pure ASGI middleware: body limit, id checks, refused routes (see module docstring)."""

    def __init__(self, app, max_body: int | None = None):
        self.app = app
        self.max_body = max_body_bytes() if max_body is None else int(max_body)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = refusal(scope.get("method", "GET"), scope.get("path", ""), scope.get("query_string", b""))
        if refused is not None:
            logger.warning("request refused (%d): %s %s: %s", refused[0], scope.get("method"), scope.get("path"),
                           refused[1])
            return await _send_json(send, *refused)
        limit = self.max_body
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return await _send_json(send, 400, "malformed Content-Length")
            if size > limit:
                logger.warning("request refused (413): %s %s of %d bytes", scope.get("method"), scope.get("path"), size)
                return await _send_json(send, 413, f"request body of {size} bytes; at most {limit} bytes are accepted")
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    from fastapi import HTTPException

                    raise HTTPException(413, f"request body over {limit} bytes")
            return message

        return await self.app(scope, limited_receive, send)


# --- exception handlers -------------------------------------------------------------------------

async def _input_error_handler(request, exc):
    """Documented error types, bad JSON in a form field and MONAI Label's input errors -> 4xx."""
    from fastapi.responses import JSONResponse
    from monailabel.interfaces.exception import MONAILabelException

    status = status_of(exc)
    if status is None and isinstance(exc, json.JSONDecodeError):
        status = 422
    if status is None and isinstance(exc, MONAILabelException):
        status = 422
    if status is None:  # registered for a base class but not a documented input error: a bug
        logger.error("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); see the server log"}, status_code=500)
    msg = getattr(exc, "msg", None)
    detail = str(msg if isinstance(msg, str) else exc)
    if isinstance(exc, json.JSONDecodeError):
        detail = f"a form field is not valid JSON ({exc})"
    logger.warning("request refused (%d): %s", status, detail)
    return JSONResponse({"detail": detail}, status_code=status)


def install(fastapi_app: Any = None) -> bool:
    """Install the guard in this process's MONAI Label server (idempotent).

    Args:
        fastapi_app: the FastAPI app; default ``monailabel.app.app`` when that module is loaded
            (the server). In other processes (train subprocess, CLI) nothing is installed.

    Returns:
        Whether the guard is (now) installed.
    """
    import sys

    if fastapi_app is None:
        module = sys.modules.get("monailabel.app")
        if module is None:
            return False
        fastapi_app = module.app
    from monailabel.endpoints import infer as endpoint

    if not hasattr(endpoint, "_xflow_upstream_run_inference"):
        endpoint._xflow_upstream_run_inference = endpoint.run_inference
        endpoint.run_inference = guarded_run_inference  # api_run_inference looks it up at call time
    from monailabel.endpoints import session as session_endpoint
    from monailabel.utils.async_tasks.task import AsyncTask

    if not hasattr(session_endpoint, "_xflow_upstream_create_session"):
        session_endpoint._xflow_upstream_create_session = session_endpoint.create_session
        session_endpoint.create_session = guarded_create_session
    if not hasattr(AsyncTask, "_xflow_upstream_run"):
        AsyncTask._xflow_upstream_run = staticmethod(AsyncTask.run)
        AsyncTask.run = staticmethod(guarded_async_run)
    if getattr(fastapi_app.state, "xflow_guard", False):
        return True
    from monailabel.interfaces.exception import MONAILabelException
    from starlette.middleware import Middleware

    from monailabel_xflow.errors import XFlowError

    # the package's error tree, bad JSON in a form field and MONAI Label's own errors; any other
    # exception stays a logged 500
    for cls in (XFlowError, json.JSONDecodeError, MONAILabelException):
        fastapi_app.add_exception_handler(cls, _input_error_handler)
    fastapi_app.user_middleware.insert(0, Middleware(GuardMiddleware))
    fastapi_app.middleware_stack = fastapi_app.build_middleware_stack()  # already built at start-up
    fastapi_app.state.xflow_guard = True
    logger.info("XFlow guard installed: body limit %d bytes, ids checked, infer params confined", max_body_bytes())
    return True
