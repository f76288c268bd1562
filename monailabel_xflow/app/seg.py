"""DICOM Segmentation (SEG) objects for projection radiographs (CR/DX), written and read with highdicom.

One SEG per XFlow result holds every finding asked for, as viewers and PACS expect:

* **segments are numbered 1..N** in :data:`~monailabel_xflow.vocabulary.FINDINGS` order of the
  findings the SEG holds (not by label value: OHIF indexes its segment table by number and fails
  with ``centroids.get(index)`` on gaps). Each segment carries its finding's name as
  ``SegmentLabel`` and the coded category/type of :data:`FINDING_CODES`;
* a finding that was asked for and found absent is still a segment, with an all-zero frame (DICOM
  allows empty frames), so the SEG says "looked for, not there" rather than "not asked";
* **"no finding"** (nothing asked that was present, or an all-zero label saved) is one segment
  labelled ``no finding`` (SNOMED CT "Normal") with an all-zero frame;
* highdicom builds and validates the object from the source radiograph. A CR/DX image has no
  Frame of Reference, so highdicom (rightly) writes no plane geometry; OHIF's SEG loader,
  however, reads the plane orientation unconditionally and compares it with what it derives for
  the source image, which for a radiograph without ``ImageOrientationPatient`` is
  ``[0, 1, 0, 0, 0, -1]`` at position ``[0, 0, 0]``. :func:`write_seg` adds exactly
  that (shared Plane Orientation, per-frame Plane Position) and nothing else, so the frames stay
  tied to the source instance through their Derivation Image Sequence.

Codes (:data:`FINDING_CODES`): category SCT 49755003 "Morphologically Abnormal Structure" for every
finding (DICOM PS3.16 CID 7150 "Segmentation Property Categories"); types, with their source:

==============  =====  =========  ===============================  ==========================================
finding         value  scheme     code / meaning                   source
==============  =====  =========  ===============================  ==========================================
cardiomegaly    1      SCT        8186001 Cardiomegaly             SNOMED CT International (see below)
pneumonia       2      SCT        233604007 Pneumonia              SNOMED CT International (not in PS3.16)
atelectasis     3      SCT        46621007 Atelectasis             SNOMED CT International (not in PS3.16)
opacity         4      DCM        112001 Opacity                   DICOM PS3.16 CID 6104 (SNOMED CT has no
                                                                   plain "lung opacity" concept in PS3.16)
consolidation   5      SCT        95436008 Lung consolidation      SNOMED CT International (not in PS3.16)
edema           6      SCT        19242006 Pulmonary edema         DICOM PS3.16 CID 3700
effusion        7      SCT        60046008 Pleural effusion        DICOM PS3.16 CID 645
no finding      -      SCT        17621005 Normal                  DICOM PS3.16 CID 7151
==============  =====  =========  ===============================  ==========================================

(PS3.16 codes as shipped in ``pydicom.sr``; the SNOMED CT codes not taken from PS3.16 are the
International Edition's disorder concepts of those names. PS3.16 CID 12249 lists "Cardiomegaly"
as SCT 287272002, but PS3.16's own SNOMED mapping gives 287272002 the fully specified name
"Enlarged septal foramen of heart (disorder)"; SEGs are written with 8186001 and 287272002 is
accepted as cardiomegaly when reading, see :data:`READ_ALIASES`.)

Reading (:func:`read_seg`) accepts SEGs written here and SEGs written by other tools (OHIF's
Segmentation mode, 3D Slicer): a segment is mapped to a finding by its type code, else by its
label ("pleural effusion", "Edema" ...); overlapping segments are painted in FINDINGS order
(later wins), as the ``xflow`` task paints its label maps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from monailabel_xflow.app.errors import LabelError
from monailabel_xflow.vocabulary import FINDINGS

logger = logging.getLogger(__name__)

NO_FINDING = "no finding"
OHIF_ORIENTATION = (0.0, 1.0, 0.0, 0.0, 0.0, -1.0)
"""The plane orientation OHIF derives for a radiograph without ImageOrientationPatient (§15)."""
SERIES_NUMBER = 300
MANUFACTURER = "monailabel-xflow"


@dataclass(frozen=True)
class Coded:
    """One code: value, scheme designator, meaning."""

    value: str
    scheme: str
    meaning: str

    def concept(self) -> Any:
        from highdicom.sr import CodedConcept

        return CodedConcept(value=self.value, scheme_designator=self.scheme, meaning=self.meaning)


CATEGORY = Coded("49755003", "SCT", "Morphologically Abnormal Structure")
FINDING_CODES: dict[str, Coded] = {
    "cardiomegaly": Coded("8186001", "SCT", "Cardiomegaly"),
    "pneumonia": Coded("233604007", "SCT", "Pneumonia"),
    "atelectasis": Coded("46621007", "SCT", "Atelectasis"),
    "opacity": Coded("112001", "DCM", "Opacity"),
    "consolidation": Coded("95436008", "SCT", "Lung consolidation"),
    "edema": Coded("19242006", "SCT", "Pulmonary edema"),
    "effusion": Coded("60046008", "SCT", "Pleural effusion"),
}
NO_FINDING_CODE = Coded("17621005", "SCT", "Normal")
READ_ALIASES: dict[tuple[str, str], str] = {("287272002", "SCT"): "cardiomegaly"}
"""Other tools' type codes read as a finding (PS3.16 CID 12249's "Cardiomegaly")."""
assert tuple(FINDING_CODES) == FINDINGS


def dicom_lab(rgb: tuple[int, int, int]) -> list[int]:
    """An sRGB colour as DICOM's RecommendedDisplayCIELabValue (CIELab, D65, scaled to 0..65535)."""
    from highdicom.color import CIELabColor
    from skimage.color import rgb2lab

    lab = rgb2lab(np.asarray(rgb, dtype=float).reshape(1, 1, 3) / 255.0)[0, 0]
    return [int(v) for v in CIELabColor(*(float(v) for v in lab)).value]


