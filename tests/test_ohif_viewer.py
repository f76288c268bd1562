"""XFlow's SEGs in the PACS and the OHIF bundled with MONAI Label 0.8.5 (issues 16, 25).

One Orthanc (DICOMweb) and one MONAI Label server with the committed demo model, on loopback,
for the module. The PACS holds a CR phantom with an effusion (what the browser opens) and a
non-square (1024 x 700) crop of the test CR (made from an NIH PNG). A real headless Chromium opens OHIF v3 as MONAI
Label serves it (``/ohif/``): it refuses SEGs in the current OHIF's geometry (what XFlow writes
since issue 25; the current OHIF's review/correct/store loop is ``tests/test_ohif_current.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from types import SimpleNamespace

import numpy as np
import pydicom
import pytest
from browser import chromium, seg_errors, skip_without_chromium, wait_for
from pydicom.uid import generate_uid
from servers import monailabel_server, orthanc_binary, orthanc_server, orthanc_upload

from monailabel_xflow.transforms import labels as label_io

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.skipif(
        orthanc_binary() is None, reason="Orthanc is not installed (apt-get install -y orthanc orthanc-dicomweb)"
    ),
]
needs_browser = skip_without_chromium()


def phantom_cr(path):
    """A 512 px CR phantom with a bilateral effusion; returns the phantom (its lungs are the truth)."""
    from monailabel_xflow.data.export import DicomVariant, quantize, write_dicom
    from monailabel_xflow.data.phantom import generate_phantom

    ph = generate_phantom(7, size=512, findings=("effusion",))
    v12, v8 = quantize(ph.image)
    write_dicom(path, ph, v12, v8, DicomVariant("MONOCHROME2", 8, "CR"), "19990001", "s59990001")
    return ph


def non_square_cr(cxr_samples, path):
    """The test CR (made from an NIH PNG) cropped to 1024 x 700 (H x W), uncompressed, with its own UIDs."""
    ds = pydicom.dcmread(cxr_samples / "dicom" / "cr.dcm")
    pixels = ds.pixel_array[:, :700].copy()
    ds.file_meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds.Columns, ds.PixelData = 700, pixels.tobytes()
    ds.LossyImageCompression = "01"  # it was JPEG once: say so
    ds.StudyInstanceUID, ds.SeriesInstanceUID, ds.SOPInstanceUID = generate_uid(), generate_uid(), generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.save_as(path, write_like_original=False)
    return path


@pytest.fixture(scope="module")
def pacs(tmp_path_factory, cxr_samples):
    tmp = tmp_path_factory.mktemp("ohif")
    phantom = phantom_cr(tmp / "phantom.dcm")
    files = {"phantom": tmp / "phantom.dcm", "wide": non_square_cr(cxr_samples, tmp / "wide.dcm")}
    headers = {k: pydicom.dcmread(f, stop_before_pixels=True) for k, f in files.items()}
    with orthanc_server(tmp / "orthanc") as orthanc:
        for f in files.values():
            orthanc_upload(orthanc, f)
        with monailabel_server(f"{orthanc}/dicom-web", tmp / "server") as server:  # the demo model
            yield SimpleNamespace(
                orthanc=orthanc,
                server=server,
                client=server.client(tmp),
                tmp=tmp,
                files=files,
                phantom=phantom,
                series={k: str(h.SeriesInstanceUID) for k, h in headers.items()},
                study={k: str(h.StudyInstanceUID) for k, h in headers.items()},
            )


def segs_in_pacs(pacs) -> dict[str, pydicom.Dataset]:
    """Every SEG instance in Orthanc, fetched through DICOMweb: {SEG SeriesInstanceUID: dataset}."""
    from dicomweb_client import DICOMwebClient

    web = DICOMwebClient(url=f"{pacs.orthanc}/dicom-web")
    out = {}
    for found in web.search_for_series(search_filters={"Modality": "SEG"}):
        meta = pydicom.Dataset.from_json(found)
        for ds in web.retrieve_series(str(meta.StudyInstanceUID), str(meta.SeriesInstanceUID)):
            out[str(ds.SeriesInstanceUID)] = ds
    return out


def a_datastore(pacs, name: str):
    """The app's DICOMweb datastore, in this process, on the same PACS (what train/scoring use)."""
    from monailabel_xflow.app.datastore import make_dicomweb_datastore

    return make_dicomweb_datastore(f"{pacs.orthanc}/dicom-web", cache_path=str(pacs.tmp / name))


