"""The current OHIF (3.13, ``xflow ohif``): review XFlow's SEGs, correct them, store, train (issue 25).

One Orthanc (DICOMweb) for the module, holding three radiographs: a CR phantom and a DX copy of
it (MONOCHROME1, 12-bit) with an effusion, and a second CR (``other``) whose label is a SEG
saved earlier. ``xflow preannotate`` (the committed demo model, in this process) stores XFlow's
effusion SEG for every series; ``xflow ohif`` serves OHIF 3.13.2 from ``.ohif/`` (``make
ohif``) with that PACS behind one loopback origin. A real headless Chromium then does what an
annotator does: opens the CR / DX in the Basic Viewer and sees XFlow's mask (screenshot pixels:
tinted inside, not outside), opens it in Segmentation mode, paints a brush stroke with the mouse
and stores the segmentation; the plugin's datastore then reads OHIF's Label Map SEG as the
image's label with the stroke in it, and the ``xflow`` train task trains on it. A malformed SEG
in the PACS is skipped with its reason while the others still train.

Everything is done with the mouse, as an annotator would: thumbnails, OHIF's prompts, the brush
(a stroke dragged across the image), the segmentation's menu (Export -> DICOM SEG) and its
*Save*; page JavaScript only reads state (where the viewport draws the image, whether a
segmentation is loaded). Screenshots go to ``$XFLOW_OHIF_SCREENSHOTS`` when set
(the README's come from there).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import time
from types import SimpleNamespace

import numpy as np
import pydicom
import pytest
import requests
from browser import chromium, console, image_to_page, sample_page, screenshot, skip_without_chromium, tinted, wait_for
from servers import orthanc_binary, orthanc_server, orthanc_upload

from monailabel_xflow.commands.ohif import OHIF_VERSION, dist_dir, serve_in_thread
from monailabel_xflow.transforms import labels as label_io

OHIF_MISSING = (
    None
    if (dist_dir() / "index.html").is_file()
    else (f"OHIF {OHIF_VERSION} is not installed in {dist_dir()} (make ohif)")
)
if OHIF_MISSING and os.environ.get("XFLOW_REQUIRE_BROWSER") == "1":
    raise RuntimeError(f"XFLOW_REQUIRE_BROWSER=1 but {OHIF_MISSING}")

pytestmark = [
    pytest.mark.timeout(1500),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.skipif(
        orthanc_binary() is None, reason="Orthanc is not installed (apt-get install -y orthanc orthanc-dicomweb)"
    ),
    pytest.mark.skipif(OHIF_MISSING is not None, reason=OHIF_MISSING or ""),
]
needs_browser = skip_without_chromium()


def write_phantom(path, seed: int, variant, findings=("effusion",)):
    """A 512 px phantom radiograph as DICOM (own UIDs); returns the phantom (its masks are truth)."""
    from monailabel_xflow.data.export import quantize, write_dicom
    from monailabel_xflow.data.phantom import generate_phantom

    ph = generate_phantom(seed, size=512, findings=findings)
    v12, v8 = quantize(ph.image)
    write_dicom(path, ph, v12, v8, variant, f"1999{seed:04d}", f"s5999{seed:04d}")
    return ph


def segs_in_pacs(orthanc: str) -> dict[str, pydicom.Dataset]:
    """Every SEG in the PACS as stored ({SeriesInstanceUID: dataset}), fetched through DICOMweb."""
    from dicomweb_client import DICOMwebClient

    web = DICOMwebClient(url=f"{orthanc}/dicom-web")
    out = {}
    for found in web.search_for_series(search_filters={"Modality": "SEG"}):
        meta = pydicom.Dataset.from_json(found)
        for ds in web.retrieve_series(
            str(meta.StudyInstanceUID), str(meta.SeriesInstanceUID), media_types=(("application/dicom", "*"),)
        ):
            out[str(ds.SeriesInstanceUID)] = ds
    return out


@pytest.fixture(scope="module")
def pacs(tmp_path_factory):
    from monailabel_xflow.cli import main
    from monailabel_xflow.data.export import DicomVariant
    from monailabel_xflow.data.seg import write_seg

    tmp = tmp_path_factory.mktemp("ohif-current")
    phantoms = {
        "cr": write_phantom(tmp / "cr.dcm", 7, DicomVariant("MONOCHROME2", 8, "CR")),
        "dx": write_phantom(tmp / "dx.dcm", 7, DicomVariant("MONOCHROME1", 16, "DX")),
        "other": write_phantom(tmp / "other.dcm", 11, DicomVariant("MONOCHROME2", 8, "CR"), ("edema",)),
    }
    headers = {k: pydicom.dcmread(tmp / f"{k}.dcm", stop_before_pixels=True) for k in phantoms}
    other_label = np.zeros((512, 512), np.uint8)
    for lesion in phantoms["other"].lesions:
        other_label[lesion.mask] = 6  # edema, a label saved earlier (e.g. from 3D Slicer)
    saved = write_seg(other_label, tmp / "other.dcm", tmp / "other-label.dcm")
    rows, cols = np.nonzero(other_label)
    overlap = {"edema": other_label == 6, "opacity": np.zeros((512, 512), bool)}
    overlap["opacity"][rows.min() - 20 : (rows.min() + rows.max()) // 2, cols.min() - 20 : cols.max() + 20] = True
    both = write_seg(np.zeros((512, 512), np.uint8), tmp / "other.dcm", masks=overlap, description="Overlap check")
    both.ContentLabel = "XFLOW_AUTO"  # shown, not a label
    both.save_as(str(tmp / "other-overlap.dcm"))
    with orthanc_server(tmp / "orthanc") as orthanc, pytest.MonkeyPatch.context() as mp:
        for name in phantoms:
            orthanc_upload(orthanc, tmp / f"{name}.dcm")
        orthanc_upload(orthanc, tmp / "other-label.dcm")
        orthanc_upload(orthanc, tmp / "other-overlap.dcm")
        kept = ("XFLOW_OHIF_SCREENSHOTS", "XFLOW_OHIF_DIR")  # where the viewer is installed
        for key in [k for k in os.environ if k.startswith("XFLOW_") and k not in kept]:
            mp.delenv(key)  # the committed demo model
        t0 = time.perf_counter()
        assert (
            main(
                [
                    "preannotate",
                    "--studies",
                    f"{orthanc}/dicom-web",
                    "--finding",
                    "effusion",
                    "--cache",
                    str(tmp / "pre-cache"),
                    "--workspace",
                    str(tmp / "pre-workspace"),
                ]
            )
            == 0
        )
        preannotate_s = time.perf_counter() - t0
        segs = segs_in_pacs(orthanc)
        xflow = {
            str(ds.ReferencedSeriesSequence[0].SeriesInstanceUID): ds
            for ds in segs.values()
            if ds.get("ContentLabel") == "XFLOW_AUTO"
        }
        server, url = serve_in_thread(dist_dir(), f"{orthanc}/dicom-web")
        try:
            yield SimpleNamespace(
                orthanc=orthanc,
                url=url,
                tmp=tmp,
                phantoms=phantoms,
                preannotate_s=preannotate_s,
                series={k: str(h.SeriesInstanceUID) for k, h in headers.items()},
                study={k: str(h.StudyInstanceUID) for k, h in headers.items()},
                xflow={k: xflow[str(h.SeriesInstanceUID)] for k, h in headers.items()},
                saved_label=str(saved.SeriesInstanceUID),
                overlap=overlap,
            )
        finally:
            server.shutdown()
            server.server_close()


def a_datastore(pacs, name: str):
    """The app's DICOMweb datastore on the PACS, in this process (what training and scoring use)."""
    from monailabel_xflow.app.datastore import make_dicomweb_datastore

    return make_dicomweb_datastore(f"{pacs.orthanc}/dicom-web", cache_path=str(pacs.tmp / name))


