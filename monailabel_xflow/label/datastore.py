"""Datastores for radiographs: checked local folders and a DICOMweb PACS that takes CR/DX labels.

:class:`XFlowLocalDatastore` (a studies folder)
    MONAI Label's ``LocalDatastore`` that refuses, before anything is written, images XFlow
    cannot load (corrupt, non-image, multi-slice, lateral: 400) and labels that do not fit
    their image (wrong size, values outside 0..7: 422; unknown image: 404). A refused request
    leaves ``datastore_v2.json``, the images and ``labels/`` untouched.

:class:`XFlowDICOMwebDatastore` (``--studies http://.../dicom-web``)
    MONAI Label 0.8.5's ``DICOMWebDatastore`` with the fixes DESIGN §10b found necessary:

    * start-up never downloads dcmqi (:func:`make_dicomweb_datastore` replaces
      ``MONAILabelApp._init_dicomweb_datastore``);
    * the series filter defaults to ``{"Modality": "CR,DX"}`` (upstream: CT); ``--conf
      dicomweb_search_filter JSON`` or ``MONAI_LABEL_DICOMWEB_SEARCH_FILTER`` override it;
    * a final label is stored in the PACS as a DICOM SEG written with pydicom-seg from a
      temporary copy of the image header given ``ImagePositionPatient [0, 0, 0]`` and an
      identity ``ImageOrientationPatient`` (projection radiographs have neither, and both SEG
      writers need them); the output is checked before it is sent;
    * one segment per finding present, named after the finding, with codes of the private
      coding scheme ``99XFLOW`` (``F1``..``F7`` = label values; the SNOMED codes upstream puts
      there would claim "spleen");
    * **"no finding"** (an all-zero label) is stored as a SEG with one segment labelled
      ``no finding`` whose single frame is all zeros (DICOM allows empty frames; pydicom-seg
      refuses to write a label without labels, so the frame is written and then cleared).
      Reading it back gives the all-zero label, and the image counts as labeled;
    * final labels come back from the PACS through pydicom-seg (upstream needs dcmqi), so
      ``datalist()`` and training work against Orthanc.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from monailabel_xflow.label import layout
from monailabel_xflow.label.errors import ImageNotFoundError, http_errors
from monailabel_xflow.label.requests import check_id
from monailabel_xflow.vocabulary import FINDINGS

logger = logging.getLogger(__name__)

DEFAULT_SEARCH_FILTER: dict[str, str] = {"Modality": "CR,DX"}
CODING_SCHEME = "99XFLOW"
NO_FINDING = "no finding"


def _local_base():
    from monailabel.datastore.local import LocalDatastore

    return LocalDatastore


def _dicomweb_base():
    from monailabel.datastore.dicom import DICOMWebDatastore

    return DICOMWebDatastore


def _check_label_for(datastore: Any, image_id: str, label_filename: str) -> None:
    """Refuse a label for an unknown image, or one that does not fit the image."""
    uri = datastore.get_image_uri(image_id)
    if not uri or not os.path.exists(uri):
        raise ImageNotFoundError(f"unknown image {image_id!r}: cannot save a label for it")
    _, ref = layout.load_image(uri, image_id)
    layout.read_label(label_filename, ref.shape)


class XFlowLocalDatastore(_local_base()):
    """``LocalDatastore`` that validates uploads first (see module docstring); every id and tag
    is a plain name (:func:`~monailabel_xflow.label.requests.check_id`), so no request can make
    it read or write outside its folder."""

    def add_image(self, image_id: str, image_filename: str, image_info: dict[str, Any]) -> str:
        with http_errors("add image"):
            from monailabel_xflow.transforms.loading import load_cxr

            check_id(image_id, "image")
            load_cxr(image_filename)
            return super().add_image(image_id, image_filename, image_info)

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any]) -> str:
        with http_errors("save label"):
            check_id(image_id, "image")
            check_id(label_tag, "label tag")
            _check_label_for(self, image_id, label_filename)
            return super().save_label(image_id, label_filename, label_tag, label_info)

    def get_image_uri(self, image_id: str) -> str:
        check_id(image_id, "image")
        return super().get_image_uri(image_id)

    def get_label_uri(self, label_id: str, label_tag: str) -> str:
        check_id(label_id, "label")
        check_id(label_tag, "label tag")
        return super().get_label_uri(label_id, label_tag)


# --- DICOM SEG ------------------------------------------------------------------------------

def _segment(label_id: int, name: str, rgb: tuple[int, int, int]) -> dict[str, Any]:
    return {
        "labelID": int(label_id),
        "SegmentLabel": name,
        "SegmentDescription": name,
        "SegmentAlgorithmType": "SEMIAUTOMATIC",
        "SegmentAlgorithmName": "XFlow",
        "SegmentedPropertyCategoryCodeSequence": {
            "CodeValue": "F", "CodingSchemeDesignator": CODING_SCHEME, "CodeMeaning": "Chest radiograph finding"},
        "SegmentedPropertyTypeCodeSequence": {
            "CodeValue": f"F{label_id}" if name != NO_FINDING else "F0",
            "CodingSchemeDesignator": CODING_SCHEME, "CodeMeaning": name},
        "recommendedDisplayRGBValue": list(rgb),
    }


def _seg_template(segments: list[dict[str, Any]], description: str) -> Any:
    import pydicom_seg

    return pydicom_seg.template.from_dcmqi_metainfo({
        "ContentCreatorName": "XFlow",
        "ClinicalTrialSeriesID": "XFlow",
        "ClinicalTrialTimePointID": "1",
        "SeriesDescription": description,
        "SeriesNumber": "300",
        "InstanceNumber": "1",
        "segmentAttributes": [segments],
        "ContentLabel": "XFLOW",
        "ContentDescription": description,
        "ClinicalTrialCoordinatingCenterName": "MONAI Label XFlow",
        "BodyPartExamined": "CHEST",
    })


def _positioned_header(source: Path) -> Any:
    """The source DICOM's header with the plane geometry a SEG writer needs (DESIGN §10b)."""
    import pydicom

    ds = pydicom.dcmread(str(source), stop_before_pixels=True)
    ds.ImagePositionPatient = [0.0, 0.0, 0.0]
    ds.ImageOrientationPatient = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    if "PixelSpacing" not in ds:
        ds.PixelSpacing = list(ds.get("ImagerPixelSpacing", [1.0, 1.0]))
    return ds