def test_a_saved_label_round_trips_through_orthanc_pixel_identical_on_a_non_square_image(pacs):
    from monailabel_xflow.data.seg import read_seg
    from monailabel_xflow.transforms import labels as layout
    from monailabel_xflow.vocabulary import FINDING_CODES

    label = np.zeros((1024, 700), np.uint8)
    label[100:400, 40:300] = 7  # effusion
    label[500:800, 350:650] = 6  # edema
    label[300:450, 200:260] = 2  # pneumonia, over the effusion
    _, ref = layout.load_image(str(pacs.files["wide"]))  # (H, W) and spacing, as the server sees it
    path = label_io.write_label(label, ref)
    pacs.client.save_label(pacs.series["wide"], path, tag="final")
    segs = [
        ds
        for ds in segs_in_pacs(pacs).values()
        if ds.ReferencedSeriesSequence[0].SeriesInstanceUID == pacs.series["wide"]
    ]
    assert len(segs) == 1
    seg = segs[0]
    assert (seg.Rows, seg.Columns) == (1024, 700) and seg.StudyInstanceUID == pacs.study["wide"]
    assert [(int(s.SegmentNumber), str(s.SegmentLabel)) for s in seg.SegmentSequence] == [
        (1, "pneumonia"),
        (2, "edema"),
        (3, "effusion"),
    ]
    assert {s.SegmentedPropertyTypeCodeSequence[0].CodeValue for s in seg.SegmentSequence} == {
        FINDING_CODES[f].value for f in ("pneumonia", "edema", "effusion")
    }
    np.testing.assert_array_equal(read_seg(seg, (1024, 700)), label)


@pytest.fixture(scope="module")
def stored(pacs):
    """XFlow run through the server on the phantom with ``store_seg``: the result and its SEG."""
    from monailabel_xflow.data.seg import read_seg

    t0 = time.perf_counter()
    label_file, params = pacs.client.infer(
        "xflow", pacs.series["phantom"], {"instruction": "effusion", "store_seg": True, "trace": False}
    )
    seconds = time.perf_counter() - t0
    seg = segs_in_pacs(pacs)[params["seg_series"]]
    mask = read_seg(seg, (512, 512))
    np.testing.assert_array_equal(mask, label_io.read_label(label_file, (512, 512)))  # the SEG is the answer
    return SimpleNamespace(params=params, seg=seg, mask=mask, seconds=seconds)


def test_store_seg_puts_one_seg_with_every_finding_asked_into_the_study(pacs, stored):
    seg = stored.seg
    assert seg.StudyInstanceUID == pacs.study["phantom"] and seg.ContentLabel == "XFLOW_AUTO"
    assert [str(s.SegmentLabel) for s in seg.SegmentSequence] == ["effusion"]
    present = stored.params["findings"][0]["present"]
    assert stored.mask.any() == present and stored.params["findings"][0]["pixels"] == int((stored.mask == 7).sum())


def test_store_seg_of_an_uploaded_image_answers_and_says_why_nothing_was_stored(pacs):
    """An uploaded image has no study to store into: the answer comes back, no SEG is stored, and
    the params say why (a server with ``--conf store_seg true`` still serves uploads)."""

    before = set(segs_in_pacs(pacs))
    label_file, params = pacs.client.infer(
        "xflow", "", {"instruction": "effusion", "store_seg": True, "trace": False}, file=str(pacs.files["phantom"])
    )
    assert params["seg_series"] is None and "upload" in params["seg_not_stored"]
    assert label_io.read_label(label_file, (512, 512)).shape == (512, 512)
    assert set(segs_in_pacs(pacs)) == before


def open_cr(d, url: str) -> None:
    """Open an OHIF mode at ``url``, wait until its first viewport shows the CR, dismiss the
    'Confirm and Hide' notice OHIF shows for data it has not validated."""
    d.get(url)
    wait_for(
        d,
        lambda d: d.execute_script(
            "const e = window.cornerstone && window.cornerstone.getRenderingEngines()[0];"
            "return e && e.getViewports().length && e.getViewports()[0].getImageData();"
        ),
        90,
        "the CR in the viewer",
    )
    for button in d.find_elements("xpath", "//button[contains(., 'Confirm and Hide')]"):
        button.click()


