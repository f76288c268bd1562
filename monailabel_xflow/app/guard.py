"""The XFlow app's guard around MONAI Label 0.8.5's web server, installed by :func:`install`.

MONAI Label has no hook for request validation: its infer route copies the client's ``params``
over the request (so ``{"image": "/any/path"}`` would read any file), it has no body limit, and
anything unexpected is a bare 500. Here, in the server process:

* :class:`~monailabel_xflow.serving.asgi.GuardMiddleware`, every request: the body limit (413),
  id-valued query parameters and the session segment checked (400), MONAI Label's closed routes
  (:func:`refusal`), no absolute paths in JSON answers, ``X-Content-Type-Options: nosniff``;
* ``POST /infer/{model}`` (:func:`guarded_run_inference`): ``params`` may not set reserved keys,
  the image is an id, an upload or a live session's; only there may an image be a server path
  (:func:`~monailabel_xflow.serving.uploads.upload_paths_allowed`);
* uploads (:func:`~monailabel_xflow.serving.uploads.receive_upload`): the content decides the type and
  stored suffix, never the client's file name; the temporary file is removed whatever happens;
* train / scoring / batch infer: validated before MONAI Label starts a subprocess
  (:func:`~monailabel_xflow.task_options.validate_task_request`, 422 now, not a log line later), bounded queues
  (:func:`guarded_async_run`), a stop cancels what is queued (:func:`guarded_stop`);
* errors of the package's tree, malformed JSON fields and MONAI Label's own errors are 4xx.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from typing import Any

from monailabel_xflow.app.errors import (
    RequestError,
    SessionNotFoundError,
    error_response,
    http_errors,
)
from monailabel_xflow.app.requests import parse_params
from monailabel_xflow.app.wraps import install as install_patches
from monailabel_xflow.parameters import (
    MAX_PARAMS_BYTES,
    as_int,
    check_checksum,
    check_id,
    client_info,
    parse_json_object,
)
from monailabel_xflow.serving.asgi import GuardMiddleware
from monailabel_xflow.serving.limits import ServerLimits, server_limits
from monailabel_xflow.serving.patching import upstream
from monailabel_xflow.serving.routes import cancel_queued, closed_route, in_event_loop, queue_answer
from monailabel_xflow.serving.uploads import (
    allowing_upload_paths,
    check_session_uploads,
    check_upload_name,
    receiving,
    remove_files,
    upload_paths_allowed,  # noqa: F401  (app/xflow_app.py reads it here)
)
from monailabel_xflow.task_options import validate_task_request
from monailabel_xflow.transforms.loading import IMAGE_FORMATS, LABEL_FORMATS

logger = logging.getLogger(__name__)

LAYER = "guard"
"""The guard's name in :mod:`.wraps` (its markers)."""


def _upload_stem(filename: str) -> str:
    """The image id upstream derives from an upload's name: the base name without its suffixes."""
    from monailabel.utils.others.generic import file_ext

    base = os.path.basename(filename or "")
    ext = file_ext(base)
    return base[: -len(ext)] if ext else base


def _open_session(session_id: str) -> Any:
    """The live session ``session_id``; an unknown, removed or expired one is a 404 saying so."""
    from monailabel.interfaces.utils.app import app_instance

    check_id(session_id, "session")
    sessions = app_instance().sessions()
    session = sessions.get_session(session_id, update_ts=False) if sessions is not None else None
    if session is not None and session.expiry and session.last_access_ts + session.expiry < time.time():
        with contextlib.suppress(Exception):
            sessions.remove_session(session_id)
        session = None
    if session is None:
        raise SessionNotFoundError(f"unknown or expired session {session_id!r}: create one with PUT /session/")
    sessions.get_session(session_id, update_ts=True)
    return session