def write_seg(label_hw: np.ndarray, source: Path, out: Path) -> Path:
    """Write an ``(H, W)`` label map as a DICOM SEG referencing ``source`` (one CR/DX file).

    Raises:
        LabelError: the label does not match the source's rows x columns.
        RuntimeError: the writer produced no file.
    """
    import SimpleITK as sitk

    from monailabel_xflow.label.errors import LabelError

    header = _positioned_header(source)
    if tuple(label_hw.shape) != (int(header.Rows), int(header.Columns)):
        raise LabelError(f"label {label_hw.shape} does not match the image's rows x columns "
                         f"({header.Rows}, {header.Columns})")
    values = [int(v) for v in np.unique(label_hw) if v]
    empty = not values
    if empty:  # pydicom-seg needs a labelled pixel: write one, then clear the frame below
        label_hw = np.zeros_like(label_hw)
        label_hw.flat[0] = 1
        segments = [_segment(1, NO_FINDING, (128, 128, 128))]
    else:
        segments = [_segment(v, FINDINGS[v - 1], layout.FINDING_COLOURS[v - 1]) for v in values]
    description = "XFlow: " + (NO_FINDING if empty else ", ".join(FINDINGS[v - 1] for v in values))
    image = sitk.GetImageFromArray(np.ascontiguousarray(label_hw.astype(np.uint16))[None])  # (1, H, W) -> W x H x 1
    image.SetSpacing([float(header.PixelSpacing[1]), float(header.PixelSpacing[0]), 1.0])

    import pydicom_seg

    writer = pydicom_seg.MultiClassWriter(template=_seg_template(segments, description), inplane_cropping=False,
                                          skip_empty_slices=False, skip_missing_segment=False)
    seg = writer.write(image, [header])
    if empty:
        seg.PixelData = bytes(len(seg.PixelData))
    seg.save_as(str(out))
    if not out.is_file() or out.stat().st_size == 0:
        raise RuntimeError(f"DICOM SEG writer produced no file at {out}")
    return out