@needs_browser
def test_bundled_viewer_refuses_segs_in_the_current_ohifs_geometry(pacs, stored):
    """Our SEGs carry the plane geometry the current OHIF (3.13) derives for a radiograph
    (``seg.PLANE_ORIENTATION``; ``tests/test_ohif_current.py`` opens, edits and stores them
    there). The older OHIF bundled with MONAI Label 0.8.5 derives another orientation and refuses
    them: checked here, so that the README's statement of that limit stays true."""
    from selenium.webdriver.common.action_chains import ActionChains

    with chromium() as d:
        open_cr(d, f"{pacs.server.url}/ohif/viewer?StudyInstanceUIDs={pacs.study['phantom']}")
        thumb = wait_for(
            d,
            lambda d: d.find_element("xpath", "//*[starts-with(normalize-space(text()), 'XFlow:')]"),
            30,
            "the SEG in the study panel",
        )
        ActionChains(d).double_click(thumb).perform()
        refused = wait_for(
            d,
            lambda d: [e for e in seg_errors(d) if "not yet supported" in e.lower()],
            90,
            "the bundled viewer's answer to the SEG",
        )
        loaded = d.execute_script("return window.services.segmentationService.getSegmentations().length")
    print(f"\nbundled OHIF on a SEG in the current OHIF's geometry: {refused[0][:160]}")
    assert loaded == 0


def test_xflow_seg_is_not_a_label_but_an_ohif_correction_is(pacs, stored):
    """XFlow's stored answer is not a training label; a corrected SEG stored the way OHIF's
    Segmentation mode stores one (a new series of the study, its own segment names and codes) is
    the image's label: listed as labeled, out of the scoring pool, in ``datalist()`` for training."""
    from dicomweb_client import DICOMwebClient

    store = a_datastore(pacs, "cache-before")
    assert pacs.series["phantom"] not in store.get_labeled_images()
    assert pacs.series["phantom"] in store.get_unlabeled_images()
    assert store.preannotated()[pacs.series["phantom"]] == {"effusion"}

    corrected = np.zeros((512, 512), np.uint8)
    corrected[300:420, 60:200] = 7  # the annotator redrew the effusion ...
    corrected[150:250, 320:420] = 6  # ... and added edema
    ohif_seg = _as_ohif_would_store(stored.seg, corrected)
    DICOMwebClient(url=f"{pacs.orthanc}/dicom-web").store_instances([ohif_seg])

    store = a_datastore(pacs, "cache-after")
    assert pacs.series["phantom"] in store.get_labeled_images()
    assert pacs.series["phantom"] not in store.get_unlabeled_images()  # scoring skips it
    pairs = {os.path.basename(p["image"]).removesuffix(".nii.gz"): p["label"] for p in store.datalist()}
    np.testing.assert_array_equal(label_io.read_label(pairs[pacs.series["phantom"]], (512, 512)), corrected)


def _as_ohif_would_store(seg: pydicom.Dataset, label: np.ndarray) -> pydicom.Dataset:
    """A SEG like OHIF's "Export DICOM SEG": same source and geometry, a new series, segments named
    by the annotator with OHIF's default code (SCT 85756007 "Tissue"), no XFlow content label."""
    from monailabel_xflow.data.seg import write_seg

    source = pydicom.Dataset()
    for keyword in (
        "StudyInstanceUID",
        "SeriesInstanceUID",
        "PatientID",
        "PatientName",
        "PatientBirthDate",
        "PatientSex",
        "StudyDate",
        "StudyTime",
        "StudyID",
        "AccessionNumber",
        "ReferringPhysicianName",
    ):
        if keyword in seg:
            setattr(source, keyword, seg.get(keyword))
    ref = seg.ReferencedSeriesSequence[0]
    source.SeriesInstanceUID = ref.SeriesInstanceUID
    source.SOPInstanceUID = ref.ReferencedInstanceSequence[0].ReferencedSOPInstanceUID
    source.SOPClassUID = ref.ReferencedInstanceSequence[0].ReferencedSOPClassUID
    source.Modality, source.Rows, source.Columns = "CR", seg.Rows, seg.Columns
    source.PixelSpacing = seg.SharedFunctionalGroupsSequence[0].PixelMeasuresSequence[0].PixelSpacing
    out = write_seg(label, source, algorithm="OHIF")
    names = {"effusion": "Effusion (left base)", "edema": "pulmonary edema"}
    for s in out.SegmentSequence:
        s.SegmentLabel = names[str(s.SegmentLabel)]
        s.SegmentedPropertyTypeCodeSequence[0].CodeValue = "85756007"
        s.SegmentedPropertyTypeCodeSequence[0].CodeMeaning = "Tissue"
        s.SegmentAlgorithmType = "MANUAL"
    out.ContentLabel, out.Manufacturer, out.SeriesDescription = "SEGMENTATION", "dcmjs", "Segmentation"
    return out


