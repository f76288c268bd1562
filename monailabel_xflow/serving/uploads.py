"""The one way a server of XFlow receives an uploaded file: its name bounded, its **content**
deciding its type and stored suffix (never the client's file name), OHIF's ``.bin`` scribbles
refused with a reason (:func:`receive_upload`); the temporary files of a request are removed
whatever happens (:func:`receiving`). A session's uploads are checked before any is stored
(:func:`check_session_uploads`). Only inside :func:`allowing_upload_paths` (the infer route, after
it put the uploads there) may a request's image be a server path (:func:`upload_paths_allowed`).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from monailabel_xflow.errors import RequestError, UploadError
from monailabel_xflow.parameters import as_int, check_id
from monailabel_xflow.transforms.uploads import store_upload

MAX_UPLOAD_NAME_CHARS = 255
"""The longest upload file name accepted, in UTF-8 bytes."""


def check_upload_name(upload: Any, field: str) -> str:
    """The client's file name of a multipart ``upload`` (``""`` when it sends none), checked.

    Raises:
        RequestError: over :data:`MAX_UPLOAD_NAME_CHARS` bytes or holding NUL (422).
    """
    name = getattr(upload, "filename", None) or ""
    if len(name.encode("utf-8", "surrogatepass")) > MAX_UPLOAD_NAME_CHARS or "\x00" in name:
        raise RequestError(f"uploaded {field} file name is over {MAX_UPLOAD_NAME_CHARS} bytes or holds NUL")
    return name


def receive_upload(upload: Any, field: str, formats: tuple[str, ...]) -> str:
    """One multipart upload as a temporary file named by what its **content** is
    (:func:`~monailabel_xflow.transforms.uploads.store_upload`); the caller removes it.

    Raises:
        RequestError: a file name over 255 bytes or holding NUL (422).
        UploadError: OHIF ``.bin`` scribbles, or content that is none of ``formats`` (400).
    """
    name = check_upload_name(upload, field)
    if name.lower().endswith(".bin"):
        raise UploadError(
            f"{field}: binary scribbles (.bin) are not read by the XFlow tasks; send clicks as "
            "foreground/background points and a previous label as PNG, NIfTI or NRRD"
        )
    return store_upload(upload.file, formats, field)


def remove_files(paths: Iterable[str]) -> None:
    """Remove each of ``paths``, ignoring those already gone."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def receiving() -> Iterator[Callable[[Any, str, tuple[str, ...]], str]]:
    """A :func:`receive_upload` for one request: every temporary file it made is removed when the
    block ends, whatever happens."""
    temps: list[str] = []

    def receive(upload: Any, field: str, formats: tuple[str, ...]) -> str:
        temps.append(receive_upload(upload, field, formats))
        return temps[-1]

    try:
        yield receive
    finally:
        remove_files(temps)


MAX_SESSION_FILES = 16
"""Files one session upload may hold."""


def check_session_uploads(files: Sequence[Any], uncompress: Any = False, expiry: Any = 0) -> None:
    """A session's uploads, checked before anything is stored: plain files only (an archive could
    unpack outside the session folder), at most :data:`MAX_SESSION_FILES`, each named by a plain
    file name (a server joins it to the session folder), ``expiry`` 0..7 days in seconds.

    Raises:
        RequestError: any of these not so (422).
    """
    if uncompress:
        raise RequestError("compressed session uploads are not accepted: upload the image file(s)")
    if len(files) > MAX_SESSION_FILES:
        raise RequestError(f"{len(files)} files in one session; at most {MAX_SESSION_FILES}")
    for upload in files:
        check_upload_name(upload, "session")
        name = getattr(upload, "filename", "") or ""
        if name:
            check_id(name, "session file name")
    as_int(expiry, "expiry", 0, 7 * 24 * 3600)


_UPLOADS = contextvars.ContextVar("xflow_upload_paths_allowed", default=False)


def upload_paths_allowed() -> bool:
    """True inside :func:`allowing_upload_paths`: the request's ``image``/``label`` paths are the
    server's own temporary uploads or session files (client params cannot set them there)."""
    return _UPLOADS.get()


@contextlib.contextmanager
def allowing_upload_paths() -> Iterator[None]:
    """The block in which :func:`upload_paths_allowed` is true (this context only)."""
    token = _UPLOADS.set(True)
    try:
        yield
    finally:
        _UPLOADS.reset(token)
