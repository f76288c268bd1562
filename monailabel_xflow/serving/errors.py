"""How an error becomes an HTTP answer, whatever web framework serves XFlow: the status of the
package's tree by base class (:func:`~monailabel_xflow.errors.http_status`), 507 for a full disk
whoever raised it (:func:`answer_status`), and the detail a client reads (:func:`answer_detail`).
The MONAI Label app adds MONAI Label's own errors (:mod:`monailabel_xflow.app.errors`).
"""

from __future__ import annotations

from monailabel_xflow.errors import XFlowError, http_status
from monailabel_xflow.files import storage_full

FULL_DISK = "no space left on the server's disk; nothing was stored (free space and retry)"
"""The detail of a 507 that no error of the package's tree explains (an ``OSError`` of a full disk)."""


def answer_status(exc: BaseException) -> int | None:
    """The HTTP status of an error: by base class for the package's tree, 507 for a full disk
    (``ENOSPC``/``EDQUOT``, whoever raised it); None for anything else."""
    status = http_status(exc)
    return 507 if status is None and storage_full(exc) else status


def message_of(exc: BaseException) -> str:
    """An error's text: its ``msg`` when it keeps its text there (MONAI Label's errors do), else ``str``."""
    msg = getattr(exc, "msg", None)
    return str(msg if isinstance(msg, str) else exc)


def answer_detail(exc: BaseException, status: int, what: str = "") -> str:
    """The ``detail`` answered for ``exc`` with ``status``, prefixed ``"<what>: "`` when ``what``
    names the task or endpoint; a full disk outside the tree says :data:`FULL_DISK`."""
    prefix = f"{what}: " if what else ""
    return prefix + (FULL_DISK if status == 507 and not isinstance(exc, XFlowError) else message_of(exc))
