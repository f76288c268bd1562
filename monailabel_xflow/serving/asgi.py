"""The ASGI guard around every request of a server: refusals before any endpoint runs, the body
limit, and answers that name no server path and are never sniffed.

:class:`GuardMiddleware` is pure ASGI (any Starlette/FastAPI app): a request the server's
``refuse`` callback names, a path holding ``..`` or NUL, or an id-valued query parameter that is
not a plain id (:func:`path_refusal`, :func:`query_refusal`) is answered ``{"detail": ...}`` with its status before any
endpoint runs; a body over the limit is a 413 (declared or counted); every JSON answer has its
absolute paths cut to base names (:func:`without_paths`), every answer gets
``X-Content-Type-Options: nosniff``. A body slower than ``body_timeout_s`` is a 408; requests not
answered inline run in bounded worker threads, each on an event loop of its own (an ASGI app whose
``async`` endpoints do their work inline would otherwise serve one client at a time).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl

from monailabel_xflow.errors import UnsafeIdError
from monailabel_xflow.parameters import check_id

logger = logging.getLogger(__name__)

Refusal = tuple[int, str]
"""``(status, detail)`` of a request refused before any endpoint runs."""

ID_QUERY_KEYS = ("image", "id", "label", "tag", "session_id")
"""Query parameters whose value is an id (:func:`~monailabel_xflow.parameters.check_id`)."""
_ID_NAMES = {"id": "image", "tag": "label tag", "session_id": "session"}


async def send_json(send: Callable[[dict], Any], status: int, detail: str) -> None:
    """Answer ``{"detail": detail}`` with ``status`` and close the connection."""
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def path_refusal(path: str) -> Refusal | None:
    """400 for a path holding a ``..`` segment or NUL; else None."""
    return (400, "invalid path") if any(s == ".." for s in path.split("/")) or "\x00" in path else None


def query_refusal(query: bytes, id_keys: Sequence[str] = ID_QUERY_KEYS) -> Refusal | None:
    """400 for a malformed query string or an ``id_keys`` value that is not a plain id; else None."""
    try:
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True, strict_parsing=False)
    except ValueError:
        return 400, "malformed query string"
    for key, value in pairs:
        if key in id_keys and value != "":
            try:
                check_id(value, _ID_NAMES.get(key, key))
            except UnsafeIdError as exc:
                return 400, str(exc)
    return None


_ABS_PATH = re.compile(r"(?<![\w.:/~-])/(?:[^\s/'\"<>|:]+/)+([^\s/'\"<>|:]*)")
MAX_SCRUBBED_BYTES = 8 << 20
"""A JSON answer longer than this is sent as it streams, unscrubbed (no server answer is)."""


def without_paths(value: Any) -> Any:
    """``value`` (a JSON answer) with every absolute path, whole or inside text, cut to its base
    name: a server never tells a client where its files live. URLs (``http://host/a/b``) stay."""
    if isinstance(value, str):
        return _ABS_PATH.sub(lambda m: m.group(1), value) if "/" in value else value
    if isinstance(value, list):
        return [without_paths(v) for v in value]
    if isinstance(value, dict):
        return {k: without_paths(v) for k, v in value.items()}
    return value


def scrubbing_send(send: Callable[[dict], Any]) -> Callable[[dict], Any]:
    """A ``send`` that holds a JSON answer back, removes paths (:func:`without_paths`) and sends it
    whole; every answer gets ``X-Content-Type-Options: nosniff`` (a browser renders what the
    server says it is, never what the bytes look like)."""
    state: dict[str, Any] = {"start": None, "body": bytearray()}

    async def wrapped(message):
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-content-type-options"]
            headers.append((b"x-content-type-options", b"nosniff"))
            message = {**message, "headers": headers}
            ctype = dict((k.lower(), v) for k, v in headers).get(b"content-type", b"")
            if ctype.startswith(b"application/json"):
                state["start"] = message
                return None
            return await send(message)
        if message["type"] == "http.response.body" and state["start"] is not None:
            state["body"] += message.get("body", b"")
            if message.get("more_body", False) and len(state["body"]) <= MAX_SCRUBBED_BYTES:
                return None
            body = bytes(state["body"])
            if not message.get("more_body", False):
                with contextlib.suppress(ValueError, RecursionError):
                    body = json.dumps(without_paths(json.loads(body))).encode()
            start, state["start"] = state["start"], None
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            if not message.get("more_body", False):
                headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            return await send({**message, "body": body})
        return await send(message)

    return wrapped


class GuardMiddleware:
    """Pure ASGI middleware (see the module docstring).

    Args:
        app: the ASGI app it guards.
        max_body: the request body limit in bytes.
        refuse: ``(method, path, query) -> (status, detail) | None``, the server's own refusals
            (its closed routes), asked after :func:`path_refusal`, before :func:`query_refusal`.
        body_timeout_s: seconds a client has to send a request's whole body, from the request's
            start; a slower body is answered 408.
        request_threads: requests served at once in worker threads (more wait their turn).
        inline: ``(method, path) -> bool``, the requests answered in the event loop itself (cheap
            status reads); every other one runs in a worker thread with an event loop of its own,
            so that one slow endpoint (an inference, a PACS download) never stops the others.
            Default: none inline.
    """

    def __init__(
        self,
        app: Any,
        max_body: int,
        refuse: Callable[[str, str, bytes], Refusal | None] | None = None,
        body_timeout_s: float = 120.0,
        request_threads: int = 8,
        inline: Callable[[str, str], bool] | None = None,
    ):
        import anyio

        self.app = app
        self.max_body = int(max_body)
        self.refuse = refuse
        self.body_timeout_s = float(body_timeout_s)
        self.inline = inline
        self.workers = anyio.CapacityLimiter(int(request_threads))

    async def __call__(self, scope, receive, send):
        import asyncio

        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path, query = scope.get("method", "GET"), scope.get("path", ""), scope.get("query_string", b"")
        refused = path_refusal(path) or (self.refuse and self.refuse(method, path, query)) or query_refusal(query)
        if refused is not None:
            logger.warning("request refused (%d): %s %s: %s", refused[0], method, path, refused[1])
            return await send_json(send, *refused)
        limit = self.max_body
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                return await send_json(send, 400, "malformed Content-Length")
            if size > limit:
                logger.warning("request refused (413): %s %s of %d bytes", method, path, size)
                return await send_json(send, 413, f"request body of {size} bytes; at most {limit} bytes are accepted")
        seen = 0
        loop = asyncio.get_running_loop()
        timeout = self.body_timeout_s
        deadline = loop.time() + timeout

        async def limited_receive():
            nonlocal seen
            from fastapi import HTTPException

            try:
                message = await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.001))
            except asyncio.TimeoutError:  # noqa: UP041  (not the built-in TimeoutError before Python 3.11)
                logger.warning("request refused (408): %s %s: body not received in %g s", method, path, timeout)
                raise HTTPException(
                    408, f"request body not received within {timeout:g} s (--conf body_timeout_s)"
                ) from None
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"request body over {limit} bytes")
            return message

        out = scrubbing_send(send)
        if self.inline is not None and self.inline(method, path):
            return await self.app(scope, limited_receive, out)
        return await self._in_worker(scope, limited_receive, out, loop)

    async def _in_worker(self, scope, receive, send, loop):
        """Run the rest of the app for one request in a worker thread (at most ``request_threads``
        at once), on a new event loop; ``receive``/``send`` stay the server loop's."""
        import asyncio

        import anyio

        app, r, s = self.app, _bridge(receive, loop), _bridge(send, loop)
        await anyio.to_thread.run_sync(lambda: asyncio.run(app(scope, r, s)), limiter=self.workers)


def _bridge(fn, loop):
    """``fn`` (an ASGI ``receive``/``send`` of the server's loop) callable from another thread's loop."""
    import asyncio

    async def call(*args):
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fn(*args), loop))

    return call
