"""CXR loading transforms: formats, orientation, DICOM intensity pipeline, errors.

Real radiographs come from the ``cxr_samples`` fixture; every other file is written here into
``tmp_path`` with PIL, pydicom or nibabel, independently of the code under test (except the
NIfTI writer ``save_nifti_2d``, whose on-disk layout is checked with nibabel and SimpleITK).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from monailabel_xflow.transforms import CXRLoadError, load_cxr, save_nifti_2d

CR = "dicom/cr.dcm"
MONO1 = "dicom/cr_monochrome1.dcm"
PNG = "nih/images/00000129_000.png"
RGBA_PNG = "nih/images/00001369_000.png"

H, W = 256, 320  # asymmetric on purpose: a transpose cannot go unnoticed
MARK = (37, 251)  # (row, col) of the bright marker


def minmax(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return (a - a.min()) / (a.max() - a.min())


def marker_image(dtype=np.uint8, peak: int = 255) -> np.ndarray:
    """(H, W) dim horizontal gradient with one bright pixel at MARK."""
    image = np.tile(np.linspace(0, peak // 3, W), (H, 1)).astype(dtype)
    image[MARK] = peak
    return image


def write_dicom(
    path: Path, pixels: np.ndarray, photometric: str = "MONOCHROME2", bits_stored: int | None = None, **tags
) -> Path:
    """An uncompressed single-frame DICOM of ``pixels`` ((rows, cols) or (rows, cols, 3))."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, SecondaryCaptureImageStorage, generate_uid

    file_meta = FileMetaDataset()
    file_meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    file_meta.MediaStorageSOPInstanceUID = generate_uid()
    file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = FileDataset(str(path), {}, file_meta=file_meta, preamble=b"\0" * 128)
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.SOPClassUID = file_meta.MediaStorageSOPClassUID
    ds.SOPInstanceUID = file_meta.MediaStorageSOPInstanceUID
    ds.Modality = "DX"
    ds.Rows, ds.Columns = pixels.shape[:2]
    ds.SamplesPerPixel = 3 if pixels.ndim == 3 else 1
    if pixels.ndim == 3:
        ds.PlanarConfiguration = 0
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = pixels.dtype.itemsize * 8
    ds.BitsStored = bits_stored or ds.BitsAllocated
    ds.HighBit = ds.BitsStored - 1
    ds.PixelRepresentation = int(pixels.dtype.kind == "i")
    for name, value in tags.items():
        setattr(ds, name, value)
    ds.PixelData = np.ascontiguousarray(pixels).tobytes()
    ds.save_as(str(path), write_like_original=False)
    return path


# --- real radiographs -----------------------------------------------------------------------


def test_png_sample_is_float_unit_range_with_meta(cxr_samples):
    from PIL import Image

    image, meta = load_cxr(cxr_samples / PNG)
    assert image.shape == (1024, 1024) and image.dtype == np.float32
    assert image.min() == 0.0 and image.max() == 1.0
    np.testing.assert_allclose(image, minmax(np.array(Image.open(cxr_samples / PNG))), atol=1e-6)
    assert meta == {
        "filename_or_obj": str(cxr_samples / PNG),
        "format": "PNG",
        "original_size": (1024, 1024),
        "spacing": None,
        "photometric_interpretation": "MONOCHROME2",
        "view_position": None,
        "modality": None,
        "bits_stored": 8,
    }


def test_rgba_png_equals_its_grayscale_content(cxr_samples):
    from PIL import Image

    with Image.open(cxr_samples / RGBA_PNG) as pil:
        assert pil.mode == "RGBA"
        gray = np.array(pil.convert("L"))
    image, meta = load_cxr(cxr_samples / RGBA_PNG)
    np.testing.assert_allclose(image, minmax(gray), atol=1e-6)
    assert meta["photometric_interpretation"] == "RGB" and meta["original_size"] == (1024, 1024)


def test_jpeg_baseline_dicom_sample(cxr_samples):
    import pydicom

    image, meta = load_cxr(cxr_samples / CR)
    raw = pydicom.dcmread(cxr_samples / CR).pixel_array  # (Rows, Columns) by definition
    np.testing.assert_allclose(image, minmax(raw), atol=1e-6)
    assert image.dtype == np.float32
    assert meta["spacing"] == (0.168, 0.168)
    assert (meta["view_position"], meta["modality"], meta["bits_stored"]) == ("PA", "CR", 8)
    assert meta["photometric_interpretation"] == "MONOCHROME2" and meta["format"] == "DICOM"


