"""MONAI Label's request as the XFlow app receives it: the server's bounds (body size and time,
sessions, request threads) and the keys a client may not set.

MONAI Label copies a client's ``params`` over the request and the task's config, so ``params``
could otherwise name the request's files. Values are parsed by :mod:`monailabel_xflow.parameters`,
the tasks' options by :mod:`monailabel_xflow.task_options`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from monailabel_xflow.errors import RequestError
from monailabel_xflow.parameters import (
    MAX_PARAM_KEYS,
    as_bool,
    as_int,
    is_label_name,
    parse_json_object,
)
from monailabel_xflow.task_options import LABEL_NAME_KEY
from monailabel_xflow.vocabulary import FINDINGS


def max_body_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The request body limit: ``XFLOW_MAX_BODY_MB`` (MiB, 1..4096) or 256 MiB."""
    env = os.environ if environ is None else environ
    text = env.get("XFLOW_MAX_BODY_MB", "").strip()
    mib = as_int(text, "XFLOW_MAX_BODY_MB", 1, 4096, default=256)  # "" gives the default
    return int(mib) * 1024 * 1024


@dataclass(frozen=True)
class ServerLimits:
    """The server's bounds, from ``--conf`` keys (:func:`server_limits`).

    Attributes:
        max_body: request body limit in bytes (``XFLOW_MAX_BODY_MB``, see :func:`max_body_bytes`).
        body_timeout_s: seconds a client has to send a request's whole body, from the request's
            start (``--conf body_timeout_s``, 1..3600, default 120): a slower body is answered 408
            and its connection closed.
        max_sessions: live sessions at most (``--conf max_sessions``, 1..10000, default 64): one
            more is refused (429) until one is removed or expires.
        request_threads: requests served at once in worker threads, off the event loop
            (``--conf request_threads``, 1..64, default 8); more wait their turn.
    """

    max_body: int = 256 * 1024 * 1024
    body_timeout_s: float = 120.0
    max_sessions: int = 64
    request_threads: int = 8


def server_limits(conf: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> ServerLimits:
    """The :class:`ServerLimits` of ``--conf`` (and ``XFLOW_MAX_BODY_MB``).

    Raises:
        RequestError: a value of the wrong type or out of range (the message names the key).
    """
    conf = conf or {}
    return ServerLimits(
        max_body=max_body_bytes(environ),
        body_timeout_s=float(as_int(conf.get("body_timeout_s"), "--conf body_timeout_s", 1, 3600, 120)),
        max_sessions=as_int(conf.get("max_sessions"), "--conf max_sessions", 1, 10_000, 64),
        request_threads=as_int(conf.get("request_threads"), "--conf request_threads", 1, 64, 8),
    )


RESERVED_PARAMS = frozenset(
    {"image", "image_id", "label", "file", "session", "session_id", "model", "save_label", "label_tag", "result_dir"}
)
"""Keys a client may not set in an infer request's ``params`` (they would name files or
redirect where results are written). ``image``/``label`` come from the URL id and uploads."""


def parse_params(text: str | bytes | None) -> dict[str, Any]:
    """The ``params`` form field of an infer request: a bounded JSON object
    (:func:`~monailabel_xflow.parameters.parse_json_object`) with none of :data:`RESERVED_PARAMS`.

    Raises:
        RequestTooLargeError: over :data:`~monailabel_xflow.parameters.MAX_PARAMS_BYTES` (413).
        RequestError: not a JSON object, too many keys, or a reserved key (422).
    """
    params = parse_json_object(text, "params")
    check_params(params)
    return params


def check_params(params: Mapping[str, Any]) -> None:
    """Refuse reserved or too many keys in client params (see :func:`parse_params`).

    ``label`` may be set only to a declared label *name* (3D Slicer sends the selected segment's
    name there), never a path.
    """
    if len(params) > MAX_PARAM_KEYS:
        raise RequestError(f"params holds {len(params)} keys; at most {MAX_PARAM_KEYS}")
    reserved = sorted(
        k
        for k in params
        if (k in RESERVED_PARAMS or str(k).startswith("_")) and not (k == "label" and is_label_name(params[k]))
    )
    if reserved:
        raise RequestError(
            f"params may not set {', '.join(map(repr, reserved))}: the image is the `image` id "
            "of the URL (or an uploaded file), a previous label an uploaded `label` file; "
            "labels are saved with PUT /datastore/label"
            + (
                f"; `label` may only name a finding's segment (one of {', '.join(FINDINGS)})"
                if "label" in reserved
                else ""
            )
        )


def take_label_name(request: dict[str, Any]) -> None:
    """Move a ``label`` that names a declared label to ``label_name`` (in place): MONAI Label copies
    Slicer's ``{"label": "effusion"}`` where an upload's path would be; after this, ``label`` is an
    upload path or absent."""
    if is_label_name(request.get("label")):
        request[LABEL_NAME_KEY] = request.pop("label")


def store_seg_default(conf: Mapping[str, Any] | None) -> bool:
    """The server-wide default of the ``store_seg`` option (``--conf store_seg``; false when unset).

    Raises:
        RequestError: a value that is not a boolean (the message names ``--conf store_seg``).
    """
    return as_bool((conf or {}).get("store_seg", False), "--conf store_seg")