def guarded_run_inference(
    background_tasks, model, image="", session_id="", params="{}", file=None, label=None, output=None
):
    """MONAI Label's ``run_inference`` with the checks of the module docstring: uploads through
    :func:`~monailabel_xflow.serving.uploads.receiving` (removed whatever happens), sessions
    checked, ``output=dicom_seg`` refused (the ``store_seg`` option stores results as DICOM SEG)."""
    from monailabel.endpoints import infer as endpoint
    from monailabel.interfaces.utils.app import app_instance

    with receiving() as receive, http_errors("infer"):
        p = parse_params(params)
        if str(getattr(output, "value", output) or "") == "dicom_seg":
            raise RequestError(
                "output=dicom_seg is not served (it needs dcmqi and a DICOM series on the "
                "server); ask output=image, json or all, or set store_seg to store the result "
                "as a DICOM SEG in the PACS"
            )
        session = _open_session(session_id) if session_id else None
        if session is None and not file:
            if not image:
                raise RequestError("give an image id (`?image=ID`), upload a `file`, or give a `session_id`")
            check_id(image, "image")
        request = {"model": model, "image": image}
        if file is not None:
            request["image"] = receive(file, "image", IMAGE_FORMATS)
        if label is not None:
            request["label"] = receive(label, "label", LABEL_FORMATS)
        instance = app_instance()
        request.update(instance.info().get("config", {}).get("infer", {}))
        request.update(p)
        if session is not None:
            request["image"] = session.image
            request["session"] = session.to_json()
        logger.info("Infer Request: %s", request)  # as upstream logs it (the log is closed to clients)
        with allowing_upload_paths():
            result = instance.infer(request)
        return endpoint.send_response(instance.datastore(), result, output, background_tasks)


def guarded_add_image(background_tasks, image=None, params="{}", file=None, user=None):
    """``PUT /datastore/image``: the id is ``image`` or the upload's name without suffixes (a plain
    id either way); the file goes through :func:`~monailabel_xflow.serving.uploads.receive_upload` and
    is stored under the suffix its content shows."""
    from monailabel.interfaces.utils.app import app_instance

    with receiving() as receive, http_errors("add image"):
        save_params = client_info(params, "params", MAX_PARAMS_BYTES, user)
        image_id = check_id(image or _upload_stem(check_upload_name(file, "image")), "image")
        uploaded = receive(file, "image", IMAGE_FORMATS)
        return {"image": app_instance().datastore().add_image(image_id, uploaded, save_params)}


def guarded_save_label(background_tasks, image, params="{}", tag="final", label=None, user=None):
    """``PUT /datastore/label`` through :func:`~monailabel_xflow.serving.uploads.receive_upload` (stored
    under its content's suffix)."""
    from monailabel.interfaces.utils.app import app_instance

    with receiving() as receive, http_errors("save label"):
        save_params = parse_json_object(params, "params")
        tag = check_id(tag or "final", "label tag")
        check_id(image, "image")
        uploaded = receive(label, "label", LABEL_FORMATS)
        instance = app_instance()
        label_id = instance.datastore().save_label(image, uploaded, tag, save_params)
        res = instance.on_save_label(image, label_id) or {}
        res.update({"image": image, "label": label_id})
        return res


def guarded_update_image_info(image, info="{}", user=None):
    from monailabel.interfaces.utils.app import app_instance

    with http_errors("image info"):
        check_id(image, "image")
        return app_instance().datastore().update_image_info(image, client_info(info, user=user))


def guarded_update_label_info(label, tag, info="{}", user=None):
    from monailabel.interfaces.utils.app import app_instance

    with http_errors("label info"):
        check_id(label, "label")
        check_id(tag, "label tag")
        return app_instance().datastore().update_label_info(label, tag, client_info(info, user=user))


def guarded_download_image(image, check_only=False, check_sum=None):
    """``GET``/``HEAD /datastore/image`` with the checksum's algorithm checked (upstream: a 500)."""
    from monailabel.endpoints import datastore as endpoint

    with http_errors("image"):
        check_id(image, "image")
        if check_sum:
            check_checksum(check_sum)
    return upstream(endpoint, "download_image", LAYER)(image, check_only, check_sum)


def guarded_download_dataset(limit_cases=None):
    """``GET /datastore/dataset``: a 404 naming why when no image has a final label (upstream: a
    500); the ZIP archive is removed once sent (upstream leaves it in the temporary folder)."""
    from fastapi.responses import FileResponse
    from monailabel.interfaces.utils.app import app_instance
    from starlette.background import BackgroundTask

    from monailabel_xflow.app.errors import ImageNotFoundError

    with http_errors("dataset"):
        as_int(limit_cases, "limit_cases", 1, 1_000_000)
        store = app_instance().datastore()
        if not store.datalist():
            raise ImageNotFoundError("no image has a final label yet: nothing to put in a dataset archive")
        path = store.get_dataset_archive(limit_cases)
    return FileResponse(
        path, media_type="application/zip", filename="dataset.zip", background=BackgroundTask(remove_files, [path])
    )