def test_monochrome1_loads_as_inverse_of_monochrome2(cxr_samples):
    import pydicom

    mono1 = pydicom.dcmread(cxr_samples / MONO1)
    mono2 = pydicom.dcmread(cxr_samples / CR)
    assert np.array_equal(mono1.pixel_array, mono2.pixel_array)  # same stored pixels
    image1, meta1 = load_cxr(cxr_samples / MONO1)
    image2, _ = load_cxr(cxr_samples / CR)
    assert meta1["photometric_interpretation"] == "MONOCHROME1"
    assert np.abs(image1 - (1.0 - image2)).max() <= 1 / 255
    assert not np.allclose(image1, image2, atol=0.1)


def test_jpeg_file_matches_png(cxr_samples, tmp_path):
    from PIL import Image

    path = tmp_path / "cxr.jpg"
    Image.open(cxr_samples / PNG).save(path, quality=95)
    image, meta = load_cxr(path)
    reference, _ = load_cxr(cxr_samples / PNG)
    assert meta["format"] == "JPEG" and image.shape == reference.shape
    assert np.abs(image - reference).mean() < 0.01


# --- orientation ----------------------------------------------------------------------------


def test_marker_lands_on_same_pixel_from_png_dicom_nifti(tmp_path):
    from PIL import Image

    source = marker_image()
    Image.fromarray(source).save(tmp_path / "m.png")
    write_dicom(tmp_path / "m.dcm", source)
    save_nifti_2d(source, tmp_path / "m.nii.gz")
    for name in ("m.png", "m.dcm", "m.nii.gz"):
        image, meta = load_cxr(tmp_path / name)
        assert image.shape == (H, W), name
        assert meta["original_size"] == (H, W), name
        assert np.unravel_index(np.argmax(image), image.shape) == MARK, name
        np.testing.assert_allclose(image, minmax(source), atol=1e-6, err_msg=name)


@pytest.mark.parametrize("mode", ["L", "LA", "RGB", "RGBA", "I;16"])
def test_png_modes_keep_orientation_and_content(tmp_path, mode):
    from PIL import Image

    source = marker_image()
    pil = Image.fromarray(source)
    pil = pil.convert(mode) if mode != "I;16" else Image.fromarray(source.astype(np.uint16) * 257)
    pil.save(tmp_path / "m.png")
    with Image.open(tmp_path / "m.png") as reopened:
        assert reopened.mode == mode
    image, _ = load_cxr(tmp_path / "m.png")
    np.testing.assert_allclose(image, minmax(source), atol=1e-6)
    assert np.unravel_index(np.argmax(image), image.shape) == MARK


def test_save_nifti_2d_writes_w_h_1_with_itk_identity_geometry(tmp_path):
    import nibabel as nib
    import SimpleITK as sitk

    source = marker_image()
    path = save_nifti_2d(source, tmp_path / "m.nii.gz", spacing=(0.2, 0.3))
    on_disk = np.asanyarray(nib.load(path).dataobj)
    assert on_disk.shape == (W, H, 1) and on_disk.dtype == np.uint8
    assert on_disk[MARK[1], MARK[0], 0] == 255  # voxel [i, j, k] = [col, row, 0]
    itk_image = sitk.ReadImage(str(path))
    assert itk_image.GetSize() == (W, H, 1)
    np.testing.assert_allclose(itk_image.GetSpacing(), (0.3, 0.2, 1.0), rtol=1e-6)
    np.testing.assert_allclose(itk_image.GetDirection(), np.eye(3).ravel(), atol=1e-6)
    np.testing.assert_allclose(itk_image.GetOrigin(), (0, 0, 0), atol=1e-6)
    assert itk_image.GetPixel(MARK[1], MARK[0], 0) == 255
    image, meta = load_cxr(path)
    assert np.unravel_index(np.argmax(image), image.shape) == MARK
    np.testing.assert_allclose(meta["spacing"], (0.2, 0.3), rtol=1e-6)
    assert meta["format"] == "NIfTI" and meta["bits_stored"] is None


def test_reader_order_helpers_are_the_one_transpose():
    from monailabel_xflow.transforms import from_reader_order, to_reader_order

    image = marker_image()
    as_read = to_reader_order(image)[..., None]  # what MONAI's readers give: (W, H, 1)
    assert as_read.shape == (W, H, 1) and as_read[MARK[1], MARK[0], 0] == 255
    assert from_reader_order(as_read).shape == (H, W, 1)
    np.testing.assert_array_equal(from_reader_order(to_reader_order(image)), image)