def xflow_mask(pacs, key: str) -> np.ndarray:
    from monailabel_xflow.data.seg import read_seg_masks

    return read_seg_masks(pacs.xflow[key], (512, 512))["effusion"]


# --- the server, without a browser -------------------------------------------------------------


def test_xflow_ohif_serves_the_viewer_and_the_pacs_behind_one_origin(pacs, tmp_path, capsys):
    from monailabel_xflow.cli import main

    index = requests.get(f"{pacs.url}/", timeout=10)
    assert index.status_code == 200 and "app-config.js" in index.text
    route = requests.get(f"{pacs.url}/segmentation?StudyInstanceUIDs={pacs.study['cr']}", timeout=10)
    assert route.text == index.text  # the viewer's own routes get the app
    config = requests.get(f"{pacs.url}/app-config.js", timeout=10).text
    assert "dataSourcesModule.dicomweb" in config and "window.location.origin + '/dicom-web'" in config
    assert "cloudfront" not in config  # never the package's public demo server
    studies = requests.get(f"{pacs.url}/dicom-web/studies", headers={"Accept": "application/dicom+json"}, timeout=10)
    found = {pydicom.Dataset.from_json(s).StudyInstanceUID for s in studies.json()}
    assert found == set(pacs.study.values())
    frame = requests.get(
        f"{pacs.url}/dicom-web/studies/{pacs.study['cr']}/series/{pacs.series['cr']}/metadata", timeout=10
    )
    assert frame.status_code == 200 and pacs.orthanc not in frame.text  # no PACS URL leaks to the page
    assert requests.get(f"{pacs.url}/no-such.js", timeout=10).status_code == 404
    host, port = pacs.url.removeprefix("http://").split(":")
    for method, path, status in (
        ("GET", "/dicom-web/../system", 400),
        ("GET", "/dicom-web/%2e%2e/system", 400),
        ("GET", "/../../etc/passwd", 400),
        ("POST", "/dicom-web/tools/find", 405),
        ("DELETE", f"/dicom-web/studies/{pacs.study['cr']}", 501),
    ):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request(method, path)  # sent as written (requests would normalise the '..')
        assert conn.getresponse().status == status, (method, path)
        conn.close()
    assert requests.get(f"{pacs.orthanc}/studies", timeout=10).status_code == 200  # the PACS is intact
    assert host == "127.0.0.1"
    assert main(["ohif", "--studies", "ftp://pacs"]) == 2
    assert main(["ohif", "--studies", f"{pacs.orthanc}/dicom-web", "--dir", str(tmp_path)]) == 2
    assert "make ohif" in capsys.readouterr().err


