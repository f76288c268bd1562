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

Hostile files (every decoder here, images and labels alike):

* **no reference inside a file is followed**: an NRRD header naming a detached ``data file``
  (or any ``line skip``/``byte skip``) is refused, a NIfTI is one ``.nii``/``.nii.gz`` file;
* **bounded memory**: sizes are checked from the header (every axis counts, an NRRD with 20
  dimensions as much as one with 2); compressed data (gzip/bzip2 NRRD, Deflated DICOM) is
  stream-decompressed and decoding stops at the size the header declares (NRRD) or at
  :data:`MAX_INFLATED_BYTES` (Deflated DICOM): a 1 MiB bomb never expands past the pixel budget;
* **bounded time**: a NIfTI whose ``vox_offset`` lies past :data:`MAX_HEADER_BYTES` (a gzip
  stream would be read through gigabytes to find the pixels) is refused from its header;
* the format is decided by the **content** (:func:`sniff_format`), never by the client's file name.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.errors import BadRequestError, InputError

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

MAX_HEADER_BYTES = 1 << 20
"""Largest header accepted: a NIfTI ``vox_offset`` (header + extensions) or an NRRD header, in
bytes. Radiograph headers are a few hundred bytes."""

MAX_INFLATED_BYTES = 2 * MAX_PIXELS + (16 << 20)
"""Largest Deflated DICOM data set once inflated: 16-bit pixels at :data:`MAX_PIXELS` plus 16 MiB of
tags. A stream that inflates past it is refused after that many bytes."""

LATERAL_VIEWS = frozenset({"LL", "RL", "LATERAL", "LAT"})
"""DICOM *View Position* values of lateral projections, refused unless ``allow_lateral``."""

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"
_LUMA_BT601 = np.array([0.299, 0.587, 0.114], dtype=np.float32)
_PIL_BITS = {
    "1": 1,
    "L": 8,
    "LA": 8,
    "P": 8,
    "PA": 8,
    "RGB": 8,
    "RGBA": 8,
    "CMYK": 8,
    "I;16": 16,
    "I;16B": 16,
    "I;16L": 16,
    "I;16N": 16,
}
_PIL_GRAY_MODES = frozenset({"1", "L", "LA", "I", "F", "I;16", "I;16B", "I;16L", "I;16N"})

PathLike = str | os.PathLike


UPLOAD_PREFIX = "xflow-upload-"
"""Name prefix of the server's temporary upload files (:func:`.uploads.store_upload`)."""


def shown_name(path: PathLike, what: str = "file", whole: bool = False) -> str:
    """How a message names a file: ``what 'name'`` (the base name, or the path as given with
    ``whole``); a temporary upload is ``the uploaded <what>`` (its random name would tell the
    client nothing). The server's answers never hold a folder either way (``app.guard`` cuts
    absolute paths out of every JSON answer)."""
    name = Path(path).name
    if name.startswith(UPLOAD_PREFIX):
        return f"the uploaded {what}"
    return f"{what} {str(path) if whole else name!r}"


