"""Reading one chest radiograph from disk: one orientation, one intensity range, clear errors.

:func:`load_cxr` is the single entry point every other loader in the package goes through
(:class:`~monailabel_xflow.transforms.array.LoadCXR` and
:class:`~monailabel_xflow.transforms.dictionary.LoadCXRd` wrap it for MONAI pipelines).

Supported files, recognised by their content (PNG/JPEG signature, DICOM ``DICM`` preamble) or
else by their suffix (``.nii``/``.nii.gz``, ``.dcm``/``.dicom`` without preamble):

* PNG (modes ``L``, ``LA``, ``RGB``, ``RGBA``, 16-bit ``I;16``, palette) and JPEG, read with
  MONAI's :class:`~monai.data.PILReader`;
* DICOM (uncompressed, or any transfer syntax pydicom can decode, e.g. JPEG baseline through
  Pillow), read with pydicom;
* NIfTI, 2D or 3D with a single slice, read with MONAI's :class:`~monai.data.NibabelReader`.

Output contract of :func:`load_cxr`:

* **image**: ``numpy.float32`` array of shape ``(H, W)``; row 0 is the top of the displayed
  image, column 0 its left (the convention of :mod:`monailabel_xflow.geometry`). MONAI's
  readers hold 2D images as ``(W, H[, 1])``; the transpose back happens in one place here
  (:func:`from_reader_order`), and :func:`save_nifti_2d` writes the same convention.
* **intensities** in ``[0, 1]``, 1 = brightest (bone white), reached by min-max scaling of the
  display values: for DICOM, after the bit mask of *Bits Stored*, the modality LUT (*Rescale
  Slope/Intercept*), the VOI LUT or window, and MONOCHROME1 inversion (the same pipeline
  MIMIC-CXR-JPG, the source of XFlow's training images, used). Colour images are converted to
  gray (identical channels are taken as they are; otherwise ITU-R BT.601 luma, as
  ``PIL.Image.convert("L")``); an alpha channel is ignored.
* **meta**: a dict with the keys of :data:`META_KEYS`:

  ``filename_or_obj`` (str)
      The path as given.
  ``format`` (str)
      ``"PNG"``, ``"JPEG"``, ``"DICOM"`` or ``"NIfTI"``.
  ``original_size`` (tuple[int, int])
      ``(H, W)`` of the image, in pixels.
  ``spacing`` (tuple[float, float] | None)
      ``(row_mm, col_mm)``: DICOM *Pixel Spacing*, else *Imager Pixel Spacing*; NIfTI
      ``pixdim`` (converted to mm from the header's unit); ``None`` when the file has none
      (PNG, JPEG, DICOM without either tag).
  ``photometric_interpretation`` (str)
      Of the source: the DICOM tag; for PNG/JPEG ``"MONOCHROME2"`` (gray modes) or ``"RGB"``
      (colour modes); for NIfTI ``"MONOCHROME2"``. The returned image is always MONOCHROME2.
  ``view_position`` (str | None)
      DICOM *View Position* upper-cased (``"PA"``, ``"AP"``, ``"LL"`` ...), else ``None``.
  ``modality`` (str | None)
      DICOM *Modality* (``"CR"``, ``"DX"``), else ``None``.
  ``bits_stored`` (int | None)
      DICOM *Bits Stored*; 8 or 16 from the PNG/JPEG mode; ``None`` for NIfTI.

Errors: every failure to produce such an image raises :class:`CXRLoadError` (a
``ValueError``) naming the file and the reason: missing, empty, truncated or unreadable
files, files that are no image of a supported format, multi-slice volumes or multi-frame
DICOMs, constant or zero-size images, images over :data:`MAX_PIXELS` (refused from the header,
before decoding), and lateral views unless ``allow_lateral=True``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from monailabel_xflow.errors import BadRequestError

META_KEYS = (
    "filename_or_obj",
    "format",
    "original_size",
    "spacing",
    "photometric_interpretation",
    "view_position",
    "modality",
    "bits_stored",
)
"""Keys of the meta dict returned by :func:`load_cxr` (documented in the module docstring)."""

MAX_PIXELS = 50_000_000
"""Largest image accepted, in pixels (rows x columns; 50 MP, e.g. 7000 x 7000; detector
radiographs are under 15 MP). Checked from the header (PNG/JPEG, DICOM Rows/Columns, NIfTI
dim) before the pixel data is decoded, so a small compressed file cannot expand to gigabytes:
the decoded image then needs at most ``MAX_PIXELS x 4 bytes`` (float32, 200 MB) plus the
source pixels and one temporary of the same size (about 1 GB at the cap)."""

LATERAL_VIEWS = frozenset({"LL", "RL", "LATERAL", "LAT"})
"""DICOM *View Position* values of lateral projections, refused unless ``allow_lateral``."""

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"
_LUMA_BT601 = np.array([0.299, 0.587, 0.114], dtype=np.float32)
_PIL_BITS = {"1": 1, "L": 8, "LA": 8, "P": 8, "PA": 8, "RGB": 8, "RGBA": 8, "CMYK": 8,
             "I;16": 16, "I;16B": 16, "I;16L": 16, "I;16N": 16}
_PIL_GRAY_MODES = frozenset({"1", "L", "LA", "I", "F", "I;16", "I;16B", "I;16L", "I;16N"})

PathLike = str | os.PathLike


class CXRLoadError(BadRequestError):
    """A file that cannot be loaded as a frontal chest radiograph.

    Attributes:
        path: the file, as a string.
        reason: what was wrong with it, in words.
    """

    def __init__(self, path: PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot load chest radiograph {self.path!r}: {reason}")


def load_cxr(path: PathLike, allow_lateral: bool = False) -> tuple[np.ndarray, dict[str, Any]]:
    """Load a chest radiograph as a display-ready gray image.

    Args:
        path: a PNG, JPEG, DICOM or NIfTI file.
        allow_lateral: accept DICOMs whose *View Position* is lateral (:data:`LATERAL_VIEWS`).
            XFlow is defined on frontal views, so they are refused by default.

    Returns:
        ``(image, meta)``: ``image`` is ``float32`` ``(H, W)`` in ``[0, 1]``, row 0 at the top,
        column 0 at the left; ``meta`` has the keys of :data:`META_KEYS` (see module doc).

    Raises:
        CXRLoadError: the file is missing, unreadable, truncated, not an image of a supported
            format, a multi-slice volume, empty or constant, or a refused lateral view.
    """
    path = Path(path)
    fmt = _detect_format(path)
    try:
        values, meta = _READERS[fmt](path, allow_lateral)
    except CXRLoadError:
        raise
    except Exception as exc:  # any decoder failure is, for the caller, an unreadable file
        raise CXRLoadError(path, f"unreadable {fmt} file ({type(exc).__name__}: {exc})") from exc
    image = _to_unit_range(values, path)
    if meta["photometric_interpretation"] == "MONOCHROME1":
        image = 1.0 - image  # MONOCHROME1 stores bright as low values: display is inverted
    meta = {"filename_or_obj": str(path), "format": fmt,
            "original_size": (int(image.shape[0]), int(image.shape[1])), **meta}
    return image, {key: meta[key] for key in META_KEYS}


def save_nifti_2d(array_hw: np.ndarray, path: PathLike,
                  spacing: Sequence[float] | None = None) -> Path:
    """Write an ``(H, W)`` image or mask as NIfTI the way MONAI Label and ITK hold a 2D image.

    On disk the voxel array is ``(W, H, 1)``: index ``i`` is the column, ``j`` the row, one
    slice ``k = 0`` (what MONAI Label gets from a single-frame DICOM series). The
    affine is ``diag(-col_mm, -row_mm, 1)`` in NIfTI's RAS, i.e. ITK/Slicer (LPS) read an
    identity direction with spacing ``(col_mm, row_mm, 1)`` and origin 0. :func:`load_cxr`
    reads it back to the same ``(H, W)`` array. Write every mask NIfTI with this function.

    Args:
        array_hw: 2D array ``(H, W)``; ``bool`` is stored as ``uint8``, other dtypes as given.
        path: destination ending in ``.nii`` or ``.nii.gz``.
        spacing: ``(row_mm, col_mm)``; ``None`` writes 1 mm (NIfTI always carries a spacing).

    Returns:
        The path written.

    Raises:
        ValueError: if ``array_hw`` is not 2D or ``spacing`` has not two positive values.
    """
    import nibabel as nib

    array = np.asarray(array_hw)
    if array.ndim != 2:
        raise ValueError(f"save_nifti_2d expects an (H, W) array, got shape {array.shape}")
    if array.dtype == bool:
        array = array.astype(np.uint8)
    row_mm, col_mm = (1.0, 1.0) if spacing is None else (float(s) for s in spacing)
    if not (row_mm > 0 and col_mm > 0):
        raise ValueError(f"spacing must be two positive values (row_mm, col_mm), got {spacing}")
    volume = np.ascontiguousarray(to_reader_order(array)[..., None])
    nifti = nib.Nifti1Image(volume, np.diag([-col_mm, -row_mm, 1.0, 1.0]))
    nifti.header.set_xyzt_units(xyz="mm")
    path = Path(path)
    nib.save(nifti, str(path))
    return path


# --- the one transpose between MONAI readers' (W, H[, ...]) and (H, W[, ...]) ---------------

def from_reader_order(array: np.ndarray) -> np.ndarray:
    """``(W, H, ...)`` as MONAI's PIL/ITK/Nibabel readers hold a 2D image -> ``(H, W, ...)``.

    Use it (and :func:`to_reader_order`) wherever a MONAI-read array meets the package's
    ``(H, W)`` convention, e.g. labels a client sends back."""
    return np.swapaxes(array, 0, 1)


def to_reader_order(array: np.ndarray) -> np.ndarray:
    """``(H, W, ...)`` -> ``(W, H, ...)``, the inverse of :func:`from_reader_order`."""
    return np.swapaxes(array, 0, 1)




# --- format detection -----------------------------------------------------------------------

def check_pixel_count(shape: Sequence[int], path: PathLike, what: str = "image") -> None:
    """Refuse an image whose header declares more than :data:`MAX_PIXELS` pixels (or a
    non-positive size) before its data is decoded.

    Args:
        shape: the declared sizes (any order; extra axes count: a volume is many images).

    Raises:
        CXRLoadError: over the cap.
    """
    total = 1
    for n in shape:
        total *= max(int(n), 0)
    if total > MAX_PIXELS:
        raise CXRLoadError(path, f"{what} of {' x '.join(str(int(n)) for n in shape)} = {total:,} pixels is over the "
                                 f"limit of {MAX_PIXELS:,} pixels (refused before decoding)")


def _detect_format(path: Path) -> str:
    """Name the format from the file's first bytes, else its suffix; refuse anything else."""
    if not path.is_file():
        raise CXRLoadError(path, "no such file" if not path.exists() else "not a regular file")
    try:
        with open(path, "rb") as f:
            head = f.read(132)
    except OSError as exc:
        raise CXRLoadError(path, f"cannot open file ({exc.strerror or exc})") from exc
    if not head:
        raise CXRLoadError(path, "file is empty (0 bytes)")
    if head.startswith(_PNG_SIGNATURE):
        return "PNG"
    if head.startswith(_JPEG_SIGNATURE):
        return "JPEG"
    if head[128:132] == b"DICM":
        return "DICOM"
    name = path.name.lower()
    if name.endswith((".nii", ".nii.gz")):
        return "NIfTI"
    if name.endswith((".dcm", ".dicom")):
        return "DICOM"  # DICOM without the 128-byte preamble; pydicom decides
    if name.endswith((".png", ".jpg", ".jpeg")):
        raise CXRLoadError(path, f"not a {path.suffix[1:].upper()} image: the file does not "
                                 "start with the PNG or JPEG signature")
    raise CXRLoadError(path, "unsupported format: expected PNG, JPEG, DICOM (.dcm) "
                             "or NIfTI (.nii, .nii.gz)")