# --- in the browser --------------------------------------------------------------------------------


def open_study(d, url: str) -> float:
    """Open an OHIF route, wait until its viewport shows the radiograph, dismiss the notices
    (investigational use, the guided tour). Returns the seconds it took."""
    t0 = time.perf_counter()
    d.get(url)
    wait_for(
        d,
        lambda d: d.execute_script(
            "const e = window.cornerstone && window.cornerstone.getRenderingEngines()[0];"
            "return e && e.getViewports().length && e.getViewports()[0].getImageData();"
        ),
        120,
        "the radiograph",
    )
    for xpath in ("//button[contains(., 'Confirm and hide')]", "//*[normalize-space(text())='Skip all']"):
        for button in d.find_elements("xpath", xpath):
            button.click()
    return time.perf_counter() - t0


def open_xflow_seg(d, name: str = "XFlow:") -> None:
    """Double-click XFlow's SEG (the one whose description starts with ``name``) in the study
    panel and accept OHIF's 'open this Segmentation?'."""
    from selenium.webdriver.common.action_chains import ActionChains

    thumb = wait_for(
        d,
        lambda d: d.find_element("xpath", f"//*[starts-with(normalize-space(text()), '{name}')]"),
        60,
        f"the SEG '{name}...' in the study panel",
    )
    ActionChains(d).double_click(thumb).perform()
    wait_for(
        d,
        lambda d: d.find_element("xpath", "//button[@data-cy='yes-hydrate-btn']"),
        60,
        "OHIF's 'open this Segmentation?' prompt",
    ).click()
    wait_for(
        d,
        lambda d: d.execute_script("return window.services.segmentationService.getSegmentations().length > 0"),
        60,
        "the segmentation",
    )


def tint_in(d, mask: np.ndarray) -> tuple[np.ndarray, dict]:
    """Screenshot and the share of ``mask``'s pixels (eroded 3 px) drawn tinted."""
    from scipy.ndimage import binary_erosion

    shot, mapping = screenshot(d), image_to_page(d)
    return shot, {
        "mapping": mapping,
        "tint": tinted(sample_page(shot, mapping, binary_erosion(mask, iterations=3))).mean(),
    }


def keep_screenshot(shot: np.ndarray, name: str) -> None:
    out = os.environ.get("XFLOW_OHIF_SCREENSHOTS")
    if out:
        from PIL import Image

        os.makedirs(out, exist_ok=True)
        Image.fromarray(shot).save(os.path.join(out, name), optimize=True)


