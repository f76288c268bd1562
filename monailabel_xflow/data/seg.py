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
* **overlaps are kept**: each finding's segment holds its full mask (:func:`write_seg` takes the
  per-finding masks; a binary SEG may overlap), so the SEG shows everything the model answered
  even where two findings cover the same pixels;
* highdicom builds and validates the object from the source radiograph. A CR/DX image has no
  Frame of Reference, so highdicom (rightly) writes no plane geometry; OHIF's SEG loader,
  however, reads the plane orientation unconditionally and compares it with what it derives for
  the source image. The current OHIF (3.13, ``xflow ohif``) derives ``[1, 0, 0, 0, 1, 0]`` for a
  CR/DX without ``ImageOrientationPatient`` and refuses anything else as "orthogonal to the
  acquisition plane"; :func:`write_seg` adds exactly that (shared Plane Orientation, per-frame
  Plane Position ``[0, 0, 0]``) and nothing else, so the frames stay tied to the source instance
  through their Derivation Image Sequence. (The older OHIF bundled with MONAI Label 0.8.5 derives
  ``[0, 1, 0, 0, 0, -1]`` instead; no single orientation opens in both, and we follow the
  current one.)

Codes: :data:`monailabel_xflow.vocabulary.FINDING_CODES` (SNOMED CT / DCM, with their sources).