def _segment(number: int, name: str, code: Coded, algorithm: str, version: str,
             rgb: tuple[int, int, int] = (128, 128, 128)) -> Any:
    import highdicom as hd
    from pydicom.sr.codedict import codes

    algo = hd.AlgorithmIdentificationSequence(name=algorithm, family=codes.DCM.ArtificialIntelligence,
                                              version=version or "0")
    segment = hd.seg.SegmentDescription(
        segment_number=number, segment_label=name, segmented_property_category=CATEGORY.concept(),
        segmented_property_type=code.concept(), algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
        algorithm_identification=algo)
    segment.RecommendedDisplayCIELabValue = dicom_lab(rgb)  # viewers colour findings as our overlays do
    return segment


def segment_findings(label_hw: np.ndarray, findings: Sequence[str] = ()) -> list[str]:
    """The findings a SEG of ``label_hw`` holds, in FINDINGS order: those painted plus those
    asked (``findings``, present or not). Empty = "no finding"."""
    values = {int(v) for v in np.unique(label_hw) if v}
    unknown = [f for f in findings if f not in FINDINGS]
    if unknown:
        raise LabelError(f"unknown findings {unknown}; supported: {', '.join(FINDINGS)}")
    return [f for i, f in enumerate(FINDINGS, 1) if i in values or f in findings]


