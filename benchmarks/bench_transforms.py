"""Load time of the CXR loading transforms against the bare decoders, per format.

Run: ``.venv/bin/python benchmarks/bench_transforms.py [--repeats 10]``. For each file (the real
1024 x 1024 NIH PNG, its RGBA sibling, the JPEG-baseline CR, its MONOCHROME1 twin and the 12-bit DX
made from the committed PNGs (``tests/radiographs.py``),
plus a 16-bit PNG, a 12-bit uncompressed DICOM and a NIfTI written to a temp folder from the
PNG) prints the median ms of ``load_cxr`` and of the bare decode (``PIL`` ``np.asarray``,
``pydicom`` ``pixel_array``, ``nibabel`` ``get_fdata``) and their ratio: the price of the
reader wrappers, LUTs, gray conversion and scaling. The cost of ``import monai`` (~15 s, once
per process) is excluded by a warm-up load.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from monailabel_xflow.transforms import load_cxr, save_nifti_2d

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from common import median_ms, parse_args  # noqa: E402
from radiographs import CR_SOURCE, DATA, make_samples  # noqa: E402


def bare_decoder(path: Path):
    import nibabel as nib
    import pydicom
    from PIL import Image

    if path.suffix == ".dcm":
        return lambda: pydicom.dcmread(path).pixel_array
    if path.name.endswith(".nii.gz"):
        return lambda: nib.load(path).get_fdata()
    return lambda: np.asarray(Image.open(path))


def write_extras(folder: Path) -> list[Path]:
    """16-bit PNG, 12-bit DICOM and NIfTI versions of a real 1024 x 1024 radiograph."""
    from PIL import Image
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    gray = np.asarray(Image.open(DATA / CR_SOURCE))
    deep = (gray.astype(np.uint16) * 16).astype(np.uint16)  # 12-bit range
    Image.fromarray(deep).save(folder / "deep16.png")
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(folder / "native12.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.Rows, ds.Columns = deep.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME1"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.RescaleSlope, ds.RescaleIntercept, ds.WindowCenter, ds.WindowWidth = 1, 0, 2048, 3000
    ds.PixelData = deep.tobytes()
    ds.save_as(str(folder / "native12.dcm"), write_like_original=False)
    save_nifti_2d(gray.astype(np.float32), folder / "image.nii.gz", spacing=(0.14, 0.14))
    return [folder / "deep16.png", folder / "native12.dcm", folder / "image.nii.gz"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parse_args(parser, repeats=1)
    with tempfile.TemporaryDirectory() as tmp:
        samples = make_samples(Path(tmp) / "cxr")
        start = time.perf_counter()
        load_cxr(samples / "nih/images-512/00000001_000.png")  # warm-up: imports monai
        print(f"first load (imports monai and readers): {time.perf_counter() - start:.1f} s")
        files = [
            samples / "nih/images/00000129_000.png",
            samples / "nih/images/00001369_000.png",
            *sorted((samples / "dicom").glob("*.dcm")),
            *write_extras(Path(tmp)),
        ]
        print(f"{'file':40s} {'load_cxr ms':>12s} {'bare ms':>9s} {'ratio':>6s}")
        for path in files:
            ours = median_ms(lambda path=path: load_cxr(path), args.repeats)
            bare = median_ms(bare_decoder(path), args.repeats)
            print(f"{path.name[-40:]:40s} {ours:12.1f} {bare:9.1f} {ours / bare:6.2f}")


if __name__ == "__main__":
    main()