Reading (:func:`read_seg_masks`, :func:`read_seg`) accepts SEGs written here and by other tools:
bitmap (BINARY) and FRACTIONAL SEGs (highdicom, 3D Slicer, OHIF's bitmap export) and the **Label
Map** SEGs the current OHIF stores by default (``SegmentationType LABELMAP``, pixel value =
segment number, RLE-compressed), each segment mapped to a finding by its type code, else by its
label ("pleural effusion", "Edema" ...). A label map paints overlapping segments in FINDINGS
order (later wins), as the ``xflow`` task paints its label maps. Anything else is a
:class:`~monailabel_xflow.app.errors.LabelError` naming what is wrong.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Container, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.files import atomic_write
from monailabel_xflow.rendering import FINDING_COLOURS
from monailabel_xflow.transforms.labels import LabelError
from monailabel_xflow.vocabulary import (
    CATEGORY,
    FINDING_CODES,
    FINDINGS,
    NO_FINDING,
    NO_FINDING_CODE,
    READ_ALIASES,
    Coded,
)

logger = logging.getLogger(__name__)

PLANE_ORIENTATION = (1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
"""The plane orientation the current OHIF (3.13) derives for a radiograph without
ImageOrientationPatient (DESIGN §17); the bundled OHIF of MONAI Label 0.8.5 derives
``[0, 1, 0, 0, 0, -1]`` and refuses this one."""
SERIES_NUMBER = 300
MANUFACTURER = "monailabel-xflow"


def concept(code: Coded) -> Any:
    """A vocabulary code as highdicom's ``CodedConcept``."""
    from highdicom.sr import CodedConcept

    return CodedConcept(value=code.value, scheme_designator=code.scheme, meaning=code.meaning)


LO_MAX_CHARS = 64
"""DICOM's Long String (LO) limit, e.g. SeriesDescription and ContentDescription (PS3.5 6.2)."""


def long_string(text: str, limit: int = LO_MAX_CHARS) -> str:
    """``text`` as a DICOM LO value: unchanged when it fits in ``limit`` characters, else cut at the
    last word boundary that leaves room for an ASCII ``...`` (in every character set), trailing
    commas and spaces dropped: ``"XFlow: cardiomegaly, ..., consolidation..."``; a single word
    longer than the limit is cut inside it. Backslashes (LO's value separator) become ``/``.

    Raises:
        ValueError: ``limit`` is below 4 (no room for a character and the ellipsis).
    """
    if limit < 4:
        raise ValueError(f"limit must be >= 4, got {limit}")
    text = " ".join(text.replace("\\", "/").split())
    if len(text) <= limit:
        return text
    room = limit - 3
    head = text[:room]
    if text[room] != " ":  # the cut falls inside a word: end at the word before it
        head = head.rpartition(" ")[0] or head
    return head.rstrip(" ,;:") + "..."


def dicom_lab(rgb: tuple[int, int, int]) -> list[int]:
    """An sRGB colour as DICOM's RecommendedDisplayCIELabValue (CIELab, D65, scaled to 0..65535)."""
    from highdicom.color import CIELabColor
    from skimage.color import rgb2lab

    lab = rgb2lab(np.asarray(rgb, dtype=float).reshape(1, 1, 3) / 255.0)[0, 0]
    return [int(v) for v in CIELabColor(*(float(v) for v in lab)).value]


def _segment(
    number: int, name: str, code: Coded, algorithm: str, version: str, rgb: tuple[int, int, int] = (128, 128, 128)
) -> Any:
    import highdicom as hd
    from pydicom.sr.codedict import codes
    from pydicom.sr.coding import Code

    # pydicom types codes.DCM as a union of its dictionary kinds; the attribute is a Code
    family: Code = codes.DCM.ArtificialIntelligence  # type: ignore[union-attr,assignment]
    algo = hd.AlgorithmIdentificationSequence(name=algorithm, family=family, version=version or "0")
    segment = hd.seg.SegmentDescription(
        segment_number=number,
        segment_label=name,
        segmented_property_category=concept(CATEGORY),
        segmented_property_type=concept(code),
        algorithm_type=hd.seg.SegmentAlgorithmTypeValues.AUTOMATIC,
        algorithm_identification=algo,
    )
    segment.RecommendedDisplayCIELabValue = dicom_lab(rgb)  # viewers colour findings as our overlays do
    return segment


def segment_findings(
    label_hw: np.ndarray, findings: Sequence[str] = (), masks: Mapping[str, np.ndarray] | None = None
) -> list[str]:
    """The findings a SEG holds, in FINDINGS order: those painted in ``label_hw`` (or with pixels
    in ``masks``) plus those asked (``findings``, present or not). Empty = "no finding".

    Raises:
        LabelError: a finding (asked or a key of ``masks``) is not one of the seven.
    """
    values = {int(v) for v in np.unique(label_hw) if v}
    unknown = [f for f in (*findings, *(masks or {})) if f not in FINDINGS]
    if unknown:
        raise LabelError(f"unknown findings {unknown}; supported: {', '.join(FINDINGS)}")
    painted = {f for f, m in (masks or {}).items() if np.any(m)}
    return [f for i, f in enumerate(FINDINGS, 1) if i in values or f in painted or f in findings]


def write_seg(
    label_hw: np.ndarray,
    source: Any,
    out: str | Path | None = None,
    findings: Sequence[str] = (),
    algorithm: str = "XFlow",
    version: str = "",
    description: str = "",
    masks: Mapping[str, np.ndarray] | None = None,
) -> Any:
    """An ``(H, W)`` label map (0 background, 1..7 the findings' label values) as a SEG of ``source``.

    Args:
        label_hw: ``(H, W)`` integer label map in the source's rows x columns.
        source: the CR/DX image (a pydicom Dataset or a file path).
        out: where to save the SEG; None only returns it.
        findings: findings asked for; each becomes a segment even when absent (empty frame).
        algorithm / version: recorded in every segment's Algorithm Identification.
        description: SeriesDescription (default ``"XFlow: <findings>"``), cut to DICOM's 64
            characters at a word boundary with ``...`` (:func:`long_string`).
        masks: ``{finding: bool (H, W)}``, each finding's full mask (overlaps kept); a finding
            given here is written from its mask instead of from ``label_hw`` (where a later
            finding may have painted over it).

    Returns:
        The :class:`highdicom.seg.Segmentation` (a pydicom Dataset).

    Raises:
        LabelError: the label or a mask does not match the source's rows x columns, the label has
            values outside 0..7, or a finding is unknown.
    """
    import highdicom as hd
    import pydicom
    from pydicom.uid import generate_uid

    ds = _source_header(source if isinstance(source, pydicom.Dataset) else pydicom.dcmread(str(source)))
    label = np.asarray(label_hw)
    shape = (int(ds.Rows), int(ds.Columns))
    for name, array in (("label", label), *((f"{f} mask", np.asarray(m)) for f, m in (masks or {}).items())):
        if array.shape != shape:
            raise LabelError(f"{name} of shape {array.shape} does not match the image's rows x columns {shape}")
    if label.size and (label.min() < 0 or label.max() > len(FINDINGS)):
        raise LabelError(f"label values must be 0..{len(FINDINGS)}, got {np.unique(label)[:10].tolist()}")
    names = segment_findings(label, findings, masks)
    if names:
        segments = [
            _segment(i, f, FINDING_CODES[f], algorithm, version, FINDING_COLOURS[FINDINGS.index(f)])
            for i, f in enumerate(names, 1)
        ]
        full = dict(masks or {})
        masks_hwn = np.stack(
            [np.asarray(full[f], bool) if f in full else label == FINDINGS.index(f) + 1 for f in names], axis=-1
        )  # (H, W, N), segments may overlap
    else:
        segments = [_segment(1, NO_FINDING, NO_FINDING_CODE, algorithm, version)]
        masks_hwn = np.zeros((*label.shape, 1), dtype=bool)
    seg = hd.seg.Segmentation(
        source_images=[ds],
        pixel_array=masks_hwn[None].astype(np.uint8),  # (1 frame, H, W, N segments)
        segmentation_type=hd.seg.SegmentationTypeValues.BINARY,
        segment_descriptions=segments,
        series_instance_uid=generate_uid(),
        series_number=SERIES_NUMBER,
        sop_instance_uid=generate_uid(),
        instance_number=1,
        manufacturer=MANUFACTURER,
        manufacturer_model_name=algorithm,
        software_versions=_package_version(),
        device_serial_number="0",
        series_description=long_string(description or f"{algorithm}: {', '.join(names) or NO_FINDING}"),
        content_label="XFLOW",
        content_description=long_string(f"{algorithm} findings"),
        omit_empty_frames=False,
    )
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
    from pydicom.dataset import FileMetaDataset

    header = Dataset()
    header.update({tag: elem for tag, elem in ds.items() if tag != 0x7FE00010})
    header.file_meta = getattr(ds, "file_meta", FileMetaDataset())
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
    orientation.ImageOrientationPatient = list(PLANE_ORIENTATION)
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
    raise LabelError(
        f"SEG segment {getattr(segment, 'SegmentNumber', '?')} ({label or 'no label'}) names none of "
        f"the findings {', '.join(FINDINGS)} (by SNOMED/DCM type code or by label)"
    )


LABELMAP_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.66.7"
"""Label Map Segmentation Storage (DICOM 2024; what OHIF 3.13 stores by default)."""


def read_seg_masks(dataset: Any, shape: tuple[int, int] | None = None) -> dict[str, np.ndarray]:
    """A single-image SEG (ours or another tool's) -> ``{finding: bool (H, W)}``, overlaps kept.

    BINARY, FRACTIONAL (>= half the maximum counts) and LABELMAP SEGs; every finding a segment
    names is a key, an empty mask when its segment has no pixels; "no finding" segments are not.
    Two segments naming one finding are joined.

    Args:
        dataset: the SEG (pydicom Dataset or a file path).
        shape: the image's ``(H, W)``; a SEG of another size is refused.

    Raises:
        LabelError: not a SEG of one radiograph, wrong size, a segment naming no finding, frames
            that do not say which segment they hold, or pixel data that cannot be decoded.
    """
    import pydicom

    ds = dataset if isinstance(dataset, pydicom.Dataset) else pydicom.dcmread(str(dataset))
    if str(getattr(ds, "Modality", "")) != "SEG" or "SegmentSequence" not in ds:
        raise LabelError(
            f"not a DICOM SEG (Modality {getattr(ds, 'Modality', None)!r}"
            f"{'' if 'SegmentSequence' in ds else ', no Segment Sequence'})"
        )
    rows, cols = int(ds.Rows), int(ds.Columns)
    if shape is not None and (rows, cols) != tuple(shape):
        raise LabelError(f"SEG is {cols} x {rows} (W x H) but the image is {shape[1]} x {shape[0]}")
    findings = {int(s.SegmentNumber): finding_of_segment(s) for s in ds.SegmentSequence}
    out = {f: np.zeros((rows, cols), bool) for f in findings.values() if f is not None}
    if not out:
        return out
    try:  # pydicom unpacks 1-bit BINARY frames and decodes RLE (OHIF's label maps) natively
        frames = _frames(ds, rows, cols)
    except Exception as exc:  # noqa: BLE001  (any decoder failure is a bad SEG, said as such)
        syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", "unknown transfer syntax")
        raise LabelError(f"SEG pixel data cannot be decoded ({syntax}): {type(exc).__name__}: {exc}") from exc
    kind = str(getattr(ds, "SegmentationType", "BINARY")).upper()
    if kind == "LABELMAP" or str(getattr(ds, "SOPClassUID", "")) == LABELMAP_SOP_CLASS:
        unknown = sorted(set(np.unique(frames).tolist()) - {0} - set(findings))
        if unknown:
            raise LabelError(f"label map SEG holds values {unknown[:10]} that no segment describes")
        for number, finding in findings.items():
            if finding is not None:
                out[finding] |= (frames == number).any(axis=0)
        return out
    if kind == "FRACTIONAL":
        frames = frames >= max(1, int(getattr(ds, "MaximumFractionalValue", 255))) / 2
    per_frame = ds.get("PerFrameFunctionalGroupsSequence") or []
    if len(per_frame) != len(frames):
        raise LabelError(f"SEG has {len(frames)} frames but {len(per_frame)} per-frame descriptions")
    shared = ds.SharedFunctionalGroupsSequence[0] if ds.get("SharedFunctionalGroupsSequence") else None
    for frame, group in zip(frames, per_frame, strict=True):
        ident = group.get("SegmentIdentificationSequence") or (
            shared.get("SegmentIdentificationSequence") if shared is not None else None
        )
        if not ident:
            raise LabelError("SEG frame without a Segment Identification Sequence")
        number = int(ident[0].ReferencedSegmentNumber)
        if number not in findings:
            raise LabelError(f"SEG frame refers to segment {number}, which the SEG does not describe")
        name = findings[number]
        if name is not None:
            out[name] |= frame > 0
    return out


def _frames(ds: Any, rows: int, cols: int) -> np.ndarray:
    """The SEG's frames as ``(N, rows, cols)``. pydicom decodes every transfer syntax but one that
    OHIF 3.13 writes in bitmap mode: RLE Lossless with BitsAllocated 1 (pydicom 2.x raises
    NotImplementedError). There each frame is one RLE segment of the frame's packed bits (PS3.5
    Annex G, bits packed little-endian as in native 1-bit data), decoded here with pydicom's own
    RLE segment decoder."""
    from pydicom.uid import RLELossless

    syntax = getattr(getattr(ds, "file_meta", None), "TransferSyntaxUID", None)
    if int(ds.BitsAllocated) != 1 or syntax != RLELossless:
        return np.asarray(ds.pixel_array).reshape(-1, rows, cols)
    from pydicom.encaps import generate_pixel_data_frame
    from pydicom.pixel_data_handlers.rle_handler import _parse_rle_header, _rle_decode_segment

    count = int(getattr(ds, "NumberOfFrames", 1) or 1)
    out = []
    for frame in generate_pixel_data_frame(ds.PixelData, count):
        offsets = _parse_rle_header(frame[:64])
        if len(offsets) != 1:
            raise LabelError(f"1-bit RLE frame with {len(offsets)} segments (expected 1)")
        bits = np.unpackbits(np.frombuffer(_rle_decode_segment(frame[offsets[0] :]), np.uint8), bitorder="little")
        if bits.size < rows * cols:
            raise LabelError(f"1-bit RLE frame holds {bits.size} pixels, {rows * cols} expected")
        out.append(bits[: rows * cols].reshape(rows, cols))
    if len(out) != count:
        raise LabelError(f"SEG has {len(out)} RLE frames but NumberOfFrames {count}")
    return np.stack(out)


def read_seg(dataset: Any, shape: tuple[int, int] | None = None) -> np.ndarray:
    """A single-image SEG -> ``uint8 (H, W)`` label map (:func:`read_seg_masks`, painted in FINDINGS
    order, later wins, as the ``xflow`` task paints). Raises LabelError as :func:`read_seg_masks`."""
    import pydicom

    ds = dataset if isinstance(dataset, pydicom.Dataset) else pydicom.dcmread(str(dataset))
    masks = read_seg_masks(ds, shape)
    label = np.zeros((int(ds.Rows), int(ds.Columns)), dtype=np.uint8)
    for finding in sorted(masks, key=FINDINGS.index):
        label[masks[finding]] = FINDINGS.index(finding) + 1
    return label


# --- SEG series over DICOMweb ----------------------------------------------------------------


def seg_series_metadata(client: Any, study_uid: str, series_uid: str) -> Any:
    """The first instance's metadata of a series as a ``pydicom.Dataset``, None when the PACS has none."""
    import pydicom

    meta = client.retrieve_series_metadata(study_uid, series_uid)
    return pydicom.Dataset.from_json(meta[0]) if meta else None


def fetch_seg_series(client: Any, series_uid: str, folder: str | Path) -> list[Path]:
    """Download a SEG series over DICOMweb into ``folder`` (created) as stored, one
    ``<SOPInstanceUID>.dcm`` per instance; returns the files.

    ``transfer-syntax=*`` matters: a PACS asked for its default syntax must transcode, which
    Orthanc 1.10 cannot do for some SEGs (HTTP 500); pydicom decodes what OHIF stores itself.

    Args:
        client: a ``dicomweb_client.DICOMwebClient``.

    Raises:
        LabelError: the PACS does not list the series.
    """
    import pydicom

    found = [
        pydicom.Dataset.from_json(s) for s in client.search_for_series(search_filters={"SeriesInstanceUID": series_uid})
    ]
    found = [s for s in found if str(s.get("SeriesInstanceUID", "")) == series_uid]
    if not found:
        raise LabelError(f"SEG series {series_uid} is not in the PACS")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for ds in client.retrieve_series(
        str(found[0].StudyInstanceUID), series_uid, media_types=(("application/dicom", "*"),)
    ):
        files.append(folder / f"{ds.SOPInstanceUID}.dcm")
        buf = io.BytesIO()
        ds.save_as(buf, write_like_original=False)
        atomic_write(files[-1], buf.getvalue())  # a kill never leaves half an instance in the cache
    return files


# --- which SEG of a PACS is what ---------------------------------------------------------------

PREANNOTATION_CONTENT_LABEL = "XFLOW_AUTO"
"""ContentLabel of SEGs that XFlow stored unreviewed (``store_seg``, ``xflow preannotate``): viewers
show them, but the datastore does not count them as labels (training on the model's own answers
would teach it nothing). A person who corrects one and stores it (3D Slicer, another SEG tool) makes a new
SEG, which counts."""
LABEL_CONTENT_LABEL = "XFLOW"


def referenced_series(meta: Any) -> str | None:
    """The SeriesInstanceUID of the image a SEG's metadata refers to (None when it names none)."""
    refs = meta.get("ReferencedSeriesSequence") if meta is not None else None
    return str(refs[0].SeriesInstanceUID) if refs else None


def xflow_answers(metas: Iterable[Any]) -> dict[str, set[str]]:
    """``{image SeriesInstanceUID: findings}`` of XFlow's stored answers among SEG ``metas``
    (:data:`PREANNOTATION_CONTENT_LABEL`, ManufacturerModelName ``XFlow`` or unset; ROSALIA's
    are not XFlow's)."""
    out: dict[str, set[str]] = {}
    for meta in metas:
        image = referenced_series(meta)
        if image is None or str(meta.get("ContentLabel", "")) != PREANNOTATION_CONTENT_LABEL:
            continue
        if str(meta.get("ManufacturerModelName", "") or "XFlow") != "XFlow":
            continue
        found = out.setdefault(image, set())
        for segment in meta.get("SegmentSequence", []):
            with contextlib.suppress(ValueError):
                finding = finding_of_segment(segment)
                if finding:
                    found.add(finding)
    return out


def newest_label_segs(
    series: Iterable[tuple[Any, Any]], images: Container[str], skip: Container[str]
) -> dict[str, str]:
    """``{image SeriesInstanceUID: SEG SeriesInstanceUID}``: for each of ``images`` its newest SEG
    that is a label (not :data:`PREANNOTATION_CONTENT_LABEL`, not in ``skip``), newest by
    SeriesDate + SeriesTime, then ContentDate + ContentTime.

    Args:
        series: ``(QIDO row, metadata or None)`` pairs of the PACS's SEG series.
    """
    newest: dict[str, tuple[str, str]] = {}
    for row, meta in series:
        image = referenced_series(meta)
        if image is None or image not in images or str(row.SeriesInstanceUID) in skip:
            continue
        if str(meta.get("ContentLabel", "")) == PREANNOTATION_CONTENT_LABEL:
            continue
        stamp = "".join(str(meta.get(k, "") or "") for k in ("SeriesDate", "SeriesTime", "ContentDate", "ContentTime"))
        if image not in newest or stamp >= newest[image][0]:
            newest[image] = (stamp, str(row.SeriesInstanceUID))
    return {image: seg for image, (_, seg) in newest.items()}
