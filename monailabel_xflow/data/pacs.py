"""When the DICOMweb PACS does not answer: one error that names it.

A PACS that is stopped, restarting or overloaded shows up as a connection error, a timeout or an
HTTP 5xx answer of ``requests`` (which ``dicomweb_client`` uses). :func:`pacs_failure` turns such an
error into :class:`~monailabel_xflow.errors.PACSUnavailableError` (HTTP 503) whose message names the
PACS's URL and says that the request can be retried; any other error is left alone.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from monailabel_xflow.errors import PACSUnavailableError


def pacs_origin(url: str) -> str:
    """``scheme://host:port`` of a DICOMweb URL (no path, no credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{':' + str(parts.port) if parts.port else ''}" if host else url


def pacs_failure(exc: BaseException, url: str) -> PACSUnavailableError | None:
    """``exc`` as the PACS at ``url`` not answering, or None when it is some other error.

    Counted: ``requests`` connection errors and timeouts, and HTTP answers 502/503/504 or any 5xx
    (the PACS failed, not the request)."""
    import requests

    if isinstance(exc, PACSUnavailableError):
        return exc
    reason = None
    if isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
        reason = "no connection" if isinstance(exc, requests.exceptions.ConnectionError) else "timed out"
    elif isinstance(exc, requests.exceptions.HTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status is not None and int(status) >= 500:
            reason = f"HTTP {status}"
    if reason is None:
        return None
    return PACSUnavailableError(
        f"the PACS at {pacs_origin(url)} did not answer ({reason}); nothing was stored there by this "
        "request: retry when the PACS is back"
    )