@needs_browser
@pytest.mark.parametrize("key", ["cr", "dx"])
def test_basic_viewer_shows_xflows_seg_inside_the_mask_and_nowhere_else(pacs, key):
    """OHIF 3.13's Basic Viewer opens the CR / DX and XFlow's stored SEG: the mask's pixels are
    tinted, the rest of the lungs are not (no geometry refusal, no SEG error in the console)."""
    from scipy.ndimage import binary_dilation, binary_erosion

    mask = xflow_mask(pacs, key)
    assert mask.sum() > 500, "the demo model found no effusion to show"
    lungs = pacs.phantoms[key].lungs["right lung"] | pacs.phantoms[key].lungs["left lung"]
    clear = binary_erosion(lungs & ~binary_dilation(mask, iterations=6), iterations=3)
    with chromium() as d:
        opened = open_study(d, f"{pacs.url}/viewer?StudyInstanceUIDs={pacs.study[key]}")
        _, before = tint_in(d, mask)
        t0 = time.perf_counter()
        open_xflow_seg(d)
        shot, after = wait_for(
            d, lambda d: (lambda s: s if s[1]["tint"] > 0.95 else None)(tint_in(d, mask)), 60, "XFlow's mask drawn"
        )
        seconds = time.perf_counter() - t0
        outside = tinted(sample_page(shot, after["mapping"], clear)).mean()
        logs = [e["message"] for e in console(d)]
        keep_screenshot(shot, f"ohif-3.13-viewer-{key}.png")
    print(
        f"\nOHIF {OHIF_VERSION} Basic Viewer, {key.upper()}: study open {opened:.1f} s, SEG shown {seconds:.1f} s "
        f"later; tinted in mask {after['tint']:.3f} (before {before['tint']:.3f}), elsewhere in the lungs "
        f"{outside:.3f}"
    )
    assert after["mapping"]["dims"][:2] == [512, 512]
    assert before["tint"] < 0.02 and outside < 0.02
    assert any("SEG parse complete" in m for m in logs)
    assert not [m for m in logs if "orthogonal" in m or "not yet supported" in m or "Failed to load" in m]


@needs_browser
def test_overlapping_findings_are_two_segments_each_shown_whole(pacs):
    """A SEG with two overlapping findings (as XFlow now writes them): OHIF 3.13 loads two
    segments and draws both whole, the overlap included."""
    masks = pacs.overlap
    common = masks["edema"] & masks["opacity"]
    assert common.sum() > 500
    with chromium() as d:
        open_study(d, f"{pacs.url}/viewer?StudyInstanceUIDs={pacs.study['other']}")
        open_xflow_seg(d, "Overlap check")
        shot, drawn = wait_for(
            d,
            lambda d: (lambda s: s if s[1]["tint"] > 0.95 else None)(tint_in(d, masks["edema"] | masks["opacity"])),
            60,
            "both findings drawn",
        )
        segments = d.execute_script(
            "const s = window.services.segmentationService.getSegmentations()[0];"
            "return Object.values(s.segments).map(g => g.label);"
        )
        parts = {
            k: tinted(sample_page(shot, drawn["mapping"], m)).mean()
            for k, m in {
                "overlap": common,
                "edema only": masks["edema"] & ~common,
                "opacity only": masks["opacity"] & ~common,
            }.items()
        }
        keep_screenshot(shot, "ohif-3.13-viewer-overlap.png")
    print(f"\nOHIF {OHIF_VERSION}, overlapping segments {segments}: tinted {parts}")
    assert sorted(segments) == ["edema", "opacity"]
    assert min(parts.values()) > 0.95


