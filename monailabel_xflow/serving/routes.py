"""The XFlow server's REST API (MONAI Label's routes, which 3D Slicer and OHIF call), as policy
that needs no web framework: the routes it closes (:func:`closed_route`), the status reads it
answers in the event loop itself (:func:`in_event_loop`), and its bounded background-task queues
(:func:`queue_answer`, :func:`cancel_queued`). The MONAI Label app's guard applies them
(:mod:`monailabel_xflow.app.guard`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from monailabel_xflow.errors import UnsafeIdError
from monailabel_xflow.parameters import check_id


def closed_route(
    method: str, path: str, auth_enabled: Callable[[], bool], dicomweb: Callable[[], bool]
) -> tuple[int, str] | None:
    """``(status, detail)`` when the route is closed or its session id unsafe, else None: model
    files are not replaced over HTTP (405), no whole-slide inference (404), the server log only
    behind authentication (403 unless ``auth_enabled()``), the DICOMweb proxy only for a DICOMweb
    datastore (404 unless ``dicomweb()``), no all-models train route (405), a session id a plain
    id (400)."""
    segments = path.split("/")
    if segments[1:2] == ["model"] and method in ("PUT", "DELETE", "POST"):
        return (
            405,
            "model files are not replaced over HTTP: the xflow train task and the models configuration change them",
        )
    if segments[1:3] in (["infer", "wsi"], ["infer", "wsi_v2"]):
        return 404, "whole-slide inference is not served by the XFlow app"
    if segments[1:2] == ["logs"] and not auth_enabled():
        return 403, (
            "the server log is served only behind MONAI Label's authentication "
            "(MONAI_LABEL_AUTH_ENABLE=true, admin role); read it on the server host"
        )
    if segments[1:2] == ["proxy"] and not dicomweb():
        return 404, "the DICOMweb proxy serves a DICOMweb datastore only; this server's studies are a folder"
    if segments[1:] in (["train"], ["train", ""]) and method == "POST":
        return 405, "the all-models train route is deprecated: POST /train/xflow"
    if segments[1:2] == ["session"] and len(segments) > 2 and segments[2]:
        try:
            check_id(segments[2], "session")
        except UnsafeIdError as exc:
            return 400, str(exc)
    return None


LIGHT_ROUTES = frozenset({"/", "/info", "/info/", "/train", "/train/", "/scoring", "/scoring/", "/batch/infer"})
"""``GET``/``HEAD`` routes answered in the event loop itself (status reads): everything else runs in
a worker thread, so no request, ``run_sync`` task or PACS download stops the others."""


def in_event_loop(method: str, path: str) -> bool:
    """Whether a request is answered in the event loop (:data:`LIGHT_ROUTES`) rather than in a worker."""
    return method in ("GET", "HEAD") and path in LIGHT_ROUTES


ONE_AT_A_TIME = ("train", "batch_infer")
"""Background tasks of which at most one is running or queued: a second request is refused (429)."""


def queue_answer(
    method: str, pending: Sequence[dict[str, Any]], force_sync: bool = False
) -> tuple[dict[str, Any] | None, str | None] | None:
    """The answer to a request for the background task ``method`` given its ``pending`` tasks
    (``{"id", "status"}``, status ``SUBMITTED`` or ``RUNNING``), or None to start it: ``(None,
    refusal)`` when one of :data:`ONE_AT_A_TIME` is already running or queued; ``(task, None)``,
    the queued scoring task a scoring request joins. A synchronous run is never queued."""
    if force_sync:
        return None
    if method in ONE_AT_A_TIME and pending:
        task = pending[0]
        return None, (
            f"a {method} task ({task['id']}, {task['status'].lower()}) is already running or queued; "
            f"wait for it or stop it (DELETE {'/train/' if method == 'train' else '/batch/infer'})"
        )
    queued = [t for t in pending if t.get("status") == "SUBMITTED"]
    if method == "scoring" and queued:
        return queued[0], None
    return None


def cancel_queued(pending: Sequence[dict[str, Any]]) -> None:
    """Mark every submitted (not yet running) task of ``pending`` ``STOPPED`` now, in place."""
    for task in pending:
        if task.get("status") == "SUBMITTED":
            task["status"] = "STOPPED"
            task["end_ts"] = time.strftime("%Y-%m-%d %H:%M:%S")