def guarded_sample(strategy, params=None, user=None):
    """``POST /activelearning/{strategy}`` with the parameters bounded (a JSON object) and the
    strategy bookkeeping of upstream kept out of the client-writable image info's way."""
    from monailabel.endpoints import activelearning as endpoint

    with http_errors("activelearning"):
        if params is not None and not isinstance(params, dict):
            raise RequestError("active learning parameters must be a JSON object")
        if params and "client_id" in params:
            from monailabel_xflow.parameters import as_text

            as_text(params["client_id"], "client_id", 256)
    return upstream(endpoint, "sample", LAYER)(strategy, params, user)


def guarded_create_session(background_tasks, uncompress=False, expiry=0, files=()):
    """MONAI Label's ``create_session`` for plain uploads only
    (:func:`~monailabel_xflow.serving.uploads.check_session_uploads`: no archives, bounded, plain
    file names, as upstream joins the client's name to its folder), at most ``--conf max_sessions``
    live sessions (429 beyond)."""
    from monailabel.endpoints import session as endpoint

    with http_errors("session"):
        check_session_uploads(files, uncompress, expiry)
    with _SESSION_LOCK:  # counted and created as one step: concurrent requests cannot overshoot
        _check_session_room()
        return upstream(endpoint, "create_session", LAYER)(background_tasks, uncompress, expiry, files)


def _check_session_room() -> None:
    """Refuse (429) a new session when ``--conf max_sessions`` are live (expired ones removed first)."""
    from fastapi import HTTPException
    from monailabel.interfaces.utils.app import app_instance

    sessions = app_instance().sessions()
    if sessions is None:
        return
    sessions.remove_expired()
    store = sessions.store_path
    live = sum(1 for n in os.listdir(store) if os.path.isdir(os.path.join(store, n))) if os.path.isdir(store) else 0
    limit = (_LIMITS or ServerLimits()).max_sessions
    if live >= limit:
        logger.warning("request refused (429): %d live sessions, at most %d", live, limit)
        raise HTTPException(
            429,
            f"{live} sessions are live; at most {limit} (--conf max_sessions): remove one "
            "(DELETE /session/{id}) or wait until one expires",
        )


_SESSION_LOCK = threading.Lock()


_TASK_LOCK = threading.Lock()


def _pending(method: str) -> list[dict]:
    from monailabel.utils.async_tasks.utils import tasks

    return [t for t in tasks(method) if t.get("status") in ("SUBMITTED", "RUNNING")]


def guarded_async_run(method, request=None, params=None, force_sync=False, enqueue=False):
    """``AsyncTask.run`` after :func:`validate_task_request` on the merged request, with bounded
    queues (:func:`~monailabel_xflow.serving.routes.queue_answer`): at most one train and one batch
    infer running or queued (a second is refused: 429 naming the task); a scoring request while one
    is already queued joins it (returns that task) instead of queueing another run. The converted
    values go to MONAI Label in place of the client's
    (:func:`~monailabel_xflow.task_options.batch_infer_params`: on a server without CUDA a batch
    infer runs on the CPU; its label tag is plain text, ``original`` unless given).
    ``run_sync=true`` work runs in a worker thread of :class:`GuardMiddleware`, never in the
    event loop."""
    from monailabel.utils.async_tasks.task import AsyncTask

    merged = {**(request or {}), **(params if isinstance(params, dict) else {})}
    with http_errors(method):
        if params is not None and not isinstance(params, dict):
            raise RequestError(f"{method} parameters must be a JSON object")
        named, routed = merged.get("model"), (request or {}).get("model")
        if routed is not None and named != routed:  # the body's would win, and fail in the subprocess
            raise RequestError(f"the body names model {named!r} and the URL {routed!r}; leave it out")
        converted = validate_task_request(method, merged)
    # MONAI Label reads the converted values (upstream's default tag is an Enum whose str() names
    # a folder "DefaultLabelTag.ORIGINAL"; on a server without CUDA batch infer runs on the CPU)
    params = {**(params or {}), **converted}
    with _TASK_LOCK:
        answer = queue_answer(method, _pending(method), force_sync)
        if answer is not None:
            if answer[0] is not None:
                logger.info("%s request joins the queued %s task %s", method, method, answer[0]["id"])
            return answer
        return upstream(AsyncTask, "run", LAYER)(method, request, params, force_sync, enqueue)


def guarded_stop(method):
    """``AsyncTask.stop`` that also cancels what is queued: every submitted task of ``method`` is
    marked STOPPED and never starts (:func:`_skipping_stopped`)."""
    from monailabel.utils.async_tasks.task import AsyncTask

    with _TASK_LOCK:
        cancel_queued(_pending(method))
        return upstream(AsyncTask, "stop", LAYER)(method)