def test_save_nifti_2d_stores_bool_as_uint8_and_refuses_3d(tmp_path):
    import nibabel as nib

    mask = np.zeros((H, W), bool)
    mask[10:20, 200:220] = True
    path = save_nifti_2d(mask, tmp_path / "mask.nii")
    assert np.asanyarray(nib.load(path).dataobj).dtype == np.uint8
    with pytest.raises(ValueError, match="expects an \\(H, W\\) array"):
        save_nifti_2d(np.zeros((2, H, W)), tmp_path / "bad.nii")
    with pytest.raises(ValueError, match="spacing"):
        save_nifti_2d(mask, tmp_path / "bad.nii", spacing=(0, 1))


def test_plain_2d_nifti_loads_in_the_same_convention(tmp_path):
    import nibabel as nib

    source = marker_image().astype(np.float32)
    nib.save(nib.Nifti1Image(source.T.copy(), np.eye(4)), tmp_path / "flat.nii")  # (W, H)
    image, meta = load_cxr(tmp_path / "flat.nii")
    assert np.unravel_index(np.argmax(image), image.shape) == MARK
    assert meta["spacing"] == (1.0, 1.0)


# --- DICOM intensity pipeline ---------------------------------------------------------------


def test_16_bit_png_keeps_full_precision(tmp_path):
    from PIL import Image

    source = np.tile(np.arange(W, dtype=np.uint16) + 1000, (H, 1))  # 12-bit data, 1-step ramp
    source[MARK] = 4095
    Image.fromarray(source).save(tmp_path / "deep.png")
    image, meta = load_cxr(tmp_path / "deep.png")
    np.testing.assert_allclose(image, minmax(source), atol=1e-6)
    assert len(np.unique(image[0])) == W  # an 8-bit detour would merge neighbouring steps
    assert meta["bits_stored"] == 16


def test_rescale_slope_intercept_applied(tmp_path):
    stored = marker_image(np.uint16, peak=4000)
    write_dicom(tmp_path / "neg.dcm", stored, bits_stored=12, RescaleSlope=-1, RescaleIntercept=4095)
    image, _ = load_cxr(tmp_path / "neg.dcm")
    np.testing.assert_allclose(image, 1.0 - minmax(stored), atol=1e-6)  # negative slope inverts
    assert np.unravel_index(np.argmin(image), image.shape) == MARK


def test_window_applies_in_rescaled_units(tmp_path):
    hu = np.tile(np.linspace(-400, 600, W), (H, 1)).round()
    stored = (hu + 1024).astype(np.uint16)
    write_dicom(
        tmp_path / "win.dcm",
        stored,
        bits_stored=12,
        RescaleSlope=1,
        RescaleIntercept=-1024,
        WindowCenter=40,
        WindowWidth=400,
    )
    image, _ = load_cxr(tmp_path / "win.dcm")
    center, width = 40.0, 400.0  # DICOM PS3.3 C.11.2.1.2.1, LINEAR
    expected = np.clip((hu - (center - 0.5)) / (width - 1) + 0.5, 0.0, 1.0)
    np.testing.assert_allclose(image, expected, atol=1e-3)
    assert image[0, 0] == 0.0 and image[0, -1] == 1.0


def test_voi_lut_sequence_applied(tmp_path):
    from pydicom.dataset import Dataset

    stored = marker_image(np.uint16, peak=255)
    lut = Dataset()
    lut.add_new((0x0028, 0x3002), "US", [256, 0, 16])  # LUT Descriptor
    lut.add_new((0x0028, 0x3006), "US", [int(v) for v in (255 - np.arange(256)) ** 2])  # data
    write_dicom(tmp_path / "lut.dcm", stored, bits_stored=8, VOILUTSequence=[lut])
    image, _ = load_cxr(tmp_path / "lut.dcm")
    np.testing.assert_allclose(image, minmax((255.0 - stored) ** 2), atol=1e-6)  # not linear


def test_bits_stored_masks_high_bits(tmp_path):
    stored = marker_image(np.uint16, peak=4095)
    dirty = stored.copy()
    dirty[::2] |= 0xF000  # overlay/garbage in the bits above Bits Stored
    write_dicom(tmp_path / "bits.dcm", dirty, bits_stored=12)
    image, meta = load_cxr(tmp_path / "bits.dcm")
    np.testing.assert_allclose(image, minmax(stored), atol=1e-6)
    assert meta["bits_stored"] == 12


