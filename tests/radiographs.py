"""The real radiographs the tests read: the committed NIH ChestX-ray14 PNGs (``tests/data/cxr``,
attribution in its README) and DICOM files made from them.

:func:`make_samples` lays out one folder (the ``cxr_samples`` fixture of ``conftest.py``)::

    nih/images/<NIH name>.png        1024 x 1024 (00001369_000.png is RGBA, as NIH shipped it)
    nih/images-512/00000001_000.png  512 x 512
    dicom/cr.dcm                     CR, JPEG Baseline, 8-bit MONOCHROME2, PA, no Image Position
    dicom/cr_monochrome1.dcm         the same stored pixels, MONOCHROME1
    dicom/dx.dcm                     DX For Presentation, uncompressed, 12 bits stored

Nothing here is a test. UIDs are derived from the file names, so every session writes the same
headers.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parent / "data" / "cxr"
CR_SOURCE = "nih/images/00000129_000.png"
DX_SOURCE = "nih/images/00001933_000.png"
SPACING_MM = 0.168
"""Nominal pixel spacing of the DICOM files (the PNGs carry none)."""

CR_STORAGE = "1.2.840.10008.5.1.4.1.1.1"
DX_STORAGE = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation


def _uid(name: str) -> str:
    from pydicom.uid import generate_uid

    return generate_uid(entropy_srcs=["monailabel-xflow tests", name])


def _dataset(path: Path, sop_class: str, name: str, transfer_syntax: str):
    """An empty file dataset with the patient/study/series module filled from ``name``."""
    import pydicom
    from pydicom.dataset import FileDataset, FileMetaDataset

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = _uid(f"{name} instance")
    meta.TransferSyntaxUID = transfer_syntax
    meta.ImplementationClassUID = pydicom.uid.PYDICOM_IMPLEMENTATION_UID
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.SOPClassUID, ds.SOPInstanceUID = sop_class, meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID = _uid(f"{name} study"), _uid(f"{name} series")
    ds.PatientName, ds.PatientID = f"NIH^{name}", name
    ds.PatientSex, ds.PatientBirthDate = "", ""
    ds.StudyDate = ds.SeriesDate = ds.ContentDate = "20170101"
    ds.StudyTime = ds.SeriesTime = ds.ContentTime = "120000"
    ds.StudyID, ds.AccessionNumber, ds.ReferringPhysicianName = "1", "", ""
    ds.StudyDescription = "NIH ChestX-ray14 image (test fixture)"
    ds.SeriesNumber, ds.InstanceNumber = 1, 1
    ds.BodyPartExamined, ds.ViewPosition = "CHEST", "PA"
    ds.PatientOrientation = ["L", "F"]
    ds.SamplesPerPixel, ds.PixelRepresentation = 1, 0
    return ds


def write_cr(png: Path, path: Path, photometric: str = "MONOCHROME2") -> Path:
    """``png`` (8-bit grey) as a JPEG Baseline CR; MONOCHROME1 keeps the same stored pixels."""
    from PIL import Image
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGBaseline8Bit

    pixels = np.asarray(Image.open(png).convert("L"))
    jpeg = io.BytesIO()
    Image.fromarray(pixels).save(jpeg, format="JPEG", quality=95)
    ds = _dataset(path, CR_STORAGE, path.stem, JPEGBaseline8Bit)
    ds.Modality = "CR"
    ds.ImageType = ["DERIVED", "PRIMARY"]
    ds.Rows, ds.Columns = pixels.shape
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit = 7
    ds.PixelSpacing = [SPACING_MM, SPACING_MM]
    ds.LossyImageCompression, ds.LossyImageCompressionMethod = "01", "ISO_10918_1"
    ds.PixelData = encapsulate([jpeg.getvalue()])
    ds["PixelData"].is_undefined_length = True
    ds.save_as(str(path), write_like_original=False)
    return path


def write_dx(png: Path, path: Path) -> Path:
    """``png`` as an uncompressed 16-bit DX (12 bits stored, value x 16), MONOCHROME2."""
    from PIL import Image
    from pydicom.uid import ExplicitVRLittleEndian

    pixels = np.asarray(Image.open(png).convert("L")).astype(np.uint16) * 16
    ds = _dataset(path, DX_STORAGE, path.stem, ExplicitVRLittleEndian)
    ds.Modality = "DX"
    ds.ImageType = ["DERIVED", "PRIMARY"]
    ds.PresentationIntentType = "FOR PRESENTATION"
    ds.Rows, ds.Columns = pixels.shape
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
    ds.ImagerPixelSpacing = [SPACING_MM, SPACING_MM]
    ds.PixelData = pixels.tobytes()
    ds.save_as(str(path), write_like_original=False)
    return path


def make_samples(out: Path) -> Path:
    """The folder the module docstring describes, in ``out`` (created); returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(DATA / "nih", out / "nih", dirs_exist_ok=True)
    (out / "dicom").mkdir(exist_ok=True)
    write_cr(DATA / CR_SOURCE, out / "dicom" / "cr.dcm")
    write_cr(DATA / CR_SOURCE, out / "dicom" / "cr_monochrome1.dcm", photometric="MONOCHROME1")
    write_dx(DATA / DX_SOURCE, out / "dicom" / "dx.dcm")
    return out


def copy_nih_pngs(studies: Path, count: int) -> list[str]:
    """``count`` of the committed 1024 px NIH PNGs into ``studies`` (for benchmarks); beyond the
    four there are, they repeat under ``<name>_r<k>`` (same pixels, another image id). Returns
    the image ids in order."""
    pngs = sorted((DATA / "nih" / "images").glob("*.png"))
    names = []
    for i in range(count):
        source = pngs[i % len(pngs)]
        name = source.stem if i < len(pngs) else f"{source.stem}_r{i // len(pngs)}"
        shutil.copy(source, studies / f"{name}.png")
        names.append(name)
    return names