def test_preannotate_stores_segs_for_every_series_and_resumes(pacs, capsys, monkeypatch, monailabel_settings):
    from monailabel_xflow.cli import main

    for key in [k for k in os.environ if k.startswith("XFLOW_")]:
        monkeypatch.delenv(key)  # the demo model, as the server uses
    workspace = pacs.tmp / "pre-workspace"  # $XFLOW_WORKSPACE first, as xflow serve reads it
    monkeypatch.setenv("XFLOW_WORKSPACE", str(workspace))
    for key in ("MONAI_LABEL_DICOMWEB_CACHE_PATH", "MONAI_LABEL_DATASTORE_CACHE_PATH"):
        monkeypatch.delenv(key, raising=False)
    argv = ["preannotate", "--studies", f"{pacs.orthanc}/dicom-web", "--finding", "edema", "--no-revise"]
    t0 = time.perf_counter()
    assert main(argv) == 0
    t1 = time.perf_counter()
    # the series went to the workspace's cache, as the server's would (one folder per series)
    cached = {p.name for p in (workspace / "cache" / "dicomweb").rglob("*") if p.is_dir()}
    assert set(pacs.series.values()) <= cached
    assert "written by `xflow serve`" in (workspace / "main.py").read_text()
    monkeypatch.delenv("XFLOW_WORKSPACE")
    argv += ["--workspace", str(workspace)]
    first = capsys.readouterr()
    summary = json.loads(first.out)
    assert {d["image"] for d in summary["done"]} == set(pacs.series.values()) and not summary["failed"]
    assert "pre-annotating" in first.err  # progress
    segs = segs_in_pacs(pacs)
    for done in summary["done"]:
        seg = segs[done["seg_series"]]
        assert seg.ContentLabel == "XFLOW_AUTO" and [s.SegmentLabel for s in seg.SegmentSequence] == ["edema"]
    assert main(argv) == 0  # resumed: everything is done already
    t2 = time.perf_counter()
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["done"] == [] and resumed["skipped"] == len(pacs.series)
    assert len(segs_in_pacs(pacs)) == len(segs)  # nothing stored twice
    with capsys.disabled():
        print(f"\npreannotate: first run {t1 - t0:.1f} s, resumed run {t2 - t1:.1f} s")
    shutil.rmtree(workspace, ignore_errors=True)


def test_rosalia_store_seg_puts_its_answer_into_the_study_as_a_rosalia_seg(pacs):
    """The ``rosalia`` task's ``store_seg``, as ``xflow``'s: one SEG in the phantom's study, a segment
    per finding asked (present or not), its pixels the label the request returned, named ROSALIA
    (series description, model name, algorithm); an unreviewed answer (``XFLOW_AUTO``) that is not
    one of XFlow's pre-annotations (``xflow preannotate`` would not skip the series for it)."""
    from monailabel_xflow.data.seg import read_seg, read_seg_masks

    before = set(segs_in_pacs(pacs))
    label_file, params = pacs.client.infer(
        "rosalia", pacs.series["phantom"], {"finding": ["effusion", "pneumonia"], "store_seg": True, "trace": False}
    )
    segs = segs_in_pacs(pacs)
    assert set(segs) - before == {params["seg_series"]} and "store_seg" not in params
    seg = segs[params["seg_series"]]
    assert seg.StudyInstanceUID == pacs.study["phantom"] and seg.ContentLabel == "XFLOW_AUTO"
    assert seg.SeriesDescription.startswith("ROSALIA: ") and "XFlow" not in seg.SeriesDescription
    assert seg.ManufacturerModelName == "ROSALIA"
    assert {str(s.SegmentAlgorithmName) for s in seg.SegmentSequence} == {"ROSALIA"}
    assert [str(s.SegmentLabel) for s in seg.SegmentSequence] == ["pneumonia", "effusion"]  # FINDINGS order
    label = label_io.read_label(label_file, (512, 512))
    np.testing.assert_array_equal(read_seg(seg, (512, 512)), label)  # the SEG is the answer
    records = {r["finding"]: r for r in params["findings"]}
    assert records["effusion"]["present"] and int((label == 7).sum()) == records["effusion"]["pixels"] > 0
    # where both are found the later finding (effusion) wins in the label map, as in xflow's labels ...
    assert int((label == 2).sum()) == records["pneumonia"]["pixels"] - params["overlap_pixels"]
    # ... but the SEG keeps each finding's full mask (issue 25: overlaps are not cut out)
    masks = read_seg_masks(seg, (512, 512))
    assert {f: int(m.sum()) for f, m in masks.items()} == {f: records[f]["pixels"] for f in ("pneumonia", "effusion")}
    assert "pneumonia" not in a_datastore(pacs, "cache-rosalia").preannotated().get(pacs.series["phantom"], set())