@pytest.fixture(scope="module")
def corrected(pacs):
    """The annotator's correction, done in OHIF's Segmentation mode on the CR: XFlow's SEG opened,
    a brush stroke painted with the mouse across the other lung, the segmentation stored to the
    PACS from its menu. Yields the stroke's image coordinates and the SEGs OHIF stored."""
    from selenium.webdriver.common.action_chains import ActionChains

    mask = xflow_mask(pacs, "cr")
    row, cols = 250, (330, 400)  # in the phantom's left lung (image right), clear of the effusion
    assert not mask[row - 40 : row + 40, cols[0] - 40 : cols[1] + 40].any()
    before = set(segs_in_pacs(pacs.orthanc))
    t0 = time.perf_counter()
    with chromium() as d:
        opened = open_study(d, f"{pacs.url}/segmentation?StudyInstanceUIDs={pacs.study['cr']}")
        open_xflow_seg(d)
        rows = wait_for(
            d, lambda d: [r.text for r in d.find_elements("xpath", "//*[@data-cy='data-row']")], 30, "the segment table"
        )
        d.find_element("xpath", "//button[@data-cy='Brush-btn']").click()
        wait_for(d, lambda d: "Radius (mm)" in d.find_element("tag name", "body").text, 30, "the brush's settings")
        m = image_to_page(d)
        canvas = d.execute_script("return window.cornerstone.getRenderingEngines()[0].getViewports()[0].getCanvas()")
        rect = d.execute_script("return arguments[0].getBoundingClientRect().toJSON()", canvas)

        def offset(i: float, j: float) -> tuple[int, int]:  # image (column, row) -> offset from the canvas centre
            x = m["origin"][0] + i * m["di"][0] + j * m["dj"][0]
            y = m["origin"][1] + i * m["di"][1] + j * m["dj"][1]
            return round(x - rect["left"] - rect["width"] / 2), round(y - rect["top"] - rect["height"] / 2)

        stroke = ActionChains(d).move_to_element_with_offset(canvas, *offset(cols[0], row)).click_and_hold()
        for i in np.linspace(cols[0], cols[1], 11)[1:]:
            stroke.move_to_element_with_offset(canvas, *offset(i, row))
        stroke.release().perform()
        painted = np.zeros((512, 512), bool)
        painted[row - 10 : row + 10, cols[0] : cols[1]] = True
        shot, drawn = wait_for(
            d,
            lambda d: (lambda s: s if s[1]["tint"] > 0.95 else None)(tint_in(d, painted)),
            30,
            "the brush stroke drawn",
        )
        keep_screenshot(shot, "ohif-3.13-segmentation-edit.png")
        edit_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        # the segmentation's menu (•••) -> Export -> DICOM SEG; OHIF asks for a name: Save
        d.find_element("xpath", "//button[@data-cy='segmentation-collapsed-more-btn-Labelmap']").click()
        wait_for(
            d, lambda d: d.find_element("xpath", "//*[normalize-space(text())='Export']"), 30, "the segmentation's menu"
        ).click()
        wait_for(
            d, lambda d: d.find_element("xpath", "//*[normalize-space(text())='DICOM SEG']"), 30, "Export's sub-menu"
        ).click()
        wait_for(
            d,
            lambda d: d.find_element("xpath", "//button[normalize-space()='Save']"),
            30,
            "OHIF's Store Segmentation dialog",
        ).click()
        stored = wait_for(
            d,
            lambda d: {k: v for k, v in segs_in_pacs(pacs.orthanc).items() if k not in before},
            120,
            "OHIF's SEG in the PACS",
        )
        logs = [e["message"] for e in console(d)]
    yield SimpleNamespace(
        stored=stored,
        row=row,
        cols=cols,
        rows=rows,
        opened=opened,
        edit_s=edit_s,
        store_s=time.perf_counter() - t1,
        logs=logs,
        xflow=mask,
    )