def test_signed_pixels_are_sign_extended(tmp_path):
    values = np.tile(np.linspace(-2000, 2000, W), (H, 1)).astype(np.int16)
    raw = (values.view(np.uint16) & 0x0FFF).view(np.int16)  # 12-bit two's complement, high bits 0
    write_dicom(tmp_path / "signed.dcm", raw, bits_stored=12)
    image, _ = load_cxr(tmp_path / "signed.dcm")
    np.testing.assert_allclose(image, minmax(values), atol=1e-6)


def test_rgb_dicom_is_converted_to_gray(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(H, W, 3), dtype=np.uint8)
    write_dicom(tmp_path / "rgb.dcm", rgb, photometric="RGB")
    image, meta = load_cxr(tmp_path / "rgb.dcm")
    luma = np.array(Image.fromarray(rgb).convert("L"))  # PIL's own RGB -> L
    assert image.shape == (H, W) and meta["photometric_interpretation"] == "RGB"
    assert np.abs(image - minmax(luma)).max() <= 1.5 / 255


def test_jpeg_ybr_dicom_keeps_the_luma(tmp_path):
    """Colour JPEG-baseline DICOMs decode to YBR in pydicom 2.4: Y is the gray image."""
    import io

    from PIL import Image
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGBaseline8Bit

    rgb = np.zeros((H, W, 3), np.uint8)
    rgb[..., 0] = np.tile(np.linspace(0, 255, W), (H, 1))
    rgb[..., 1] = np.tile(np.linspace(0, 255, H)[:, None], (1, W))
    rgb[..., 2] = 90
    jpeg = io.BytesIO()
    Image.fromarray(rgb).save(jpeg, format="JPEG", quality=95, subsampling="4:2:2")
    path = write_dicom(tmp_path / "ybr.dcm", rgb, photometric="YBR_FULL_422")
    from pydicom import dcmread

    ds = dcmread(path)
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.PixelData = encapsulate([jpeg.getvalue()])
    ds["PixelData"].VR, ds["PixelData"].is_undefined_length = "OB", True
    ds.save_as(str(path), write_like_original=False)
    image, meta = load_cxr(path)
    luma = np.array(Image.fromarray(rgb).convert("L"))
    assert meta["photometric_interpretation"] == "YBR_FULL_422"
    assert np.abs(image - minmax(luma)).max() < 0.02  # JPEG loss only


# --- errors ---------------------------------------------------------------------------------


def assert_load_error(path: Path, *words: str, **kwargs) -> CXRLoadError:
    with pytest.raises(CXRLoadError) as info:
        load_cxr(path, **kwargs)
    error = info.value
    assert isinstance(error, ValueError)
    assert error.path == str(path) and str(path) in str(error)
    assert error.reason and error.reason in str(error)
    for word in words:
        assert word in error.reason.lower(), error.reason
    return error


@pytest.mark.parametrize("name", ["notes.png", "notes.dcm", "notes.nii.gz", "notes.jpg", "notes.txt"])
def test_text_file_with_image_suffix_is_refused(tmp_path, name):
    path = tmp_path / name
    path.write_text("this is not an image\n" * 20)
    assert_load_error(path)


def test_missing_and_zero_byte_files(tmp_path):
    assert_load_error(tmp_path / "absent.png", "no such file")
    (tmp_path / "zero.dcm").write_bytes(b"")
    assert_load_error(tmp_path / "zero.dcm", "empty")