# --- readers: (path, allow_lateral) -> (gray float32 (H, W) display values, partial meta) -----

def _read_pil(path: Path, allow_lateral: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """PNG/JPEG through MONAI's PILReader. No view information: every image is accepted."""
    from monai.data import PILReader

    def expand_palette(img):  # palette and bilevel images become arrays of their real values
        if img.mode in ("P", "PA"):
            return img.convert("RGBA")
        return img.convert("L") if img.mode == "1" else img

    from PIL import Image

    with Image.open(str(path)) as probe:  # header only: refuse a decompression bomb before decoding
        check_pixel_count(probe.size, path)
    reader = PILReader(converter=expand_palette)
    pil_image = reader.read(str(path))
    source_mode = pil_image.mode
    try:
        pixels, _ = reader.get_data(pil_image)  # (W, H[, C]): forces the decode
    finally:
        pil_image.close()
    pixels = from_reader_order(pixels)
    meta = {
        "spacing": None,
        "photometric_interpretation": "MONOCHROME2" if source_mode in _PIL_GRAY_MODES else "RGB",
        "view_position": None,
        "modality": None,
        "bits_stored": _PIL_BITS.get(source_mode),
    }
    return _to_gray(pixels.astype(np.float32), path), meta


def _read_nifti(path: Path, allow_lateral: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """NIfTI through MONAI's NibabelReader: voxel index ``(i, j)`` = (column, row), see
    :func:`save_nifti_2d`. The affine's direction is not applied (as for MONAI Label clients,
    voxel indices are the display frame)."""
    from monai.data import NibabelReader

    reader = NibabelReader()
    nifti = reader.read(str(path))  # reads the header only (a .nii.gz is not decompressed yet)
    declared = tuple(int(n) for n in nifti.shape)
    if len(declared) < 2 or any(n != 1 for n in declared[2:]):
        raise CXRLoadError(path, f"a volume of shape {declared} is not a 2D "
                                 "radiograph: expected (W, H) or (W, H, 1)")
    check_pixel_count(declared, path)
    voxels, _ = reader.get_data(nifti)  # (W, H[, 1, ...]) as stored
    voxels = voxels.reshape(voxels.shape[:2])
    zooms = nifti.header.get_zooms()
    unit = nifti.header.get_xyzt_units()[0]
    to_mm = {"meter": 1000.0, "micron": 0.001}.get(unit, 1.0)  # "mm" or "unknown": as given
    meta = {
        "spacing": (float(zooms[1]) * to_mm, float(zooms[0]) * to_mm),  # (row, col)
        "photometric_interpretation": "MONOCHROME2",
        "view_position": None,
        "modality": None,
        "bits_stored": None,
    }
    return from_reader_order(np.asarray(voxels, dtype=np.float32)), meta


def _read_dicom(path: Path, allow_lateral: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """DICOM through pydicom: bits stored, modality LUT, VOI LUT/window, colour to gray.

    MONOCHROME1 inversion happens in :func:`load_cxr`, after scaling to ``[0, 1]``.
    """
    import pydicom
    from pydicom.errors import InvalidDicomError
    from pydicom.pixel_data_handlers.util import apply_color_lut, apply_modality_lut, apply_voi_lut

    with warnings.catch_warnings(record=True) as caught:  # pydicom warns on a truncated file
        warnings.simplefilter("always")
        try:
            ds = pydicom.dcmread(str(path), force=True)
        except InvalidDicomError as exc:
            raise CXRLoadError(path, f"not a DICOM file ({exc})") from exc
    if "PixelData" not in ds:
        if caught:
            raise CXRLoadError(path, f"unreadable DICOM file ({caught[0].message})")
        raise CXRLoadError(path, "no pixel data: not a DICOM image")
    view = str(ds.get("ViewPosition", "") or "").strip().upper() or None
    if view in LATERAL_VIEWS and not allow_lateral:
        raise CXRLoadError(path, f"lateral view (ViewPosition {view}); XFlow reads frontal "
                                 "views (pass allow_lateral=True / --allow-lateral to load it)")
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    if frames > 1:
        raise CXRLoadError(path, f"multi-frame DICOM with {frames} frames; expected one image")
    check_pixel_count((int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)), path)
    photometric = str(ds.get("PhotometricInterpretation", "MONOCHROME2")).strip().upper()
    bits_stored = int(ds.BitsStored) if "BitsStored" in ds else None

    pixels = _mask_bits_stored(ds.pixel_array, ds)
    if photometric in ("MONOCHROME1", "MONOCHROME2"):
        values = apply_voi_lut(apply_modality_lut(pixels, ds), ds, index=0)
    elif photometric.startswith("YBR"):
        values = pixels[..., 0]  # Y is the luma: already the gray image
    elif photometric == "PALETTE COLOR":
        values = _to_gray(apply_color_lut(pixels, ds).astype(np.float32), path)
    else:  # RGB
        values = _to_gray(pixels.astype(np.float32), path)

    spacing = ds.get("PixelSpacing") or ds.get("ImagerPixelSpacing")
    meta = {
        "spacing": (float(spacing[0]), float(spacing[1])) if spacing else None,  # (row, col)
        "photometric_interpretation": photometric,
        "view_position": view,
        "modality": str(ds.get("Modality", "") or "").strip() or None,
        "bits_stored": bits_stored,
    }
    return np.asarray(values, dtype=np.float32), meta


_READERS: dict[str, Callable[[Path, bool], tuple[np.ndarray, dict[str, Any]]]] = {
    "PNG": _read_pil, "JPEG": _read_pil, "DICOM": _read_dicom, "NIfTI": _read_nifti,
}


# --- pixel helpers --------------------------------------------------------------------------

def _mask_bits_stored(pixels: np.ndarray, ds: Any) -> np.ndarray:
    """Keep only the *Bits Stored* low bits of integer pixels (pydicom 2.x leaves the rest),
    sign-extending them for signed data (*Pixel Representation* 1)."""
    bits_stored = int(ds.get("BitsStored", 0) or 0)
    container = pixels.dtype.itemsize * 8
    if pixels.dtype.kind not in "iu" or not 0 < bits_stored < container:
        return pixels
    if pixels.dtype.kind == "u":
        return pixels & np.array((1 << bits_stored) - 1, dtype=pixels.dtype)
    shift = container - bits_stored  # arithmetic shift right re-extends the sign bit
    return (pixels << shift) >> shift


def _to_gray(pixels: np.ndarray, path: Path) -> np.ndarray:
    """``(H, W)``, ``(H, W, 2)`` (gray + alpha) or ``(H, W, 3|4)`` (RGB[A]) -> ``(H, W)``."""
    if pixels.ndim == 2:
        return pixels
    if pixels.ndim != 3 or pixels.shape[-1] not in (2, 3, 4):
        raise CXRLoadError(path, f"unsupported pixel layout {tuple(pixels.shape)}")
    if pixels.shape[-1] == 2:
        return pixels[..., 0]
    rgb = pixels[..., :3]
    if np.array_equal(rgb[..., 0], rgb[..., 1]) and np.array_equal(rgb[..., 0], rgb[..., 2]):
        return rgb[..., 0]  # gray stored as RGB: exact, no rounding through luma weights
    return rgb @ _LUMA_BT601


def _to_unit_range(values: np.ndarray, path: Path) -> np.ndarray:
    """Min-max scale to ``float32`` ``[0, 1]``; refuse zero-size, non-finite or constant."""
    if values.ndim != 2 or values.size == 0:
        raise CXRLoadError(path, f"empty image (shape {tuple(values.shape)})")
    if not np.isfinite(values).all():
        raise CXRLoadError(path, "image contains NaN or infinite values")
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo:
        raise CXRLoadError(path, f"empty image: every pixel has the value {lo:g}")
    out = np.asarray(values, dtype=np.float32) - np.float32(lo)  # one float32 copy, scaled in place
    out /= np.float32(hi - lo)
    return out