def read_seg(dataset: Any) -> np.ndarray:
    """A DICOM SEG written by :func:`write_seg` -> ``uint8 (H, W)`` label map."""
    import pydicom_seg

    names = {int(s.SegmentNumber): str(s.SegmentLabel) for s in dataset.SegmentSequence}
    if list(names.values()) == [NO_FINDING]:
        return np.zeros((int(dataset.Rows), int(dataset.Columns)), dtype=np.uint8)
    result = pydicom_seg.MultiClassReader().read(dataset)
    data = np.asarray(result.data)  # (1, H, W): numbers are the segment numbers = label values
    if data.ndim != 3 or data.shape[0] != 1:
        raise ValueError(f"SEG of shape {data.shape} is not a single-frame radiograph label")
    return data[0].astype(np.uint8)


class XFlowDICOMwebDatastore(_dicomweb_base()):
    """DICOMweb datastore for CR/DX radiographs (see module docstring)."""

    def get_image_uri(self, image_id: str) -> str:
        """The cached NIfTI beside its series folder (upstream returns a temporary copy the first
        time, which loses the way back to the DICOM tags, e.g. the lateral-view check). The id is a
        plain name (it becomes a cache folder) of a series the PACS lists."""
        check_id(image_id, "image")
        if image_id not in self.list_images():
            raise ImageNotFoundError(f"unknown image {image_id!r}: no such CR/DX series in the PACS")
        uri = super().get_image_uri(image_id)
        cached = os.path.realpath(os.path.join(self._datastore.image_path(), f"{image_id}.nii.gz"))
        return cached if os.path.exists(cached) else uri

    def _series_file(self, image_id: str) -> Path:
        self.get_image_uri(image_id)  # downloads the series into the cache if needed
        folder = Path(self._datastore.image_path()) / image_id
        files = sorted(folder.glob("*.dcm")) or sorted(p for p in folder.iterdir() if p.is_file())
        if len(files) != 1:
            raise ImageNotFoundError(f"series {image_id!r} holds {len(files)} instances; a radiograph has one")
        return files[0]

    def save_label(self, image_id: str, label_filename: str, label_tag: str, label_info: dict[str, Any],
                   label_id: str = "") -> str:
        from monailabel.interfaces.datastore import DefaultLabelTag

        with http_errors("save label"):
            check_id(image_id, "image")
            check_id(label_tag, "label tag")
            if image_id not in self.list_images():
                raise ImageNotFoundError(f"unknown image {image_id!r}: no such CR/DX series in the PACS")
            uri = self.get_image_uri(image_id)
            _, ref = layout.load_image(uri, image_id)
            label = layout.read_label(label_filename, ref.shape)
            if label_tag != DefaultLabelTag.FINAL:
                return _local_base().save_label(self, image_id, label_filename, label_tag, label_info)
            return self._save_final(image_id, label, label_filename, label_info)

    def _save_final(self, image_id: str, label: np.ndarray, label_filename: str, label_info: dict[str, Any]) -> str:
        from monailabel.datastore.utils.dicom import dicom_web_upload_dcm
        from monailabel.interfaces.datastore import DefaultLabelTag

        with tempfile.TemporaryDirectory() as tmp:
            seg_file = write_seg(label, self._series_file(image_id), Path(tmp) / "seg.dcm")
            series_uid = dicom_web_upload_dcm(str(seg_file), self._client)
        info = self.get_image_info(image_id)
        label_info = dict(label_info or {})
        label_info.update({"SeriesInstanceUID": series_uid, "Modality": "SEG", "PatientID": info.get("PatientID"),
                           "StudyInstanceUID": info.get("StudyInstanceUID"),
                           "findings": [FINDINGS[v - 1] for v in np.unique(label) if v] or [NO_FINDING]})
        clear = getattr(self.get_labeled_images, "cache_clear", None)
        if clear is not None:  # list the new label now, not after MONAI_LABEL_DICOMWEB_CACHE_EXPIRY
            clear()
        logger.info("saved SEG %s for %s (%s)", series_uid, image_id, label_info["findings"])
        return _local_base().save_label(self, image_id, label_filename, DefaultLabelTag.FINAL, label_info)

    def get_label_uri(self, label_id: str, label_tag: str, image_id: str = "") -> str:
        """Final labels: download the SEG series and convert it with pydicom-seg (no dcmqi)."""
        from monailabel.datastore.utils.dicom import dicom_web_download_series
        from monailabel.interfaces.datastore import DefaultLabelTag

        check_id(label_id, "label")
        check_id(label_tag, "label tag")
        if image_id:
            check_id(image_id, "image")
        if label_tag != DefaultLabelTag.FINAL or not image_id:
            return _local_base().get_label_uri(self, label_id, label_tag)
        cached = os.path.join(self._datastore.label_path(DefaultLabelTag.FINAL), f"{image_id}.nii.gz")
        if os.path.exists(cached):
            return cached
        import pydicom

        label_dir = os.path.join(self._datastore.label_path(label_tag), label_id)
        if not os.path.isdir(label_dir) or not os.listdir(label_dir):
            dicom_web_download_series(None, label_id, label_dir, self._client, self._fetch_by_frame)
        seg_files = sorted(Path(label_dir).glob("*.dcm"))
        if not seg_files:
            return ""
        label = read_seg(pydicom.dcmread(str(seg_files[0])))
        _, ref = layout.load_image(self.get_image_uri(image_id), image_id)
        tmp = layout.write_label(label, ref)
        try:
            _local_base().save_label(self, image_id, tmp, DefaultLabelTag.FINAL, self._dicom_info(label_id))
        finally:
            os.unlink(tmp)
        return cached