def write_seg(label_hw: np.ndarray, source: Any, out: str | Path | None = None, findings: Sequence[str] = (),
              algorithm: str = "XFlow", version: str = "", description: str = "") -> Any:
    """An ``(H, W)`` label map (0 background, 1..7 the findings' label values) as a SEG of ``source``.

    Args:
        label_hw: ``(H, W)`` integer label map in the source's rows x columns.
        source: the CR/DX image (a pydicom Dataset or a file path).
        out: where to save the SEG; None only returns it.
        findings: findings asked for; each becomes a segment even when absent (empty frame).
        algorithm / version: recorded in every segment's Algorithm Identification.
        description: SeriesDescription (default ``"XFlow: <findings>"``).

    Returns:
        The :class:`highdicom.seg.Segmentation` (a pydicom Dataset).

    Raises:
        LabelError: the label does not match the source's rows x columns, has values outside
            0..7, or names an unknown finding.
    """
    import highdicom as hd
    import pydicom
    from pydicom.uid import generate_uid

    ds = _source_header(source if isinstance(source, pydicom.Dataset) else pydicom.dcmread(str(source)))
    label = np.asarray(label_hw)
    if label.shape != (int(ds.Rows), int(ds.Columns)):
        raise LabelError(f"label of shape {label.shape} does not match the image's rows x columns "
                         f"({ds.Rows}, {ds.Columns})")
    if label.size and (label.min() < 0 or label.max() > len(FINDINGS)):
        raise LabelError(f"label values must be 0..{len(FINDINGS)}, got {np.unique(label)[:10].tolist()}")
    names = segment_findings(label, findings)
    if names:
        from monailabel_xflow.app.layout import FINDING_COLOURS

        segments = [_segment(i, f, FINDING_CODES[f], algorithm, version, FINDING_COLOURS[FINDINGS.index(f)])
                    for i, f in enumerate(names, 1)]
        masks = np.stack([label == FINDINGS.index(f) + 1 for f in names], axis=-1)  # (H, W, N)
    else:
        segments = [_segment(1, NO_FINDING, NO_FINDING_CODE, algorithm, version)]
        masks = np.zeros((*label.shape, 1), dtype=bool)
    seg = hd.seg.Segmentation(
        source_images=[ds], pixel_array=masks[None].astype(np.uint8),  # (1 frame, H, W, N segments)
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY, segment_descriptions=segments,
        series_instance_uid=generate_uid(), series_number=SERIES_NUMBER, sop_instance_uid=generate_uid(),
        instance_number=1, manufacturer=MANUFACTURER, manufacturer_model_name=algorithm,
        software_versions=_package_version(), device_serial_number="0",
        series_description=(description or f"{algorithm}: {', '.join(names) or NO_FINDING}")[:64],
        content_label="XFLOW", content_description=f"{algorithm} findings"[:64],
        omit_empty_frames=False)
    _add_viewer_geometry(seg)
    if out is not None:
        seg.save_as(str(out))
        if not Path(out).is_file() or Path(out).stat().st_size == 0:
            raise RuntimeError(f"DICOM SEG writer produced no file at {out}")
    return seg


def _source_header(ds: Any) -> Any:
    """The source's header (no pixels) with what highdicom needs of a lossy-compressed source:
    a JPEG radiograph flagged ``LossyImageCompression 01`` often lacks the (optional in the
    image, required in the SEG) ``LossyImageCompressionRatio``; it is computed from the file
    (stored bytes / compressed bytes), not invented."""
    from pydicom import Dataset

    header = Dataset()
    header.update({tag: elem for tag, elem in ds.items() if tag != 0x7FE00010})
    header.file_meta = getattr(ds, "file_meta", Dataset())
    if str(header.get("LossyImageCompression", "")) == "01":
        if "LossyImageCompressionRatio" not in header:
            stored = int(ds.Rows) * int(ds.Columns) * int(ds.BitsAllocated) // 8 * int(ds.get("SamplesPerPixel", 1))
            compressed = len(ds.PixelData) if "PixelData" in ds else 0
            header.LossyImageCompressionRatio = f"{stored / compressed:.4g}" if compressed else "1"
        if "LossyImageCompressionMethod" not in header:
            header.LossyImageCompressionMethod = "ISO_10918_1"
    return header


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("monailabel-xflow")
    except PackageNotFoundError:
        return "0"


def _add_viewer_geometry(seg: Any) -> None:
    """Plane orientation/position as OHIF derives them for a radiograph without them (see the
    module docstring); left alone when highdicom wrote the source's own geometry."""
    from pydicom import Dataset
    from pydicom.sequence import Sequence as DicomSequence

    shared = seg.SharedFunctionalGroupsSequence[0]
    if "PlaneOrientationSequence" in shared:
        return
    orientation = Dataset()
    orientation.ImageOrientationPatient = list(OHIF_ORIENTATION)
    shared.PlaneOrientationSequence = DicomSequence([orientation])
    for frame in seg.PerFrameFunctionalGroupsSequence:
        if "PlanePositionSequence" not in frame:
            position = Dataset()
            position.ImagePositionPatient = [0.0, 0.0, 0.0]
            frame.PlanePositionSequence = DicomSequence([position])


# --- reading ----------------------------------------------------------------------------------

