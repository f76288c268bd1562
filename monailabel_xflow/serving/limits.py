"""The server's bounds, whatever web framework serves XFlow: the request body's size and time,
live sessions and request threads, each from a ``--conf`` key (or, for the body size, the
environment), parsed and bounded by :mod:`monailabel_xflow.parameters`.

:class:`~monailabel_xflow.serving.asgi.GuardMiddleware` enforces the body's size and time and the
threads; the MONAI Label app's guard (:mod:`monailabel_xflow.app.guard`) counts the sessions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from monailabel_xflow.parameters import as_int


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
