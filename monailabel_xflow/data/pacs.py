"""The DICOMweb PACS as the labeling server uses it (:class:`PACS`), and when it does not answer:
one error that names it.

:class:`PACS` is a ``dicomweb_client`` client and a series filter, no server framework: the image
series under the filter and the SEG series (listings reused for a given expiry), each image's
label (its newest SEG that is a label, not XFlow's stored answer; an unreadable one skipped with
its reason), a label map stored as a DICOM SEG (:mod:`monailabel_xflow.data.seg`) and a SEG series
read back into a label map, without dcmqi.

A PACS that is stopped, restarting or overloaded shows up as a connection error, a timeout or an
HTTP 5xx answer of ``requests`` (which ``dicomweb_client`` uses). :func:`pacs_failure` turns such an
error into :class:`~monailabel_xflow.errors.PACSUnavailableError` (HTTP 503) whose message names the
PACS's URL and says that the request can be retried; any other error is left alone.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from monailabel_xflow.data.seg import (
    PREANNOTATION_CONTENT_LABEL,
    fetch_seg_series,
    newest_label_segs,
    seg_series_metadata,
    write_seg,
    xflow_answers,
)
from monailabel_xflow.errors import ImageNotFoundError, PACSUnavailableError
from monailabel_xflow.vocabulary import FINDINGS, NO_FINDING

logger = logging.getLogger(__name__)


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


def label_findings(label: np.ndarray) -> list[str]:
    """The findings an ``(H, W)`` label map of :mod:`~monailabel_xflow.vocabulary`'s values holds,
    ``[NO_FINDING]`` when none (the ``findings`` of a stored label's info)."""
    return [FINDINGS[v - 1] for v in np.unique(label) if v] or [NO_FINDING]


def seg_label_info(series_uid: str, image_info: Mapping[str, Any], label: np.ndarray) -> dict[str, Any]:
    """The info kept with a final label stored as the SEG ``series_uid`` of an image (whose DICOM
    tags are ``image_info``): the SEG's series and modality, the image's patient and study, and the
    findings the label map holds (:func:`label_findings`)."""
    return {
        "SeriesInstanceUID": series_uid,
        "Modality": "SEG",
        "PatientID": image_info.get("PatientID"),
        "StudyInstanceUID": image_info.get("StudyInstanceUID"),
        "findings": label_findings(label),
    }


def radiograph_file(folder: Path, series_uid: str) -> Path:
    """The one instance file of a radiograph's series downloaded into ``folder`` (``*.dcm``, else
    any file).

    Raises:
        ImageNotFoundError: the folder holds none or more than one (a radiograph has one).
    """
    files = sorted(folder.glob("*.dcm")) or sorted(p for p in folder.iterdir() if p.is_file())
    if len(files) != 1:
        raise ImageNotFoundError(f"series {series_uid!r} holds {len(files)} instances; a radiograph has one")
    return files[0]


class PACS:
    """A DICOMweb PACS as the labeling server sees it, knowing nothing of any server framework:
    its image series under a filter, its SEG series, each image's label (its newest label SEG),
    SEGs stored and read back. Listings are reused for the ``expiry_s`` each call passes; storing
    a SEG lists it at the next call.

    Args:
        client: a ``dicomweb_client.DICOMwebClient``.
        search_filter: the QIDO-RS series filter of the images (e.g. ``{"Modality": "CR,DX"}``).
    """

    def __init__(self, client: Any, search_filter: Mapping[str, Any]) -> None:
        self.client = client
        self.search_filter = dict(search_filter)
        self.unreadable: dict[str, str] = {}
        """``{SEG SeriesInstanceUID: why it could not be read}``: skipped as labels."""
        self._series: tuple[float, list[str]] | None = None  # (monotonic time, series the filter lists)
        self._labels: tuple[float, dict[str, str]] | None = None  # (monotonic time, image -> SEG series)

    @property
    def url(self) -> str:
        """The PACS's DICOMweb URL (``""`` when the client does not say)."""
        return str(getattr(self.client, "base_url", "") or "")

    def failure(self, exc: BaseException) -> PACSUnavailableError | None:
        """``exc`` as this PACS not answering (:func:`pacs_failure`), or None."""
        return pacs_failure(exc, self.url)

    def images(self, expiry_s: float) -> list[str]:
        """The SeriesInstanceUIDs of the series under the filter, listed again after ``expiry_s`` s."""
        import pydicom

        if self._series is not None and time.monotonic() - self._series[0] < expiry_s:
            return list(self._series[1])
        found = self.client.search_for_series(search_filters=self.search_filter)
        series = [str(pydicom.Dataset.from_json(row).SeriesInstanceUID) for row in found]
        self._series = (time.monotonic(), series)
        return list(series)

    def seg_series(self) -> Iterator[tuple[Any, Any]]:
        """Every SEG series of the PACS: ``(row, metadata)`` pairs (metadata None if unreadable)."""
        import pydicom

        for found in self.client.search_for_series(search_filters={"Modality": "SEG"}):
            row = pydicom.Dataset.from_json(found)
            yield row, seg_series_metadata(self.client, str(row.StudyInstanceUID), str(row.SeriesInstanceUID))

    def answers(self) -> dict[str, set[str]]:
        """XFlow's stored answers in the PACS (:func:`~monailabel_xflow.data.seg.xflow_answers`)."""
        return xflow_answers(meta for _, meta in self.seg_series())

    def labels(self, expiry_s: float) -> dict[str, str]:
        """``{image: SEG series}``, each image's label SEG
        (:func:`~monailabel_xflow.data.seg.newest_label_segs`; not one of :attr:`unreadable`),
        listed again after ``expiry_s`` s or when :meth:`forget_labels` was called."""
        if self._labels is not None and time.monotonic() - self._labels[0] < expiry_s:
            return dict(self._labels[1])
        index = newest_label_segs(self.seg_series(), set(self.images(expiry_s)), self.unreadable)
        self._labels = (time.monotonic(), index)
        return dict(index)

    def forget_labels(self) -> None:
        """List the label SEGs again at the next :meth:`labels`."""
        self._labels = None

    def read_labels(self, labels: Mapping[str, str], read: Callable[[str, str], Any], expiry_s: float) -> None:
        """Call ``read(image, SEG series)`` for each of ``labels`` (as :meth:`labels` lists them); a
        SEG that ``read`` fails on is recorded in :attr:`unreadable` with the reason (logged as a
        warning) and the image's next newest label SEG is read instead: one bad SEG never stops the
        others."""
        for image_id, first in labels.items():
            seg_series: str | None = first
            while seg_series:
                try:
                    read(image_id, seg_series)
                    break
                except Exception as exc:  # noqa: BLE001  (one bad SEG must not stop the others)
                    reason = f"{type(exc).__name__}: {getattr(exc, 'detail', None) or exc}"
                    self.unreadable[seg_series] = reason
                    logger.warning("label SEG %s of image %s skipped: %s", seg_series, image_id, reason)
                    self.forget_labels()
                    seg_series = self.labels(expiry_s).get(image_id)  # the next newest label SEG, if any

    def store_seg(
        self,
        label: np.ndarray | None,
        source: str | Path,
        findings: tuple[str, ...] | list[str] = (),
        content_label: str = PREANNOTATION_CONTENT_LABEL,
        description: str = "",
        algorithm: str = "XFlow",
        masks: Mapping[str, np.ndarray] | None = None,
    ) -> str:
        """Store an ``(H, W)`` label map of an image as a DICOM SEG in its study (DICOMweb STOW).

        Args:
            label: ``uint8 (H, W)`` label map (0..7); None: painted from ``masks`` (a later finding wins).
            source: the image's DICOM file (the SEG refers to it and takes its study).
            findings: findings asked for (each a segment, empty when absent).
            content_label: :data:`PREANNOTATION_CONTENT_LABEL` or :data:`LABEL_CONTENT_LABEL`.
            description: SeriesDescription (default ``"<algorithm>: <findings>"``).
            algorithm: ``"XFlow"`` or ``"ROSALIA"`` (ManufacturerModelName, segments' algorithm).
            masks: ``{finding: bool (H, W)}``, each finding's full mask, overlaps kept.

        Returns:
            The new SEG's SeriesInstanceUID; the next :meth:`labels` lists it.

        Raises:
            ValueError: neither a label map nor masks.
        """
        import pydicom

        from monailabel_xflow.transforms.labels import paint

        if label is None:
            if not masks:
                raise ValueError("store_seg needs a label map or the findings' masks")
            label, _ = paint(masks.items(), next(iter(masks.values())).shape)
        seg = write_seg(label, source, findings=findings, description=description, algorithm=algorithm, masks=masks)
        seg.ContentLabel = content_label
        encoded = io.BytesIO()
        seg.save_as(encoded)  # sent as read back from its file, as MONAI Label's upload sends one
        self.client.store_instances([pydicom.dcmread(io.BytesIO(encoded.getvalue()))])
        self.forget_labels()
        return str(seg.SeriesInstanceUID)

    def fetch_seg(self, series_uid: str, folder: str | Path) -> Any:
        """The SEG series ``series_uid`` (its first instance, a ``pydicom.Dataset``; None when it
        holds none), cached in ``folder`` as stored (:func:`~monailabel_xflow.data.seg.fetch_seg_series`:
        no PACS transcoding) and read from there while cached; read it into a label map with
        :func:`~monailabel_xflow.data.seg.read_seg` (no dcmqi).

        Raises:
            LabelError: the PACS does not list it.
        """
        import pydicom

        if not os.path.isdir(folder) or not any(Path(folder).glob("*.dcm")):
            fetch_seg_series(self.client, series_uid, folder)
        files = sorted(Path(folder).glob("*.dcm"))
        return pydicom.dcmread(str(files[0])) if files else None