def finding_of_segment(segment: Any) -> str | None:
    """The finding a SEG segment (a SegmentSequence item) stands for, None for "no finding".

    Raises:
        LabelError: neither its type code nor its label names one of the seven findings.
    """
    from monailabel_xflow.instructions import InstructionError, parse_instruction

    label = str(getattr(segment, "SegmentLabel", "") or "").strip()
    types = getattr(segment, "SegmentedPropertyTypeCodeSequence", None) or []
    if types:
        value, scheme = str(types[0].CodeValue), str(types[0].CodingSchemeDesignator)
        for finding, code in FINDING_CODES.items():
            if (code.value, code.scheme) == (value, scheme):
                return finding
        if (value, scheme) in READ_ALIASES:
            return READ_ALIASES[(value, scheme)]
        if (NO_FINDING_CODE.value, NO_FINDING_CODE.scheme) == (value, scheme):
            return None
    if label.lower() == NO_FINDING:
        return None
    try:
        return parse_instruction(f"segment the {label}").finding
    except InstructionError:
        pass
    raise LabelError(f"SEG segment {getattr(segment, 'SegmentNumber', '?')} ({label or 'no label'}) names none of "
                     f"the findings {', '.join(FINDINGS)} (by SNOMED/DCM type code or by label)")


def read_seg(dataset: Any, shape: tuple[int, int] | None = None) -> np.ndarray:
    """A single-frame-image SEG (ours or another tool's) -> ``uint8 (H, W)`` label map.

    Args:
        dataset: the SEG (pydicom Dataset or a file path).
        shape: the image's ``(H, W)``; a SEG of another size is refused.

    Raises:
        LabelError: not a SEG of one radiograph, wrong size, or a segment naming no finding.
    """
    import pydicom

    ds = dataset if isinstance(dataset, pydicom.Dataset) else pydicom.dcmread(str(dataset))
    if str(getattr(ds, "Modality", "")) != "SEG":
        raise LabelError(f"not a DICOM SEG (Modality {getattr(ds, 'Modality', None)!r})")
    rows, cols = int(ds.Rows), int(ds.Columns)
    if shape is not None and (rows, cols) != tuple(shape):
        raise LabelError(f"SEG is {cols} x {rows} (W x H) but the image is {shape[1]} x {shape[0]}")
    values = {int(s.SegmentNumber): finding_of_segment(s) for s in ds.SegmentSequence}
    label = np.zeros((rows, cols), dtype=np.uint8)
    numbers = [n for n, f in values.items() if f is not None]
    if not numbers:
        return label
    # pydicom unpacks BINARY (1-bit) and FRACTIONAL frames alike; highdicom 0.22's reader cannot
    # read its own SEGs of sources without a Frame of Reference (Pixel Measures lacks SliceThickness)
    frames = np.asarray(ds.pixel_array).reshape(-1, rows, cols)
    if str(getattr(ds, "SegmentationType", "BINARY")) == "FRACTIONAL":
        frames = frames >= max(1, int(getattr(ds, "MaximumFractionalValue", 255))) / 2
    per_frame = ds.PerFrameFunctionalGroupsSequence
    if len(per_frame) != len(frames):
        raise LabelError(f"SEG has {len(frames)} frames but {len(per_frame)} per-frame descriptions")
    masks: dict[int, np.ndarray] = {}
    shared = ds.SharedFunctionalGroupsSequence[0] if "SharedFunctionalGroupsSequence" in ds else None
    for frame, group in zip(frames, per_frame):
        ident = group.get("SegmentIdentificationSequence") or (shared.get("SegmentIdentificationSequence")
                                                               if shared is not None else None)
        if not ident:
            raise LabelError("SEG frame without a Segment Identification Sequence")
        number = int(ident[0].ReferencedSegmentNumber)
        if number not in values:
            raise LabelError(f"SEG frame refers to segment {number}, which the SEG does not describe")
        masks[number] = masks.get(number, np.zeros((rows, cols), bool)) | (frame > 0)
    for n in sorted(numbers, key=lambda k: FINDINGS.index(values[k])):
        if n in masks:
            label[masks[n]] = FINDINGS.index(values[n]) + 1
    return label


def seg_summary(dataset: Any) -> Mapping[str, Any]:
    """What a SEG says in words (for logs and result params): series, findings, frames."""
    return {
        "SeriesInstanceUID": str(dataset.SeriesInstanceUID),
        "SOPInstanceUID": str(dataset.SOPInstanceUID),
        "segments": {int(s.SegmentNumber): str(s.SegmentLabel) for s in dataset.SegmentSequence},
        "frames": int(getattr(dataset, "NumberOfFrames", 1)),
    }