def _skipping_stopped(upstream):
    def task_func(task, method, callback=None):
        if task.get("status") == "STOPPED":  # cancelled while queued
            logger.info("%s task %s was stopped before it started", method, task.get("id"))
            return None
        return upstream(task, method, callback)

    return task_func


# --- the server's closed routes (the ASGI guard: monailabel_xflow.serving.asgi) -----------------


def _auth_enabled() -> bool:
    from monailabel.config import settings

    return bool(settings.MONAI_LABEL_AUTH_ENABLE)


def _dicomweb_studies() -> bool:
    from monailabel.config import settings

    return str(settings.MONAI_LABEL_STUDIES or "").startswith(("http://", "https://"))


def refusal(method: str, path: str, query: bytes = b"") -> tuple[int, str] | None:
    """``(status, detail)`` when MONAI Label's route is closed or its session id unsafe, else None
    (:func:`~monailabel_xflow.serving.routes.closed_route` with MONAI Label's settings;
    :class:`~monailabel_xflow.serving.asgi.GuardMiddleware` checks paths and query ids itself)."""
    return closed_route(method, path, _auth_enabled, _dicomweb_studies)


_LIMITS: ServerLimits | None = None


def install(fastapi_app: Any = None, conf: Any = None) -> bool:
    """Install the guard in this process's MONAI Label server (idempotent); returns whether it is
    installed. ``fastapi_app`` defaults to ``monailabel.app.app`` when that module is loaded (the
    server); in other processes (train subprocess, CLI) nothing is installed. ``conf`` (the app's
    ``--conf``) sets the bounds (:func:`~monailabel_xflow.serving.limits.server_limits`).

    Raises:
        RequestError: a ``--conf`` bound that is not valid (the server does not start with it).
    """
    import sys

    global _LIMITS

    if fastapi_app is None:
        module = sys.modules.get("monailabel.app")
        if module is None:
            return False
        fastapi_app = module.app
    from monailabel.utils.async_tasks import utils as task_utils

    # the routes look these up at call time; every target is listed in app/wraps.py
    ds, tasks = "monailabel.endpoints.datastore", "monailabel.utils.async_tasks"
    install_patches(
        LAYER,
        {
            "monailabel.endpoints.infer.run_inference": guarded_run_inference,
            "monailabel.endpoints.session.create_session": guarded_create_session,
            f"{ds}.download_image": guarded_download_image,
            f"{ds}.add_image": guarded_add_image,
            f"{ds}.save_label": guarded_save_label,
            f"{ds}.update_image_info": guarded_update_image_info,
            f"{ds}.update_label_info": guarded_update_label_info,
            f"{ds}.download_dataset": guarded_download_dataset,
            "monailabel.endpoints.activelearning.sample": guarded_sample,
            f"{tasks}.utils._task_func": _skipping_stopped(task_utils._task_func),
            f"{tasks}.task.AsyncTask.run": guarded_async_run,
            f"{tasks}.task.AsyncTask.stop": guarded_stop,
        },
    )
    if getattr(fastapi_app.state, "xflow_guard", False):
        return True
    _LIMITS = server_limits(conf)
    from monailabel.interfaces.exception import MONAILabelException
    from starlette.middleware import Middleware

    from monailabel_xflow.errors import XFlowError

    # the package's error tree, bad JSON in a form field and MONAI Label's own errors; any other
    # exception stays a logged 500
    # OSError: a full disk is 507, the PACS not answering (requests' errors are OSErrors) 503
    for cls in (XFlowError, json.JSONDecodeError, MONAILabelException, OSError):
        fastapi_app.add_exception_handler(cls, error_response)
    fastapi_app.user_middleware.insert(
        0,
        Middleware(
            GuardMiddleware,
            max_body=_LIMITS.max_body,
            refuse=refusal,
            body_timeout_s=_LIMITS.body_timeout_s,
            request_threads=_LIMITS.request_threads,
            inline=in_event_loop,
        ),
    )
    fastapi_app.middleware_stack = fastapi_app.build_middleware_stack()  # already built at start-up
    fastapi_app.state.xflow_guard = True
    logger.info(
        "XFlow guard installed: body limit %d bytes in %g s, %d sessions, %d request threads; ids checked, "
        "infer params confined",
        _LIMITS.max_body,
        _LIMITS.body_timeout_s,
        _LIMITS.max_sessions,
        _LIMITS.request_threads,
    )
    return True