class CXRLoadError(BadRequestError):
    """A file that cannot be loaded as a frontal chest radiograph. The message names the file as
    given (an upload as "the uploaded chest radiograph": :func:`shown_name`).

    Attributes:
        path: the file, as a string.
        reason: what was wrong with it, in words.
    """

    def __init__(self, path: PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot load {shown_name(path, 'chest radiograph', whole=True)}: {reason}")


class CXRScalingError(InputError):
    """A file readable as a radiograph whose header asks for values that cannot be pixels (a
    non-finite NIfTI ``scl_slope``/``scl_inter``): readable but wrong, HTTP 422 (not a
    :class:`CXRLoadError`, which is 400). Same attributes and message form as :class:`CXRLoadError`."""

    def __init__(self, path: PathLike, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot load {shown_name(path, 'chest radiograph', whole=True)}: {reason}")


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
    except (CXRLoadError, CXRScalingError):
        raise
    except Exception as exc:  # any decoder failure is, for the caller, an unreadable file
        raise CXRLoadError(path, f"unreadable {fmt} file ({type(exc).__name__}: {exc})") from exc
    image = _to_unit_range(values, path)
    if meta["photometric_interpretation"] == "MONOCHROME1":
        image = 1.0 - image  # MONOCHROME1 stores bright as low values: display is inverted
    meta = {
        "filename_or_obj": str(path),
        "format": fmt,
        "original_size": (int(image.shape[0]), int(image.shape[1])),
        **meta,
    }
    return image, {key: meta[key] for key in META_KEYS}


def save_nifti_2d(array_hw: np.ndarray, path: PathLike, spacing: Sequence[float] | None = None) -> Path:
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

    path = Path(path)
    nib.save(nifti_2d(array_hw, spacing), str(path))
    return path


def nifti_2d(array_hw: np.ndarray, spacing: Sequence[float] | None = None, affine: np.ndarray | None = None) -> Any:
    """The in-memory ``nibabel.Nifti1Image`` that :func:`save_nifti_2d` writes (same arguments;
    ``affine``, e.g. an image's own, replaces the one built from ``spacing``).

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
    nifti = nib.Nifti1Image(volume, np.diag([-col_mm, -row_mm, 1.0, 1.0]) if affine is None else affine)
    nifti.header.set_xyzt_units(xyz="mm")
    return nifti


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
        raise CXRLoadError(
            path,
            f"{what} of {' x '.join(str(int(n)) for n in shape)} = {total:,} pixels is over the "
            f"limit of {MAX_PIXELS:,} pixels (refused before decoding)",
        )


def _detect_format(path: Path) -> str:
    """Name the format from the file's content (:func:`sniff_format`), else, for a DICOM without
    preamble or a file no signature matched, its suffix; refuse anything else."""
    sniffed = sniff_format(path)
    if sniffed in ("NIfTI", "NIfTI-gz"):
        return "NIfTI"
    if sniffed in _READERS:
        return sniffed
    name = path.name.lower()
    if name.endswith((".nii", ".nii.gz")):
        return "NIfTI"  # its reader names what is wrong with it
    if name.endswith((".dcm", ".dicom")) and sniffed is None:
        return "DICOM"  # DICOM without the 128-byte preamble; pydicom decides
    if name.endswith((".png", ".jpg", ".jpeg")):
        raise CXRLoadError(
            path, f"not a {path.suffix[1:].upper()} image: the file does not start with the PNG or JPEG signature"
        )
    raise CXRLoadError(path, "unsupported format: expected PNG, JPEG, DICOM (.dcm) or NIfTI (.nii, .nii.gz)")


# --- hostile files: content sniffing, header checks, capped decompression -------------------

CANONICAL_SUFFIX = {
    "PNG": ".png",
    "JPEG": ".jpg",
    "DICOM": ".dcm",
    "NIfTI": ".nii",
    "NIfTI-gz": ".nii.gz",
    "NRRD": ".nrrd",
}
"""The suffix a stored file gets for the format its content shows (:func:`sniff_format`)."""

IMAGE_FORMATS = ("PNG", "JPEG", "DICOM", "NIfTI", "NIfTI-gz")
"""Formats (:func:`sniff_format`) a radiograph may be stored or uploaded as."""
LABEL_FORMATS = ("PNG", "NIfTI", "NIfTI-gz", "NRRD")
"""Formats (:func:`sniff_format`) a label map may be stored or uploaded as."""

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


def _first_bytes(path: PathLike, n: int) -> tuple[bytes, bool]:
    """Up to ``n`` bytes of the file, decompressed if it is gzip; ``(bytes, was_gzip)``.
    Reads at most about ``n`` decompressed bytes, whatever the stream holds."""
    import gzip

    with open(path, "rb") as f:
        gz = f.read(2) == _GZIP_MAGIC
    if not gz:
        with open(path, "rb") as f:
            return f.read(n), False
    try:
        with gzip.open(path, "rb") as f:
            return f.read(n), True
    except (OSError, EOFError, ValueError):  # not a whole gzip member: what could be read counts as nothing
        return b"", True


def sniff_format(path: PathLike) -> str | None:
    """The format the file's **content** shows, never its name: a key of :data:`CANONICAL_SUFFIX`
    (``"PNG"``, ``"JPEG"``, ``"DICOM"`` (Part 10, with the ``DICM`` preamble), ``"NIfTI"``,
    ``"NIfTI-gz"`` (gzip of a single-file NIfTI-1/2), ``"NRRD"``), or ``None``.

    Raises:
        CXRLoadError: no such file, not a regular file, unreadable or empty.
    """
    path = Path(path)
    if not path.is_file():
        raise CXRLoadError(path, "no such file" if not path.exists() else "not a regular file")
    try:
        head, gz = _first_bytes(path, 544)
    except OSError as exc:
        raise CXRLoadError(path, f"cannot open file ({exc.strerror or exc})") from exc
    if not head and not gz:
        raise CXRLoadError(path, "file is empty (0 bytes)")
    if not gz:
        if head.startswith(_PNG_SIGNATURE):
            return "PNG"
        if head.startswith(_JPEG_SIGNATURE):
            return "JPEG"
        if head[128:132] == b"DICM":
            return "DICOM"
        if head.startswith(b"NRRD000"):
            return "NRRD"
    if head[344:348] in (b"n+1\0", b"ni1\0") or head[4:8] in (b"n+2\0", b"ni2\0"):
        return "NIfTI-gz" if gz else "NIfTI"
    return None


def check_nifti_header(path: PathLike, what: str = "image") -> None:
    """Refuse, from the first bytes alone, a NIfTI that would make a reader follow another file,
    seek far or allocate much: a header/image pair (``ni1``/``ni2``: the pixels are in a second
    file), a ``vox_offset`` past :data:`MAX_HEADER_BYTES` (a gzip stream would be decompressed up
    to it), a header extension that does not end before the pixel data (a reader allocates what
    its size field says), a data type over 64 bits. Pixel counts are checked by the caller.

    Raises:
        CXRLoadError: one of the above, or not a NIfTI-1/2 header.
    """
    import struct

    head, _ = _first_bytes(path, 544)
    if head[344:348] in (b"n+1\0", b"ni1\0"):
        size_at, ext_at, single = 348, 348, head[344:348] == b"n+1\0"
        endian = "<" if struct.unpack("<i", head[:4])[0] == 348 else ">"
        offset = struct.unpack(endian + "f", head[108:112])[0]
        bitpix = struct.unpack(endian + "h", head[72:74])[0]
    elif head[4:8] in (b"n+2\0", b"ni2\0"):
        size_at, ext_at, single = 540, 540, head[4:8] == b"n+2\0"
        endian = "<" if struct.unpack("<i", head[:4])[0] == 540 else ">"
        offset = struct.unpack(endian + "q", head[168:176])[0]
        bitpix = struct.unpack(endian + "h", head[14:16])[0]
    else:
        raise CXRLoadError(path, f"{what}: not a NIfTI-1 or NIfTI-2 file")
    if not single:
        raise CXRLoadError(
            path,
            f"{what}: a NIfTI header whose pixels are in a separate .img file; only single-file .nii / .nii.gz is read",
        )
    if len(head) < size_at + 4:
        raise CXRLoadError(path, f"{what}: truncated NIfTI header")
    if not 0 <= offset <= MAX_HEADER_BYTES:
        raise CXRLoadError(
            path,
            f"{what}: NIfTI pixel data at byte {offset:.0f} (vox_offset); at most "
            f"{MAX_HEADER_BYTES} bytes of header are accepted",
        )
    if head[ext_at] != 0:  # extensions: each record must end before the pixel data (a reader reads whole records)
        block, _ = _first_bytes(path, int(offset))
        pos = ext_at + 4
        while pos + 8 <= offset:
            esize = struct.unpack(endian + "i", block[pos : pos + 4])[0] if len(block) >= pos + 4 else -1
            if esize < 8 or pos + esize > offset:
                raise CXRLoadError(
                    path,
                    f"{what}: NIfTI header extension of {esize} bytes at byte {pos} does not fit before the pixel data",
                )
            pos += esize
    if not 0 < bitpix <= 64:
        raise CXRLoadError(path, f"{what}: NIfTI of {bitpix} bits per voxel; at most 64")
    import math

    if head[344:348] == b"n+1\0":
        slope, inter = struct.unpack(endian + "ff", head[112:120])
    else:
        slope, inter = struct.unpack(endian + "dd", head[176:192])
    if math.isinf(slope) or (slope not in (0.0,) and not math.isnan(slope) and not math.isfinite(inter)):
        raise CXRScalingError(
            path,
            f"{what}: NIfTI intensity scaling scl_slope={slope!r}, scl_inter={inter!r} is not finite "
            "(every pixel would be infinite or undefined)",
        )


def open_nifti(path: PathLike, what: str = "image"):
    """``(NibabelReader, image)`` of a single-file 2D NIfTI (``(W, H)`` or ``(W, H, 1)``) after
    :func:`check_nifti_header` and :func:`check_pixel_count`; nothing but the header is read yet.

    Raises:
        CXRLoadError: refused header (see above), or not 2D.
    """
    from monai.data import NibabelReader

    check_nifti_header(path, what)
    reader = NibabelReader()
    nifti = reader.read(str(path))  # the header only: a .nii.gz is not decompressed yet
    declared = tuple(int(n) for n in nifti.header.get_data_shape())
    if len(declared) < 2 or any(n != 1 for n in declared[2:]):
        raise CXRLoadError(path, f"a volume of shape {declared} is not a 2D {what}: expected (W, H) or (W, H, 1)")
    check_pixel_count(declared, path, what)
    return reader, nifti


_NRRD_REFERENCES = frozenset({"data file", "datafile", "line skip", "lineskip", "byte skip", "byteskip"})


def read_nrrd(path: PathLike, what: str = "label") -> np.ndarray:
    """An NRRD file's voxels in the file's own index order (``(W, H[, 1])`` for a 2D label, as
    MONAI's readers hold it), read without following anything the header names.

    The header (at most :data:`MAX_HEADER_BYTES`, ending at the first blank line) is parsed by
    pynrrd; a detached ``data file`` or a ``line skip``/``byte skip`` is refused; every one of
    ``sizes`` counts against :data:`MAX_PIXELS`; ``raw`` data is read, ``gzip``/``bzip2`` data
    stream-decompressed, in both cases stopping at the ``prod(sizes) x itemsize`` bytes the header
    declares (memory at most that, whatever the stream would expand to); a compressed stream that
    goes on past them is refused.

    Raises:
        CXRLoadError: not NRRD, refused header field, too large, unsupported encoding or type,
            truncated data.
    """
    import bz2
    import zlib

    import nrrd

    with open(path, "rb") as f:
        head = f.read(MAX_HEADER_BYTES)
        if not head.startswith(b"NRRD000"):
            raise CXRLoadError(path, f"{what}: not an NRRD file")
        end = head.find(b"\n\n")
        if end < 0:
            raise CXRLoadError(
                path,
                f"{what}: NRRD header without its blank line within {MAX_HEADER_BYTES} bytes "
                "(detached headers are not read)",
            )
        lines = head[:end].decode("latin-1").split("\n")
        named = sorted(
            {
                line.split(":", 1)[0].strip()
                for line in lines[1:]
                if ":" in line and line.split(":", 1)[0].strip().lower() in _NRRD_REFERENCES
            }
        )
        if named:  # before parsing: "data file: LIST" is followed by lines that are file names
            raise CXRLoadError(
                path,
                f"{what}: NRRD header field(s) {', '.join(named)} refused: the data must "
                "follow the header in the same file",
            )
        try:
            header = nrrd.read_header(lines)
        except Exception as exc:  # pynrrd's NRRDError and parsing errors: a bad header
            raise CXRLoadError(path, f"{what}: bad NRRD header ({str(exc)[:160]})") from exc
        sizes = [int(n) for n in np.atleast_1d(header.get("sizes", []))]
        if not sizes or len(sizes) != int(header.get("dimension", len(sizes))) or len(sizes) > 16:
            raise CXRLoadError(path, f"{what}: NRRD sizes {sizes[:20]} do not match its dimension")
        check_pixel_count(sizes, path, what)
        try:
            dtype = nrrd.reader._determine_datatype(header)
        except Exception as exc:
            raise CXRLoadError(path, f"{what}: unsupported NRRD type ({str(exc)[:100]})") from exc
        if dtype.itemsize > 8:
            raise CXRLoadError(path, f"{what}: NRRD type of {dtype.itemsize} bytes per voxel; at most 8")
        count = int(np.prod(sizes))
        nbytes = count * dtype.itemsize
        f.seek(end + 2)
        encoding = str(header.get("encoding", "")).lower()
        if encoding == "raw":
            data = f.read(nbytes)
        elif encoding in ("gzip", "gz", "bzip2", "bz2"):
            gz = encoding in ("gzip", "gz")
            data = _inflate(
                f, zlib.decompressobj(zlib.MAX_WBITS | 32) if gz else bz2.BZ2Decompressor(), nbytes + 1, path
            )
            if len(data) > nbytes:  # a bomb: the stream goes on past what the header declares
                raise CXRLoadError(
                    path,
                    f"{what}: NRRD {encoding} data expands past the {nbytes} bytes its header "
                    "declares (refused while decompressing)",
                )
        else:
            raise CXRLoadError(path, f"{what}: NRRD encoding {encoding!r}; raw, gzip or bzip2 are read")
    if len(data) < nbytes:
        raise CXRLoadError(path, f"{what}: NRRD data holds {len(data)} of the {nbytes} bytes its header declares")
    return np.frombuffer(data, dtype=dtype, count=count).reshape(sizes, order="F")


def _inflate(f, decompressor, limit: int, path: PathLike) -> bytes:
    """Decompress from ``f`` until ``limit`` bytes came out (or the stream ends): never more."""
    import bz2
    import zlib

    out = bytearray()
    try:
        while len(out) < limit and not decompressor.eof:
            if isinstance(decompressor, bz2.BZ2Decompressor):
                chunk = f.read(_CHUNK) if decompressor.needs_input else b""
                if decompressor.needs_input and not chunk:
                    break
            else:
                chunk = decompressor.unconsumed_tail or f.read(_CHUNK)
                if not chunk:
                    break
            out += decompressor.decompress(chunk, limit - len(out))
    except (OSError, EOFError, zlib.error) as exc:
        raise CXRLoadError(path, f"corrupt compressed data ({exc})") from exc
    return bytes(out)


def _check_deflated(path: PathLike) -> None:
    """A Deflated Explicit VR Little Endian DICOM whose data set inflates past
    :data:`MAX_INFLATED_BYTES` is refused, counting the stream in 4 MiB pieces (pydicom inflates a
    whole data set in memory)."""
    import zlib

    import pydicom
    from pydicom.uid import DeflatedExplicitVRLittleEndian

    try:
        meta = pydicom.filereader.read_file_meta_info(str(path))
    except Exception:  # not Part 10 or no meta: pydicom's own read reports it
        return
    if meta.get("TransferSyntaxUID") != DeflatedExplicitVRLittleEndian:
        return
    if "FileMetaInformationGroupLength" not in meta:
        raise CXRLoadError(path, "Deflated DICOM without File Meta Information Group Length")
    with open(path, "rb") as f:
        start = 132 if f.read(132)[128:132] == b"DICM" else 0
        f.seek(start + 12 + int(meta.FileMetaInformationGroupLength))
        inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        total = 0
        try:
            while not inflater.eof:
                chunk = inflater.unconsumed_tail or f.read(_CHUNK)
                if not chunk:
                    break
                total += len(inflater.decompress(chunk, 4 << 20))
                if total > MAX_INFLATED_BYTES:
                    raise CXRLoadError(
                        path, f"Deflated DICOM inflates past {MAX_INFLATED_BYTES:,} bytes (refused while decompressing)"
                    )
        except zlib.error as exc:
            raise CXRLoadError(path, f"corrupt Deflated DICOM ({exc})") from exc


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
    reader, nifti = open_nifti(path, "radiograph")
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


def refuse_lateral(ds: Any, path: PathLike) -> None:
    """The one lateral-view rule: a DICOM header whose *View Position* is one of
    :data:`LATERAL_VIEWS` is refused (XFlow reads frontal views).

    Raises:
        CXRLoadError: a lateral view (the message says how to load it anyway).
    """
    view = str(ds.get("ViewPosition", "") or "").strip().upper() or None
    if view in LATERAL_VIEWS:
        raise CXRLoadError(
            path,
            f"lateral view (ViewPosition {view}); XFlow segments frontal (PA/AP) views only "
            "(to look at it: xflow inspect --allow-lateral, or load_cxr(path, allow_lateral=True))",
        )


def refuse_lateral_series(path: PathLike) -> None:
    """:func:`refuse_lateral` for a NIfTI that MONAI Label's DICOMweb datastore cached from a series:
    the NIfTI lost the DICOM tags, its series folder (the same name without ``.nii.gz``) still
    has them. Any other file: nothing to check.

    Raises:
        CXRLoadError: the series is a lateral view.
    """
    series_dir = Path(str(path)[: -len(".nii.gz")]) if str(path).endswith(".nii.gz") else None
    if series_dir is None or not series_dir.is_dir():
        return
    first = next(iter(sorted(series_dir.glob("*.dcm"))), None)
    if first is not None:
        import pydicom

        refuse_lateral(pydicom.dcmread(str(first), stop_before_pixels=True), path)


def _read_dicom(path: Path, allow_lateral: bool) -> tuple[np.ndarray, dict[str, Any]]:
    """DICOM through pydicom: bits stored, modality LUT, VOI LUT/window, colour to gray.

    MONOCHROME1 inversion happens in :func:`load_cxr`, after scaling to ``[0, 1]``.
    """
    import pydicom
    from pydicom.errors import InvalidDicomError
    from pydicom.pixel_data_handlers.util import apply_color_lut, apply_modality_lut, apply_voi_lut

    _check_deflated(path)
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
    if not allow_lateral:
        refuse_lateral(ds, path)
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    if frames > 1:
        raise CXRLoadError(path, f"multi-frame DICOM with {frames} frames; expected one image")
    check_pixel_count((int(ds.get("Rows", 0) or 0), int(ds.get("Columns", 0) or 0)), path)
    samples, bits = int(ds.get("SamplesPerPixel", 1) or 1), int(ds.get("BitsAllocated", 16) or 16)
    if samples not in (1, 3, 4) or bits not in (1, 8, 16, 32):
        raise CXRLoadError(
            path,
            f"unsupported pixel format ({samples} samples of {bits} bits); "
            "a radiograph has 1 or 3 samples of 8, 16 or 32 bits",
        )
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
    "PNG": _read_pil,
    "JPEG": _read_pil,
    "DICOM": _read_dicom,
    "NIfTI": _read_nifti,
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
