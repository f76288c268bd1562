"""Label maps: built from findings' masks, written once, read back bounded (the one label I/O).

Inside XFlow a label map is ``uint8 (H, W)``: 0 background, a finding's value elsewhere
(:func:`monailabel_xflow.vocabulary.label_value`, 1..7, unless a request numbers its own findings
1..N). On disk it has the layout MONAI Label clients expect:

* PNG or JPEG image -> 8-bit PNG of the same ``W x H`` (never JPEG: lossy);
* NIfTI image -> NIfTI ``(W, H, 1)`` with the image's own affine (overlays in Slicer);
* DICOM file -> NIfTI ``(W, H, 1)`` with the DICOM spacing (:func:`.loading.nifti_2d`);
* on request NRRD (what OHIF asks) or another dtype; NIfTI and NRRD carry the answer sentence.

Each file is built in memory and written in one pass; the transpose is the loader's
(:func:`.loading.to_reader_order` / :func:`.loading.from_reader_order`).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from monailabel_xflow.errors import ImageNotFoundError, InputError
from monailabel_xflow.vocabulary import FINDINGS, label_value

MAX_LABEL_VALUE = len(FINDINGS)
RESULT_EXTENSIONS = (".nii.gz", ".nii", ".nrrd", ".png")
RESULT_DTYPES = ("uint8", "uint16", "int16", "int32", "float32")
NIFTI_COMMENT = 6  # NIfTI extension code of a JSON comment: ``{"xflow_answer": ...}``


class LabelError(InputError):
    """A label file that does not fit its image (size) or the vocabulary (values 0..7)."""


@dataclass(frozen=True)
class ImageRef:
    """What a label written for an image must match.

    Attributes:
        path: the image file.
        shape: ``(H, W)`` in pixels.
        format: ``"PNG"``, ``"JPEG"``, ``"DICOM"`` or ``"NIfTI"`` (from ``load_cxr``).
        spacing: ``(row_mm, col_mm)`` or None.
        meta: the loader's meta dict.
    """

    path: str
    shape: tuple[int, int]
    format: str
    spacing: tuple[float, float] | None
    meta: dict[str, Any]

    @property
    def label_suffix(self) -> str:
        return ".png" if self.format in ("PNG", "JPEG") else ".nii.gz"


def load_image(path: str | os.PathLike | None, image_id: str | None = None) -> tuple[np.ndarray, ImageRef]:
    """The radiograph a label is for, and what that label must match: ``(image, ref)``,
    ``float32 (H, W)`` in ``[0, 1]`` (:func:`.loading.load_cxr`, the one transpose) and its
    :class:`ImageRef`. ``path`` is the file a datastore resolved (``""`` for an unknown id); a
    NIfTI cached from a DICOMweb series is refused as the series' lateral view would be
    (:func:`.loading.refuse_lateral_series`).

    Raises:
        ImageNotFoundError: no file (unknown image id).
        CXRLoadError: not a loadable frontal radiograph, or a DICOM series folder.
    """
    from monailabel_xflow.transforms.loading import CXRLoadError, load_cxr, refuse_lateral_series

    if not path or not os.path.exists(path):
        raise ImageNotFoundError(f"unknown image {image_id or path!r}: the datastore has no such image")
    if os.path.isdir(path):
        raise CXRLoadError(path, "a DICOM series folder; the app needs MONAI_LABEL_DICOMWEB_CONVERT_TO_NIFTI=true")
    image, meta = load_cxr(path)
    refuse_lateral_series(path)
    ref = ImageRef(
        str(path), (int(image.shape[0]), int(image.shape[1])), str(meta["format"]), meta.get("spacing"), meta
    )
    return image, ref


# --- label maps from masks ------------------------------------------------------------------


def paint(
    masks: Iterable[tuple[str, np.ndarray]], shape: tuple[int, ...], values: Mapping[str, int] | None = None
) -> tuple[np.ndarray, int]:
    """One ``uint8 (H, W)`` label map from ``(finding, bool (H, W) mask)`` pairs, each painted with
    its finding's value (``values``, default the fixed 1..7) in FINDINGS order (later wins).

    Returns:
        ``(label, overlap_pixels)``: how many painted pixels a later finding covered.

    Raises:
        ValueError: a mask not of ``shape`` (a model's bug, not bad input).
    """
    label = np.zeros(shape, dtype=np.uint8)
    covered = np.zeros(shape, dtype=bool)
    overlap = 0
    for finding, mask in sorted(masks, key=lambda fm: label_value(fm[0])):
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != shape:
            raise ValueError(f"a mask of shape {mask.shape} for an image of shape {shape}")
        overlap += int((mask & covered).sum())
        label[mask] = values[finding] if values else label_value(finding)
        covered |= mask
    return label, overlap


def finding_masks(masks: Iterable[tuple[str, np.ndarray]], shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Each finding's full ``bool (H, W)`` mask, the union of its pairs, overlaps kept (what a DICOM
    SEG's segments hold, where :func:`paint` lets a later finding cover an earlier one)."""
    out: dict[str, np.ndarray] = {}
    for finding, mask in masks:
        out[finding] = out.get(finding, np.zeros(shape, bool)) | np.asarray(mask, dtype=bool)
    return out


def present_label_names(label: np.ndarray, also: Iterable[str] = ()) -> dict[str, int]:
    """``label_names`` of a label map holding fixed values 1..7: the findings painted in it plus
    ``also``, in FINDINGS order."""
    painted = {FINDINGS[int(v) - 1] for v in np.unique(label) if 0 < v <= len(FINDINGS)}
    also = set(also)
    return {f: label_value(f) for f in FINDINGS if f in painted or f in also}


def to_fixed_values(label: np.ndarray, label_names: Mapping[str, int] | None) -> np.ndarray:
    """A label map numbered by ``label_names`` (name -> value in it) -> fixed finding values 1..7
    (what stored SEGs and saved labels hold). Values no name maps become 0."""
    if not label_names:
        return label
    out = np.zeros_like(label)
    for name, value in label_names.items():
        if name in FINDINGS:
            out[label == int(value)] = label_value(name)
    return out


# --- files ----------------------------------------------------------------------------------


_RESULTS: list[str] = []  # the results folder, once checked
_RESULTS_LOCK = threading.Lock()


def results_folder() -> str:
    """The folder result files are written to: ``xflow-results-<uid>`` in the temporary folder,
    private to this user (0700), shared by the server's processes and kept between runs.

    MONAI Label's client saves a result under the file *name* the server sent, in its own
    temporary folder, and the server deletes its copy once sent. With the server's copy in the
    temporary folder itself, a client on the same machine (the README's, or any script's with the
    default folder) had its saved result deleted by the server a moment later. A subfolder keeps
    the two paths apart. A folder of that name that is not this user's private folder (a link,
    another owner, open permissions) is not used: a fresh private one is made instead.
    """
    with _RESULTS_LOCK:
        if _RESULTS and os.path.isdir(_RESULTS[-1]):
            return _RESULTS[-1]
        folder = os.path.join(tempfile.gettempdir(), f"xflow-results-{os.getuid()}")
        with contextlib.suppress(FileExistsError):
            os.mkdir(folder, 0o700)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            folder = tempfile.mkdtemp(prefix="xflow-results-")
        _RESULTS.append(folder)
        return folder


def write_label(
    label_hw: np.ndarray,
    ref: ImageRef,
    directory: str | None = None,
    extension: str | None = None,
    dtype: str = "uint8",
    answer: str = "",
) -> str:
    """Write an ``(H, W)`` label map for ``ref``'s image in one pass; returns a new temporary file.

    Args:
        label_hw: ``(H, W)`` integer label map.
        ref: the image it belongs to (shape, format, spacing, its own NIfTI affine).
        directory: where the file goes (default :func:`results_folder`).
        extension: one of :data:`RESULT_EXTENSIONS`; None = the image's own label format.
        dtype: one of :data:`RESULT_DTYPES` (PNG: ``uint8`` only).
        answer: the answer sentence, put into NIfTI (``descrip`` and a JSON comment extension)
            and NRRD (key ``xflow_answer``) headers for clients that get only the file.

    Raises:
        LabelError: the label does not have the image's ``(H, W)``; a dtype PNG cannot hold.
    """
    label = np.asarray(label_hw)
    if label.shape != ref.shape:
        raise LabelError(f"label of shape {label.shape} for an image of shape (H, W) = {ref.shape}")
    extension = extension or ref.label_suffix
    fd, out = tempfile.mkstemp(suffix=extension, dir=directory or results_folder())
    os.close(fd)
    if extension == ".png":
        if dtype != "uint8":
            raise LabelError(f"result_dtype {dtype} cannot be written as PNG; use uint8 or .nii.gz / .nrrd")
        from PIL import Image

        # PIL takes (H, W) rows as they are; fast zlib level: label maps compress well anyway
        Image.fromarray(label.astype(np.uint8), mode="L").save(out, compress_level=1)
        return out
    import nibabel as nib

    from monailabel_xflow.transforms.loading import nifti_2d

    affine = cast(nib.Nifti1Image, nib.load(ref.path)).affine if ref.format == "NIfTI" else None  # header only
    nifti = nifti_2d(label.astype(np.uint8).astype(dtype), ref.spacing, affine)  # (W, H, 1)
    if extension == ".nrrd":
        import nrrd

        affine = nifti.affine.copy()
        affine[:2] *= -1  # NIfTI RAS -> NRRD "left-posterior-superior"
        header = {
            "space": "left-posterior-superior",
            "space directions": affine[:3, :3].T,
            "space origin": affine[:3, 3],
            "kinds": ["domain"] * 3,
            "encoding": "raw",
            "xflow_answer": answer.replace("\n", " "),
        }
        nrrd.write(out, np.asarray(nifti.dataobj), header=header, index_order="F")
        _drop_nrrd_timestamp(out)
        return out
    if answer:
        nifti.header["descrip"] = answer.encode("utf-8")[:79]
        nifti.header.extensions.append(
            nib.nifti1.Nifti1Extension(NIFTI_COMMENT, json.dumps({"xflow_answer": answer}).encode())
        )
    nib.save(nifti, out)
    return out


def answer_of_file(path: str) -> str | None:
    """The answer sentence :func:`write_label` put into a label file (NRRD or NIfTI), or None."""
    if path.endswith(".nrrd"):
        import nrrd

        return nrrd.read_header(path).get("xflow_answer")
    import nibabel as nib

    for ext in cast(nib.Nifti1Image, nib.load(path)).header.extensions:
        if ext.get_code() == NIFTI_COMMENT:
            try:
                return json.loads(ext.get_content()).get("xflow_answer")
            except ValueError:
                continue
    return None


def read_label(path: str | os.PathLike, shape: tuple[int, int] | None = None) -> np.ndarray:
    """Read a label map written by a client or by :func:`write_label` as ``uint8 (H, W)``.

    The format is the file's content (:func:`~monailabel_xflow.transforms.loading.sniff_format`),
    never its name, and the decoders are the loader's bounded ones: sizes refused from the header,
    NRRD read without following a detached ``data file``, compressed data never inflated past the
    declared size (:func:`~monailabel_xflow.transforms.loading.read_nrrd`,
    :func:`~monailabel_xflow.transforms.loading.open_nifti`).

    Args:
        path: PNG, NIfTI (``(W, H)`` or ``(W, H, 1)``) or NRRD label.
        shape: the image's ``(H, W)``; when given, a label of another size is refused.

    Raises:
        LabelError: unreadable, not 2D, wrong size, or values outside ``0..7``. The message names
            the file by its base name only.
    """
    from monailabel_xflow.transforms.loading import (
        CXRLoadError,
        check_pixel_count,
        from_reader_order,
        open_nifti,
        read_nrrd,
        shown_name,
        sniff_format,
    )

    name = shown_name(path, "label file")
    try:
        fmt = sniff_format(path)
        if fmt == "PNG":
            from PIL import Image

            with Image.open(path) as img:
                check_pixel_count(img.size, path, "label")  # before decoding
                values = np.asarray(img)  # (H, W) as PIL holds rows
            if values.ndim == 3:  # a grey label saved as RGB(A) is fine; a colour one is not read as its red
                colours = values[..., : min(3, values.shape[-1])]
                if colours.shape[-1] > 1 and np.any(colours != colours[..., :1]):
                    raise LabelError(
                        f"{name} is a colour PNG whose channels differ; save the label map as one channel "
                        f"(values 0..{MAX_LABEL_VALUE})"
                    )
                values = values[..., 0]
        elif fmt in ("NIfTI", "NIfTI-gz", "NRRD"):
            if fmt == "NRRD":  # the file's (W, H[, 1]); ITK would drop or move a size-1 axis
                voxels = read_nrrd(path, "label")
            else:
                reader, data = open_nifti(path, "label")
                voxels, _ = reader.get_data(data)  # (W, H[, 1])
            voxels = np.asarray(voxels)
            if voxels.ndim < 2 or any(n != 1 for n in voxels.shape[2:]):
                raise LabelError(f"label of shape {voxels.shape} is not 2D (expected (W, H) or (W, H, 1))")
            values = from_reader_order(voxels.reshape(voxels.shape[:2]))
        else:
            raise LabelError(f"unreadable {name}: not PNG, NIfTI (.nii, .nii.gz) or NRRD by its content")
    except LabelError:
        raise
    except CXRLoadError as exc:
        raise LabelError(f"{name}: {exc.reason}") from exc
    except Exception as exc:
        raise LabelError(f"unreadable {name} ({type(exc).__name__})") from exc
    if shape is not None and tuple(values.shape) != tuple(shape):
        h, w = shape
        raise LabelError(f"label is {values.shape[1]} x {values.shape[0]} (W x H) but the image is {w} x {h}")
    if values.size and (values.min() < 0 or values.max() > MAX_LABEL_VALUE or not np.all(np.mod(values, 1) == 0)):
        raise LabelError(
            f"label values must be integers 0..{MAX_LABEL_VALUE} (0 background, "
            f"1..{MAX_LABEL_VALUE} the findings), got {np.unique(values)[:10].tolist()}"
        )
    return values.astype(np.uint8)


MAX_FINDING_COVER = 0.95
"""Largest share of the image one finding of a saved label may cover: more is an inverted mask
(or a label of the whole image), never a lesion; trained on, it was promoted and served."""


def check_saved_label(label: np.ndarray) -> None:
    """Refuse a person's label that no finding could draw: one finding over
    :data:`MAX_FINDING_COVER` of the image.

    Raises:
        LabelError: naming the finding and its share.
    """
    counts = np.bincount(label.ravel(), minlength=MAX_LABEL_VALUE + 1)
    for value in range(1, MAX_LABEL_VALUE + 1):
        share = counts[value] / max(label.size, 1)
        if share > MAX_FINDING_COVER:
            finding = next((f for f in FINDINGS if label_value(f) == value), str(value))
            raise LabelError(
                f"label value {value} ({finding}) covers {share:.0%} of the image: an inverted mask? "
                "A finding is the lesion's pixels, background 0"
            )


def _drop_nrrd_timestamp(path: str) -> None:
    """Remove pynrrd's ``# on <date>(GMT).`` comment line, so that the same label and answer give
    the same file, byte for byte (an answer served from the workspace store is the fresh one)."""
    with open(path, "rb") as fh:
        data = fh.read()
    end = data.find(b"\n\n")  # the header ends at the first empty line
    head = data[: end if end >= 0 else len(data)]
    start = head.find(b"\n# on ")
    if start < 0:
        return
    stop = head.find(b"\n", start + 1)
    with open(path, "wb") as fh:
        fh.write(data[:start] + data[stop:])