@needs_browser
def test_segmentation_mode_edit_is_stored_and_becomes_the_images_training_label(pacs, corrected):
    """Brush edit in Segmentation mode -> stored by OHIF (a Label Map SEG, RLE) -> the plugin's
    datastore takes it as the CR's label (not XFlow's unreviewed SEG), XFlow's mask and the
    annotator's stroke both in it -> ``datalist()``, which the train task trains on, holds it."""
    from monailabel_xflow.data.seg import LABELMAP_SOP_CLASS

    assert len(corrected.stored) == 1, list(corrected.stored)
    assert any("effusion" in r for r in corrected.rows), corrected.rows
    seg = next(iter(corrected.stored.values()))
    assert seg.SOPClassUID == LABELMAP_SOP_CLASS and seg.file_meta.TransferSyntaxUID == pydicom.uid.RLELossless
    assert seg.ReferencedSeriesSequence[0].SeriesInstanceUID == pacs.series["cr"]
    store = a_datastore(pacs, "cache-corrected")
    assert store.label_series()[pacs.series["cr"]] == str(seg.SeriesInstanceUID)
    assert pacs.series["cr"] not in store.get_unlabeled_images()  # out of the scoring pool
    pairs = {os.path.basename(p["image"]).removesuffix(".nii.gz"): p["label"] for p in store.datalist()}
    label = label_io.read_label(pairs[pacs.series["cr"]], (512, 512))
    effusion = label == 7
    rows, cols = np.mgrid[:512, :512]
    inner = (cols - np.clip(cols, *corrected.cols)) ** 2 + (rows - corrected.row) ** 2 <= 28**2
    outer = (cols - np.clip(cols, *corrected.cols)) ** 2 + (rows - corrected.row) ** 2 <= 36**2
    print(
        f"\nOHIF {OHIF_VERSION} Segmentation mode: study open {corrected.opened:.1f} s, SEG opened + stroke painted "
        f"{corrected.edit_s:.1f} s, stored {corrected.store_s:.1f} s; label: {int(effusion.sum())} px effusion "
        f"(XFlow {int(corrected.xflow.sum())} px + stroke)"
    )
    assert (effusion & corrected.xflow).sum() == corrected.xflow.sum()  # XFlow's mask kept
    assert (inner & ~effusion).sum() == 0  # the stroke is in the label ...
    assert not (effusion & ~corrected.xflow & ~outer).any()  # ... and nothing else was added
    assert set(np.unique(label)) == {0, 7}


def test_a_malformed_seg_is_skipped_with_its_reason_and_the_others_still_train(pacs, caplog):
    """A label SEG that cannot be read (here: a frame that names no segment, as the issue's OHIF
    SEG did for the old reader) is skipped with its reason: ``datalist()`` still answers, the
    image falls back to its older readable label, scoring lists the rest, and the ``xflow``
    train task trains on the labels it has."""
    from dicomweb_client import DICOMwebClient

    from monailabel_xflow.app.train import XFlowSegmenterTrainTask
    from monailabel_xflow.data.seg import write_seg
    from monailabel_xflow.workflow.runtime import XFlowRuntime

    truth = np.zeros((512, 512), np.uint8)
    truth[pacs.phantoms["dx"].lesions[0].mask] = 7
    older = write_seg(truth, pacs.tmp / "dx.dcm", algorithm="Slicer")
    older.ContentLabel, older.SeriesDate, older.SeriesTime = "SLICER", "20200101", "120000"
    broken = write_seg(truth, pacs.tmp / "dx.dcm", algorithm="Tool")
    broken.ContentLabel = "MANUAL"
    del broken.PerFrameFunctionalGroupsSequence[0].SegmentIdentificationSequence
    DICOMwebClient(url=f"{pacs.orthanc}/dicom-web").store_instances([older, broken])

    store = a_datastore(pacs, "cache-malformed")
    assert store.label_series()[pacs.series["dx"]] == str(broken.SeriesInstanceUID)  # the newest, at first
    with caplog.at_level(logging.WARNING, logger="monailabel_xflow.data.pacs"):
        pairs = {os.path.basename(p["image"]).removesuffix(".nii.gz"): p["label"] for p in store.datalist()}
    reason = store.unreadable_labels[str(broken.SeriesInstanceUID)]
    assert "Segment Identification" in reason
    assert any(
        str(broken.SeriesInstanceUID) in r.getMessage() and "Segment Identification" in r.getMessage()
        for r in caplog.records
    )
    assert pacs.series["dx"] in pairs and pacs.series["other"] in pairs  # the older label; the other image
    assert store.label_series()[pacs.series["dx"]] == str(older.SeriesInstanceUID)
    assert isinstance(store.get_unlabeled_images(), list)

    runtime = XFlowRuntime({}, preload=False)  # the demo model, as the server's default
    t0 = time.perf_counter()
    stats = XFlowSegmenterTrainTask(runtime, pacs.tmp / "model")({"steps": 2, "batch": 1}, store)
    seconds = time.perf_counter() - t0
    print(
        f"\ntrain task with a malformed SEG in the PACS: {stats['images']} images trained, "
        f"{len(stats['heldout_images'])} held out, {seconds:.1f} s; skipped: {reason}"
    )
    trained = stats["images"] + len(stats["heldout_images"])
    assert trained == len(pairs) >= 2 and stats["steps"] == 2
    assert json.loads((pacs.tmp / "model" / "train_stats.json").read_text())["steps"] == 2
