"""A client's file stored by what its content is: the format sniffed (:func:`.loading.sniff_format`),
never taken from the client's file name.

:func:`store_upload` copies an upload stream to a new temporary file named with the canonical
suffix of the format its content shows (:data:`.loading.CANONICAL_SUFFIX`); :func:`content_suffix`
names that suffix for a file already on disk (what a datastore stores it under).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import BinaryIO

from monailabel_xflow.errors import UploadError
from monailabel_xflow.transforms.loading import (
    CANONICAL_SUFFIX,
    UPLOAD_PREFIX,
    CXRLoadError,
    PathLike,
    sniff_format,
)


def content_suffix(path: PathLike, formats: tuple[str, ...], what: str) -> str:
    """The suffix a file is stored under: the canonical one of the format its content shows.

    Args:
        formats: the accepted formats (keys of :data:`.loading.CANONICAL_SUFFIX`), e.g.
            :data:`.loading.IMAGE_FORMATS`.
        what: the file's role in the message (``"image"``, ``"label"``).

    Raises:
        CXRLoadError: missing, empty or unreadable, or content none of ``formats`` (400).
    """
    fmt = sniff_format(path)
    if fmt not in formats:
        raise CXRLoadError(path, f"{what} is not {', '.join(formats)} by its content")
    return CANONICAL_SUFFIX[fmt]


def store_upload(stream: BinaryIO, formats: tuple[str, ...], what: str) -> str:
    """Copy ``stream`` (an upload's file object) to a new temporary file (prefix
    :data:`.loading.UPLOAD_PREFIX`) ending in the canonical suffix of the format its content
    shows. The caller removes the file; on a refusal here it is already gone.

    Args:
        formats: the accepted formats (keys of :data:`.loading.CANONICAL_SUFFIX`).
        what: the upload's field name in the message (``"image"``, ``"label"``).

    Returns:
        The temporary file's path.

    Raises:
        UploadError: empty, or content that is none of ``formats`` (400).
    """
    fd, raw = tempfile.mkstemp(prefix=UPLOAD_PREFIX)
    final = raw
    try:
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(stream, out, 1 << 20)
        fmt = sniff_format(raw) if os.path.getsize(raw) else None
        if fmt not in formats:
            kinds = ", ".join(sorted({CANONICAL_SUFFIX[f] for f in formats}))
            raise UploadError(
                f"cannot load uploaded {what}: unreadable as {kinds} by its content (the file name does not decide)"
            )
        final = raw + CANONICAL_SUFFIX[fmt]
        os.rename(raw, final)
        return final
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(final)
        raise
