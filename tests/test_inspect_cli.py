"""``xflow inspect``: JSON of what the loading transforms read, exit status 2 on bad files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from monailabel_xflow.cli import main

CR = "dicom/cr.dcm"
PNG = "nih/images-512/00000001_000.png"


def inspect(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["inspect", *map(str, argv)])
    out, err = capsys.readouterr()
    return status, out, err


def lateral_dicom(path: Path) -> Path:
    """A 40 x 60 (rows x columns) lateral DX with Imager Pixel Spacing only."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.Modality, ds.ViewPosition = "DX", "LL"
    ds.Rows, ds.Columns = 40, 60
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.BitsAllocated = ds.BitsStored = 8
    ds.HighBit, ds.PixelRepresentation = 7, 0
    ds.ImagerPixelSpacing = [0.15, 0.14]
    ds.PixelData = np.arange(40 * 60, dtype=np.uint8).tobytes()
    ds.save_as(str(path), write_like_original=False)
    return path


def test_inspect_png(cxr_samples, capsys):
    status, out, err = inspect(capsys, cxr_samples / PNG)
    assert status == 0 and err == ""
    report = json.loads(out)
    assert report["shape"] == [1, 512, 512] and report["original_size"] == [512, 512]
    assert report["dtype"] == "float32" and (report["min"], report["max"]) == (0.0, 1.0)
    assert report["spacing"] is None and report["format"] == "PNG"
    assert report["path"] == str(cxr_samples / PNG)


def test_inspect_monochrome1_dicom(cxr_samples, capsys):
    status, out, _ = inspect(capsys, cxr_samples / "dicom/cr_monochrome1.dcm")
    report = json.loads(out)
    assert status == 0
    assert report["photometric_interpretation"] == "MONOCHROME1"
    assert report["spacing"] == [0.168, 0.168]
    assert (report["view_position"], report["modality"], report["bits_stored"]) == ("PA", "CR", 8)


def test_inspect_lateral_needs_flag(tmp_path, capsys):
    path = lateral_dicom(tmp_path / "lat.dcm")
    status, out, err = inspect(capsys, path)
    assert status == 2 and out == ""
    assert str(path) in err and "lateral" in err
    status, out, err = inspect(capsys, path, "--allow-lateral")
    report = json.loads(out)
    assert status == 0 and report["view_position"] == "LL"
    assert report["shape"] == [1, 40, 60] and report["spacing"] == [0.15, 0.14]


@pytest.mark.parametrize("content", [b"not an image\n", b""])
def test_inspect_bad_file_exits_2_with_reason(tmp_path, capsys, content):
    path = tmp_path / "bad.png"
    path.write_bytes(content)
    status, out, err = inspect(capsys, path)
    assert status == 2 and out == ""
    assert err.startswith("xflow inspect: ") and str(path) in err


def test_inspect_console_script(cxr_samples, tmp_path):
    xflow = Path(sys.executable).with_name("xflow")  # .venv/bin/xflow
    done = subprocess.run([str(xflow), "inspect", str(cxr_samples / CR)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["shape"] == [1, 1024, 1024] and report["format"] == "DICOM"
    assert report["photometric_interpretation"] == "MONOCHROME2"