def search_filter(conf: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``--conf dicomweb_search_filter`` > ``MONAI_LABEL_DICOMWEB_SEARCH_FILTER`` > CR/DX."""
    from monailabel.config import settings

    from monailabel_xflow.label.errors import RequestError

    text = (conf or {}).get("dicomweb_search_filter")
    if text:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RequestError(f"--conf dicomweb_search_filter is not JSON: {exc}") from exc
        return dict(value)
    if "MONAI_LABEL_DICOMWEB_SEARCH_FILTER" in os.environ:
        return dict(settings.MONAI_LABEL_DICOMWEB_SEARCH_FILTER)
    return dict(DEFAULT_SEARCH_FILTER)


def make_dicomweb_datastore(studies: str, conf: Mapping[str, str] | None = None) -> XFlowDICOMwebDatastore:
    """The app's remote datastore: ``MONAILabelApp._init_dicomweb_datastore`` without the dcmqi
    download, with the CR/DX filter and our SEG handling."""
    from dicomweb_client.session_utils import create_session_from_user_pass
    from monailabel.config import settings
    from monailabel.datastore.dicom import DICOMwebClientX

    session = None
    user = settings.MONAI_LABEL_DATASTORE_USERNAME or settings.MONAI_LABEL_DICOMWEB_USERNAME
    password = settings.MONAI_LABEL_DATASTORE_PASSWORD or settings.MONAI_LABEL_DICOMWEB_PASSWORD
    if user and password:
        session = create_session_from_user_pass(user, password)
    client = DICOMwebClientX(url=studies, session=session, qido_url_prefix=settings.MONAI_LABEL_QIDO_PREFIX,
                             wado_url_prefix=settings.MONAI_LABEL_WADO_PREFIX,
                             stow_url_prefix=settings.MONAI_LABEL_STOW_PREFIX)
    cache = (settings.MONAI_LABEL_DICOMWEB_CACHE_PATH or settings.MONAI_LABEL_DATASTORE_CACHE_PATH or "").strip()
    flt = search_filter(conf)
    logger.info("DICOMweb datastore %s, series filter %s, cache %s", studies, flt, cache or "~/.cache/monailabel")
    return XFlowDICOMwebDatastore(client=client, search_filter=flt, cache_path=cache or None,
                                  fetch_by_frame=settings.MONAI_LABEL_DICOMWEB_FETCH_BY_FRAME, convert_to_nifti=True)
