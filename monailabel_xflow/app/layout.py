"""Images in, label maps out, in the layout MONAI Label clients expect.

Inside XFlow every array is ``(H, W)`` (:mod:`monailabel_xflow.geometry`). MONAI Label, Slicer
and OHIF hold a radiograph the way MONAI's readers do: ``(W, H)`` for PNG and ``(W, H, 1)``
with an affine for NIfTI (what the DICOMweb datastore caches from a CR/DX series). This
module converts at the border and nowhere else; it does not transpose by itself: it goes through
:func:`monailabel_xflow.transforms.load_cxr`, :func:`~monailabel_xflow.transforms.loading.save_nifti_2d`
and the loader's reader-order helpers, the package's one transpose.

Label files written here:

* PNG or JPEG image -> 8-bit PNG label of the same ``W x H`` (never JPEG: lossy);
* NIfTI image -> NIfTI label ``(W, H, 1)`` with the image's own affine (overlays in Slicer);
* DICOM file -> NIfTI label ``(W, H, 1)`` with the DICOM spacing (``save_nifti_2d``).

Label values are the findings' label values 1..7 (:func:`monailabel_xflow.vocabulary.label_value`),
0 is background.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from monailabel_xflow.app.errors import ImageNotFoundError, LabelError
from monailabel_xflow.vocabulary import FINDINGS

MAX_LABEL_VALUE = len(FINDINGS)
FINDING_COLOURS: tuple[tuple[int, int, int], ...] = (
    (230, 25, 75),
    (60, 180, 75),
    (255, 225, 25),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
)
"""RGB of label value ``v`` at index ``v - 1`` (overlays and DICOM SEG segments alike)."""


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
    """Load the radiograph of a request.

    Args:
        path: the file MONAI Label resolved (``""`` when the datastore does not know the id).
        image_id: the id the client sent, for the error message.

    Returns:
        ``(image, ref)``: ``float32 (H, W)`` in ``[0, 1]`` and the geometry a label must match.

    Raises:
        ImageNotFoundError: no file (unknown image id).
        CXRLoadError: not a loadable frontal radiograph (corrupt, not an image, several slices,
            a lateral view ...).
    """
    if not path or not os.path.exists(path):
        raise ImageNotFoundError(f"unknown image {image_id or path!r}: the datastore has no such image")
    if os.path.isdir(path):
        from monailabel_xflow.transforms.loading import CXRLoadError

        raise CXRLoadError(path, "a DICOM series folder; the app needs MONAI_LABEL_DICOMWEB_CONVERT_TO_NIFTI=true")
    from monailabel_xflow.transforms.loading import load_cxr

    image, meta = load_cxr(path)
    _refuse_lateral_series(path)
    ref = ImageRef(
        str(path), (int(image.shape[0]), int(image.shape[1])), str(meta["format"]), meta.get("spacing"), meta
    )
    return image, ref


def _refuse_lateral_series(path: str | os.PathLike) -> None:
    """A NIfTI cached by the DICOMweb datastore lost the DICOM tags; its series folder
    (same name without ``.nii.gz``) still has them: refuse lateral views as ``load_cxr`` does."""
    series_dir = Path(str(path)[: -len(".nii.gz")]) if str(path).endswith(".nii.gz") else None
    if series_dir is None or not series_dir.is_dir():
        return
    first = next(iter(sorted(series_dir.glob("*.dcm"))), None)
    if first is None:
        return
    import pydicom

    from monailabel_xflow.transforms.loading import LATERAL_VIEWS, CXRLoadError

    view = str(pydicom.dcmread(str(first), stop_before_pixels=True).get("ViewPosition", "") or "").strip().upper()
    if view in LATERAL_VIEWS:
        raise CXRLoadError(path, f"lateral view (ViewPosition {view}); XFlow reads frontal views")


def write_label(label_hw: np.ndarray, ref: ImageRef, directory: str | None = None) -> str:
    """Write an ``(H, W)`` label map for ``ref``'s image; returns a new temporary file path.

    Raises:
        LabelError: the label does not have the image's ``(H, W)``.
    """
    label = np.asarray(label_hw)
    if label.shape != ref.shape:
        raise LabelError(f"label of shape {label.shape} for an image of shape (H, W) = {ref.shape}")
    label = label.astype(np.uint8)
    fd, out = tempfile.mkstemp(suffix=ref.label_suffix, dir=directory)
    os.close(fd)
    if ref.label_suffix == ".png":
        from PIL import Image

        # PIL takes (H, W) rows as they are; fast zlib level: label maps compress well anyway
        Image.fromarray(label, mode="L").save(out, compress_level=1)
        return out
    from monailabel_xflow.transforms.loading import save_nifti_2d

    save_nifti_2d(label, out, spacing=ref.spacing)
    if ref.format == "NIfTI":  # keep the image's own affine so the label overlays it exactly
        import nibabel as nib

        written = cast(nib.Nifti1Image, nib.load(out))  # both NIfTI (this branch)
        image = cast(nib.Nifti1Image, nib.load(ref.path))
        nib.save(nib.Nifti1Image(np.asarray(written.dataobj), image.affine, written.header), out)
    return out


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
            if values.ndim == 3:
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


def overlay_png(image: np.ndarray, label_hw: np.ndarray) -> bytes:
    """A PNG of the image with the label map tinted over it (one colour per finding)."""
    import io

    from PIL import Image

    from monailabel_xflow.rendering import overlay

    masks = [label_hw == value for value in range(1, MAX_LABEL_VALUE + 1)]
    rgb = overlay(image, masks, colors=FINDING_COLOURS, outline=False, alpha=0.45)
    buf = io.BytesIO()
    Image.fromarray(rgb, mode="RGB").save(buf, format="PNG")
    return buf.getvalue()