@pytest.mark.parametrize("sample", [PNG, CR])
def test_truncated_files_are_refused(cxr_samples, tmp_path, sample):
    data = (cxr_samples / sample).read_bytes()
    path = tmp_path / ("cut" + Path(sample).suffix)
    path.write_bytes(data[: len(data) // 2])
    assert_load_error(path, "unreadable")


@pytest.mark.parametrize("name", ["full.nii.gz", "full.dcm"])
def test_truncated_nifti_and_native_dicom_are_refused(tmp_path, name):
    full = tmp_path / name
    if name.endswith(".dcm"):
        write_dicom(full, marker_image(np.uint16, peak=4095), bits_stored=12)
    else:
        save_nifti_2d(marker_image(), full)
    data = full.read_bytes()
    cut = tmp_path / name.replace("full", "cut")
    cut.write_bytes(data[: len(data) // 2])
    assert_load_error(cut, "unreadable")


def test_multi_slice_volumes_are_refused(tmp_path):
    import nibabel as nib

    nib.save(nib.Nifti1Image(np.random.rand(W, H, 3).astype(np.float32), np.eye(4)), tmp_path / "vol.nii.gz")
    assert_load_error(tmp_path / "vol.nii.gz", "(320, 256, 3)", "2d")
    frames = np.stack([marker_image()] * 2)
    path = write_dicom(tmp_path / "frames.dcm", frames[0], NumberOfFrames=2)
    from pydicom import dcmread

    ds = dcmread(path)
    ds.PixelData = frames.tobytes()
    ds.save_as(str(path))
    assert_load_error(path, "2 frames")


def test_constant_and_zero_size_images_are_refused(tmp_path):
    import nibabel as nib
    from PIL import Image

    Image.new("L", (W, H), 128).save(tmp_path / "flat.png")
    assert_load_error(tmp_path / "flat.png", "empty", "128")
    write_dicom(tmp_path / "black.dcm", np.zeros((H, W), np.uint16))
    assert_load_error(tmp_path / "black.dcm", "empty")
    nib.save(nib.Nifti1Image(np.zeros((0, W, 1), np.float32), np.eye(4)), tmp_path / "none.nii")
    assert_load_error(tmp_path / "none.nii", "empty")


@pytest.mark.parametrize("view", ["LL", "RL", "LATERAL", "LAT"])
def test_lateral_views_are_refused_unless_allowed(tmp_path, view):
    path = write_dicom(tmp_path / "lat.dcm", marker_image(), ViewPosition=view)
    assert_load_error(path, "lateral", "allow_lateral")
    image, meta = load_cxr(path, allow_lateral=True)
    assert meta["view_position"] == view
    assert np.unravel_index(np.argmax(image), image.shape) == MARK


def test_frontal_views_pass(tmp_path):
    for view in ("PA", "AP", ""):
        path = write_dicom(tmp_path / f"v{view}.dcm", marker_image(), ViewPosition=view)
        _, meta = load_cxr(path)
        assert meta["view_position"] == (view or None)


# --- MONAI transforms -----------------------------------------------------------------------


def test_load_cxr_transform_returns_channel_first_metatensor(tmp_path):
    from monai.data import MetaTensor

    from monailabel_xflow.transforms import LoadCXR

    path = write_dicom(tmp_path / "m.dcm", marker_image(), PixelSpacing=[0.2, 0.3])
    tensor = LoadCXR()(path)
    image, meta = load_cxr(path)
    assert isinstance(tensor, MetaTensor)
    assert tuple(tensor.shape) == (1, H, W) and str(tensor.dtype) == "torch.float32"
    np.testing.assert_array_equal(tensor[0].numpy(), image)
    for key, value in meta.items():
        assert tensor.meta[key] == value, key
    np.testing.assert_allclose(tensor.pixdim.numpy(), (0.2, 0.3))  # (row, col) frame
    with pytest.raises(CXRLoadError):
        LoadCXR()(tmp_path / "absent.dcm")


def test_load_cxr_dict_transform(tmp_path):
    from monailabel_xflow.transforms import LoadCXRd

    lateral = write_dicom(tmp_path / "lat.dcm", marker_image(), ViewPosition="LL")
    data = {"image": lateral, "label": "kept"}
    with pytest.raises(CXRLoadError, match="lateral"):
        LoadCXRd("image")(data)
    out = LoadCXRd("image", allow_lateral=True, image_only=False)(data)
    assert out["label"] == "kept" and data["image"] == lateral  # input dict untouched
    assert tuple(out["image"].shape) == (1, H, W)
    assert out["image_meta_dict"]["view_position"] == "LL"
    assert out["image_meta_dict"]["original_size"] == (H, W)
    assert LoadCXRd(["image", "other"], allow_missing_keys=True, allow_lateral=True)(data)
    with pytest.raises(KeyError):
        LoadCXRd("other")(data)


def test_package_import_stays_light():
    code = (
        "import sys, monailabel_xflow.transforms as t; "
        "from monailabel_xflow.transforms import load_cxr, CXRLoadError, save_nifti_2d; "
        "heavy = [m for m in ('monai', 'torch', 'pydicom', 'nibabel') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
