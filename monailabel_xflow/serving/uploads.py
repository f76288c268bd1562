"""The one way a server of XFlow receives an uploaded file: its name bounded, its **content**
deciding its type and stored suffix (never the client's file name), OHIF's ``.bin`` scribbles
refused with a reason (:func:`receive_upload`); the caller removes the temporary file.
"""

from __future__ import annotations

from typing import Any

from monailabel_xflow.errors import RequestError, UploadError
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
