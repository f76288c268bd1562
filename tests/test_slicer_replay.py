"""3D Slicer's MONAI Label module, replayed against a real server, action by action.

Every request below is the one the module builds, and every result is read the way the module
reads it. References are to the MONAILabel repository (Project-MONAI/MONAILabel, head of
2025-12-23, 058ddfc; the same code in 0.8.5 for everything used here):
``plugins/slicer/MONAILabel/MONAILabel.py`` (``M:<line>``) and ``MONAILabelLib/client.py``,
which MONAI Label's own Python client ``monailabel.client.MONAILabelClient`` mirrors request
for request (same selectors, multipart ``params`` field, JSON bodies); the server is sent them
through that client. Slicer's C++ side is from Slicer/Slicer (head):
``vtkSlicerSegmentationsModuleLogic.cxx`` (``S:<line>``).

What the module does with answers, reduced to what a segment holds (:class:`SlicerScene`):

* a label file is read with ``sitk.ReadImage`` (M:1890) and resampled into the volume's
  geometry by physical position (``ImportLabelmapToSegmentationNode``);
* auto-segmentation (``onClickSegmentation`` M:1624-1651, ``updateSegmentationMask`` fast path
  M:1893-1918): names = ``label_names`` sorted by value (M:1645-1650), ``background`` dropped
  (M:1886); the v-th name's segment is **cleared** and gets value v of the file (S:1800-1812);
  segments not named are left alone;
* clicks (``onClickDeepgrow`` M:1669-1791, 2D model: ``sliceIndex = 0``, slow path M:1919-1980):
  every value present in the file becomes a new segment in ascending order, the i-th mapped to
  the i-th of ``labels = [selected segment]`` (M:1764, M:1943), which then holds exactly that
  mask on the slice.

The image is loaded as Slicer loads a PNG (ITK: index ``(i, j, k)`` = (column, row, slice),
physical geometry identity), so a click on column c, row r is sent as ``[c, r, 0]``
(``getControlPointXYZ`` M:963-978, RAS -> IJK rounded).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import requests
import SimpleITK as sitk
from servers import monailabel_server

from monailabel_xflow.app.slicer import STOPPED_LINE
from monailabel_xflow.transforms import labels as label_io
from monailabel_xflow.vocabulary import FINDINGS

pytestmark = pytest.mark.timeout(1500)

SAMPLE_DATA = Path(__file__).resolve().parents[1] / "sample-data"
STUDIES = ["phantom_1_00005", "phantom_1_00006", "phantom_1_00007"]
WIDE = "phantom_1_00006"  # cropped to 512 x 400 below: rows and columns differ


# --- the module's request building --------------------------------------------------------------


def module_params(info: dict, section: str, name: str) -> dict:
    """``getParamsFromConfig`` (M:907-915): the task's options, each list's first entry."""
    mapping = {"infer": "models", "train": "trainers", "activelearning": "strategies", "scoring": "scoring"}
    config = info.get(mapping[section], {}).get(name, {}).get("config", {})
    return {k: v[0] if isinstance(v, list) else v for k, v in config.items()}


def pick(info: dict, model: str, key: str, value) -> None:
    """What ``invalidateConfigTable`` (M:804-838) does when the user changes an option in the
    options table: a list option's chosen entry moves to the front, text is stored as typed."""
    config = info["models"][model]["config"]
    if isinstance(config[key], list):
        config[key].remove(value)
        config[key].insert(0, value)
    else:
        config[key] = value


def module_infer(client, model: str, image_id: str, params: dict):
    """``MONAILabelLogic.infer`` (M:2468-2481): asks NRRD / uint8, then ``client.infer``."""
    params = dict(params)
    params["result_extension"] = ".nrrd"
    params["result_dtype"] = "uint8"
    return client.infer(model, image_id, params)


def ordered_label_names(params: dict, model_labels) -> list[str]:
    """M:1645-1650: ``label_names`` (else the model's labels) sorted by value."""
    labels = params.get("label_names") if params and params.get("label_names") else model_labels
    if labels and isinstance(labels, dict):
        labels = [k for k, _ in sorted(labels.items(), key=lambda item: item[1])]
    return list(labels)


# --- the module's scene, reduced to segment masks -----------------------------------------------


class SlicerScene:
    """The module's segmentation node as masks on the volume's (row, column) grid.

    Args:
        volume_file: the image as Slicer loads it (read with SimpleITK/ITK, as Slicer does).
        names: the segments ``initSample`` creates empty, one per ``info["labels"]`` (M:1385).
    """

    def __init__(self, volume_file: Path, names):
        image = sitk.ReadImage(str(volume_file))
        self.volume = sitk.JoinSeries(image) if image.GetDimension() == 2 else image  # (W, H, 1)
        w, h = self.volume.GetSize()[:2]
        self.shape = (h, w)
        self.segments = {n: np.zeros(self.shape, bool) for n in names}
        self.touched: list[str] = []

    def labelmap(self, nrrd_file: str) -> np.ndarray:
        """The label file in the volume's grid (by physical position, as Slicer imports it)."""
        label = sitk.ReadImage(nrrd_file)
        assert label.GetDimension() == 3 and label.GetSize()[2] == 1, label.GetSize()
        resampled = sitk.Resample(label, self.volume, sitk.Transform(), sitk.sitkNearestNeighbor, 0)
        # the label must lie on the image, not beside it: same grid, not just same size
        assert (
            np.allclose(label.GetOrigin(), self.volume.GetOrigin())
            and np.allclose(label.GetSpacing(), self.volume.GetSpacing())
            and np.allclose(label.GetDirection(), self.volume.GetDirection())
        ), (label.GetOrigin(), label.GetSpacing(), label.GetDirection())
        return sitk.GetArrayFromImage(resampled)[0]

    def import_auto(self, nrrd_file: str, labels) -> None:
        """Fast path (M:1886-1918, S:1795-1812): the v-th name gets value v, cleared first."""
        arr = self.labelmap(nrrd_file)
        names = [n for n in labels if n != "background"]
        self.touched = names
        for index, name in enumerate(names):
            self.segments[name] = arr == index + 1  # a missing segment is created (S:1801-1808)

    def import_click(self, nrrd_file: str, labels, slice_index: int = 0) -> None:
        """Slow path (M:1919-1980): one new segment per value present, ascending; the i-th is
        written into ``labels[i]``'s existing segment (slice cleared, then added)."""
        assert slice_index == 0
        arr = self.labelmap(nrrd_file)
        values = [int(v) for v in np.unique(arr) if v]
        self.touched = []
        for i, value in enumerate(values):
            name = labels[i] if i < len(labels) else f"unknown {i}"
            if name in self.segments:
                self.segments[name] = arr == value
                self.touched.append(name)


def click_index(row: int, col: int) -> list[int]:
    """The ``[i, j, k]`` Slicer sends for a click on pixel (row, col) of a 2D image (M:963-978)."""
    return [col, row, 0]


def archetype_series(path: Path) -> list[str]:
    """The files ``itk::ArchetypeSeriesFileNames`` would stack with ``path`` when Slicer loads it
    without "single file": those in its folder whose name differs from it in one group of
    digits only (the largest such group; ``[path]`` when there is none)."""
    name = path.name
    best = [name]
    for m in re.finditer(r"[0-9]+", name):
        pattern = re.escape(name[: m.start()]) + "[0-9]+" + re.escape(name[m.end() :])
        found = sorted(f.name for f in path.parent.iterdir() if re.fullmatch(pattern, f.name))
        if len(found) > len(best):
            best = found
    return best


# --- the server ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slicer(tmp_path_factory, tiny_models):
    from PIL import Image

    tmp = tmp_path_factory.mktemp("slicer")
    models = tiny_models(tmp / "models")
    studies = tmp / "studies"
    studies.mkdir()
    for name in STUDIES:
        shutil.copy(SAMPLE_DATA / f"{name}.png", studies)
    Image.open(SAMPLE_DATA / f"{WIDE}.png").crop((0, 0, 512, 400)).save(studies / f"{WIDE}.png")
    with monailabel_server(studies, tmp / "server", conf={"models": str(models)}) as server:
        client = server.client(tmp)
        yield SimpleNamespace(
            server=server, url=server.url, studies=studies, models=models, tmp=tmp, client=client, info=client.info()
        )


def expected_revision(slicer, image_id: str, positives, negatives) -> np.ndarray:
    """F_seg's mask for clicks at (row, col) pixels, computed here from the same weights; the
    clicks are built from (row, col) directly, not from the client's index order."""
    from monailabel_xflow.geometry import Click, pixel_to_point
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.transforms.loading import load_cxr
    from monailabel_xflow.workflow.xflow import XFlow

    if not hasattr(slicer, "flow"):
        slicer.flow = XFlow(None, None, load_segmenter(str(slicer.models.parent / "sam3"), device="cpu"))
    image, _ = load_cxr(slicer.studies / f"{image_id}.png")
    clicks = [Click(True, *pixel_to_point(r, c, image.shape)) for r, c in positives] + [
        Click(False, *pixel_to_point(r, c, image.shape)) for r, c in negatives
    ]
    return np.asarray(slicer.flow.revise(image, clicks).mask, bool)


def filled_scene(slicer, image_id: str) -> SlicerScene:
    """A scene whose every segment already holds something (earlier answers or drawing)."""
    scene = SlicerScene(slicer.studies / f"{image_id}.png", slicer.info["labels"])
    for k, name in enumerate(scene.segments):
        scene.segments[name][10 + 20 * k : 25 + 20 * k, 30:60] = True
    return scene


# --- connect --------------------------------------------------------------------------------------


def test_connect_shows_xflow_under_auto_segmentation_and_both_click_lists(slicer):
    info = slicer.info  # fetchInfo -> logic.info() -> GET /info/ (M:1112-1119)
    assert info["labels"] == list(FINDINGS)  # initSample: one empty segment per label (M:1385)
    models = info["models"]
    assert models["xflow"]["type"] == "segmentation" and models["xflow"]["dimension"] == 2
    revise = models["xflow_revise"]
    assert revise["type"] == "deepedit" and revise["dimension"] == 2
    # M:698: multi-label deepedit (labels non-empty) hides the background list (M:700-704)
    deepedit_multi_label = revise["type"] == "deepedit" and len(revise["labels"]) > 0
    assert not deepedit_multi_label
    # next sample's auto-run (M:1391-1396) picks the first model holding the first label: xflow
    first = next(name for label in info["labels"] for name, m in models.items() if label in m.get("labels", []))
    assert first == "xflow"
    assert "xflow" in info["trainers"] and "xflow_uncertainty" in info["strategies"]


# --- next sample and its auto-run ---------------------------------------------------------------


def test_next_sample_opens_one_image_and_auto_runs_stage_1(slicer):
    c, info = slicer.client, slicer.info
    # before: the datastore's own file sits among numbered siblings Slicer would stack
    assert len(archetype_series(slicer.studies / f"{WIDE}.png")) == len(STUDIES)
    cache = slicer.tmp / "slicer-cache"  # Slicer's download cache (SampleData, M:1321-1324)
    cache.mkdir()
    seen = {}
    for _ in range(12):  # random unlabeled images (nothing scored yet): collect two or more
        sample = c.next_sample("xflow_uncertainty", module_params(info, "activelearning", "xflow_uncertainty"))
        seen[sample["id"]] = sample
        if len(seen) >= 2:
            break
    assert len(seen) >= 2
    for image_id, sample in seen.items():
        # M:1307-1316 opens `path` with loadVolume when it exists on the client; the server hands
        # out no path of its own (README "Security"), so the module downloads the image
        # (M:1321-1324: /datastore/image?image=<id>) into its cache under `name`
        assert sample["path"] == sample["name"] and not os.path.isabs(sample["path"])
        assert not Path(sample["path"]).exists()
        assert sample["name"].startswith(image_id) and sample["name"].endswith(".png")
        got = requests.get(f"{slicer.url}/datastore/image", params={"image": image_id}, timeout=60)
        assert got.status_code == 200
        (cache / sample["name"]).write_bytes(got.content)
        assert (
            sitk.GetArrayFromImage(sitk.ReadImage(str(cache / sample["name"]))).shape
            == sitk.GetArrayFromImage(sitk.ReadImage(str(slicer.studies / f"{image_id}.png"))).shape
        )
    for f in cache.iterdir():
        assert archetype_series(f) == [f.name]  # every download opens alone, too

    # auto-run (M:1388-1397 -> onClickSegmentation M:1641): xflow with its options' first entries
    image_id = next(iter(seen))
    params = module_params(info, "infer", "xflow")
    assert params["revise"] == "false" and params["label_values"] == "answer" and params["finding"] == ""
    scene = SlicerScene(cache / seen[image_id]["name"], info["labels"])
    label_file, result = module_infer(c, "xflow", image_id, params)
    assert all(t["settings"]["revise"] is False for t in result["traces"])  # Stage 1 only
    labels = ordered_label_names(result, info["models"]["xflow"]["labels"])
    assert labels == list(FINDINGS)  # screening: every finding asked, every segment set
    scene.import_auto(label_file, labels)
    assert scene.touched == list(FINDINGS)
    assert len(result["findings"]) == len(FINDINGS) and result["answer"]


# --- auto-segmentation: picker, typed instruction -----------------------------------------------


def test_auto_segmentation_changes_only_the_findings_asked(slicer):
    c = slicer.client
    info = json.loads(json.dumps(slicer.info))  # the module's copy, edited by the options table
    scene = filled_scene(slicer, WIDE)
    before = {k: v.copy() for k, v in scene.segments.items()}

    pick(info, "xflow", "finding", "effusion")  # the finding picker
    params = module_params(info, "infer", "xflow")
    assert params["finding"] == "effusion" and params["instruction"] == ""
    label_file, result = module_infer(c, "xflow", WIDE, params)
    labels = ordered_label_names(result, info["models"]["xflow"]["labels"])
    assert result["label_names"] == {"effusion": 1} and labels == ["effusion"]
    scene.import_auto(label_file, labels)
    assert scene.touched == ["effusion"]
    record = result["findings"][0]
    assert record["finding"] == "effusion" and record["label_value"] == 1
    assert scene.segments["effusion"].sum() == record["pixels"]  # the answer's mask, nothing else
    for name in FINDINGS[:-1]:
        np.testing.assert_array_equal(scene.segments[name], before[name])  # the others survive
    # the sentence: printed on Slicer's Python console (M:1644) and in the NRRD header
    from monailabel_xflow.transforms.labels import answer_of_file

    assert "effusion" in result["answer"] and answer_of_file(label_file) == result["answer"]

    # a typed instruction naming two findings: exactly those two segments change
    pick(info, "xflow", "finding", "")
    pick(info, "xflow", "instruction", "Is there edema or effusion in the left lung?")
    label_file, result = module_infer(c, "xflow", WIDE, module_params(info, "infer", "xflow"))
    labels = ordered_label_names(result, None)
    assert labels == ["edema", "effusion"] and result["label_names"] == {"edema": 1, "effusion": 2}
    before = {k: v.copy() for k, v in scene.segments.items()}
    scene.import_auto(label_file, labels)
    assert scene.touched == ["edema", "effusion"]
    for record in result["findings"]:
        assert scene.segments[record["finding"]].sum() == record["pixels"]
    for name in set(FINDINGS) - {"edema", "effusion"}:
        np.testing.assert_array_equal(scene.segments[name], before[name])


# --- clicks -------------------------------------------------------------------------------------


def deepgrow_params(info: dict, segment: str, foreground, background) -> dict:
    """``onClickDeepgrow`` for a 2D model that is not multi-label deepedit (M:1744-1771)."""
    params = {"label": segment, "foreground": foreground, "background": background}
    params["label"] = segment
    params.update(module_params(info, "infer", "xflow_revise"))
    params["slice"] = 0  # sliceIndex = current_point[2] (M:1745), sent for 2D models (M:1770-1771)
    return params


def test_clicks_revise_the_selected_segment_where_the_user_clicked(slicer):
    c, info = slicer.client, slicer.info
    scene = filled_scene(slicer, WIDE)
    before = {k: v.copy() for k, v in scene.segments.items()}
    fg, bg = (120, 450), (140, 470)  # (row, col): a column past the 400 rows, refused if swapped

    # a positive click on the effusion segment
    label_file, result = module_infer(
        c, "xflow_revise", WIDE, deepgrow_params(info, "effusion", [click_index(*fg)], [])
    )
    assert result["finding"] == "effusion" and result["clicks"][0]["positive"]
    scene.import_click(label_file, ["effusion"])  # labels = [label] (M:1764)
    np.testing.assert_array_equal(scene.segments["effusion"], expected_revision(slicer, WIDE, [fg], []))
    assert scene.touched in (["effusion"], [])
    for name in FINDINGS[:-1]:
        np.testing.assert_array_equal(scene.segments[name], before[name])

    # then a negative click on it: both lists of this segment go (M:1755-1763)
    label_file, result = module_infer(
        c, "xflow_revise", WIDE, deepgrow_params(info, "effusion", [click_index(*fg)], [click_index(*bg)])
    )
    assert [k["positive"] for k in result["clicks"]] == [True, False]
    scene.import_click(label_file, ["effusion"])
    effusion = expected_revision(slicer, WIDE, [fg], [bg])
    np.testing.assert_array_equal(scene.segments["effusion"], effusion)

    # another segment: its own point lists (onSelectLabel M:1020-1026) and label; effusion stays
    label_file, result = module_infer(
        c, "xflow_revise", WIDE, deepgrow_params(info, "edema", [click_index(300, 100)], [click_index(50, 50)])
    )
    assert result["finding"] == "edema" and result["label_names"] == {"edema": FINDINGS.index("edema") + 1}
    scene.import_click(label_file, ["edema"])
    np.testing.assert_array_equal(scene.segments["edema"], expected_revision(slicer, WIDE, [(300, 100)], [(50, 50)]))
    np.testing.assert_array_equal(scene.segments["effusion"], effusion)

    # the multi-label deepedit request (one list per segment + label, M:1726-1743): points stored
    # for other segments are ignored, never a 422
    params = {name: [] for name in info["labels"]}
    params.update({"effusion": [click_index(*fg)], "edema": [click_index(300, 100)], "label": "edema"})
    params.update(module_params(info, "infer", "xflow_revise"))
    label_file, result = module_infer(c, "xflow_revise", WIDE, params)
    assert result["finding"] == "edema" and [k["positive"] for k in result["clicks"]] == [True]


def test_click_label_is_a_segment_name_only(slicer):
    """``label`` in params may name a finding's segment, nothing else (422 naming it); the
    server keeps serving."""
    from monailabel.client import MONAILabelClient

    canary = slicer.tmp / "canary.png"
    shutil.copy(slicer.studies / f"{WIDE}.png", canary)
    client = MONAILabelClient(slicer.url, tmpdir=str(slicer.tmp))
    for bad in (
        str(canary),
        "../effusion",
        "effusion.png",
        "Effusion",
        "background",
        "/etc/passwd",
        7,
        ["effusion"],
        {"name": "effusion"},
        "effusion\x00.png",
        " effusion",
    ):
        params = deepgrow_params(slicer.info, "effusion", [click_index(120, 330)], [])
        params["label"] = bad
        r = requests.post(
            f"{slicer.url}/infer/xflow_revise", params={"image": WIDE}, data={"params": json.dumps(params)}, timeout=120
        )
        assert r.status_code == 422, (bad, r.status_code, r.text[:200])
        assert "label" in r.json()["detail"], r.text
    # a segment name that is not the finding the options ask for: 422 saying so
    params = deepgrow_params(slicer.info, "effusion", [click_index(120, 330)], [])
    params["instruction"] = "segment the edema"
    r = requests.post(
        f"{slicer.url}/infer/xflow_revise", params={"image": WIDE}, data={"params": json.dumps(params)}, timeout=120
    )
    assert r.status_code == 422 and "effusion" in r.json()["detail"] and "edema" in r.json()["detail"]
    _, result = client.infer(
        "xflow_revise", WIDE, deepgrow_params(slicer.info, "effusion", [click_index(120, 330)], [])
    )
    assert result["finding"] == "effusion"  # still serving


# --- upload, save, train ------------------------------------------------------------------------


def test_upload_then_segment_the_uploaded_image(slicer):
    """``onUploadImage`` (M:1418-1458): the volume saved with the module's default file extension
    ``.nii.gz`` (M:258, settings M:86-91) by ITK, uploaded under the volume node's name, then
    asked like any image."""
    c = slicer.client
    volume = sitk.JoinSeries(sitk.ReadImage(str(slicer.studies / f"{WIDE}.png")))
    in_file = slicer.tmp / "upload.nii.gz"
    sitk.WriteImage(volume, str(in_file))
    c.upload_image(str(in_file), "my_radiograph")
    assert "my_radiograph" in requests.get(f"{slicer.url}/datastore/?output=all", timeout=30).json()["objects"]
    scene = SlicerScene(in_file, slicer.info["labels"])
    params = module_params(slicer.info, "infer", "xflow")
    params["instruction"] = "Segment the cardiomegaly."
    label_file, result = module_infer(c, "xflow", "my_radiograph", params)
    scene.import_auto(label_file, ordered_label_names(result, None))  # asserts the grid matches
    assert scene.touched == ["cardiomegaly"]


def save_scene(slicer, image_id: str, scene: SlicerScene) -> dict:
    """``onSaveLabel`` (M:1522-1581): segments exported to one labelmap (value = position among
    the saved segments), written with the module's default extension ``.nii.gz`` in the
    volume's geometry, sent with ``label_info``."""
    names = [n for n in scene.segments if n not in ("background", "foreground_scribbles", "background_scribbles")]
    label_info = [{"name": n, "idx": i + 1} for i, n in enumerate(names)]
    arr = np.zeros(scene.shape, np.uint8)
    for i, n in enumerate(names):
        arr[scene.segments[n]] = i + 1
    image = sitk.GetImageFromArray(arr[None])
    image.CopyInformation(scene.volume)
    label_in = slicer.tmp / f"save_{image_id}.nii.gz"
    sitk.WriteImage(image, str(label_in))
    return slicer.client.save_label(image_id, str(label_in), params={"label_info": label_info, "model": "xflow"})


def test_save_label_then_train_reports_progress_and_outcome(slicer):

    c, info = slicer.client, slicer.info
    done_before = c.info()["datastore"]["completed"]
    for image_id, box in ((STUDIES[0], (100, 300, 150, 400)), (WIDE, (200, 330, 250, 450))):
        scene = SlicerScene(slicer.studies / f"{image_id}.png", info["labels"])
        r0, r1, c0, c1 = box
        scene.segments["effusion"][r0:r1, c0:c1] = True
        scene.segments["edema"][20:60, 20:80] = True
        saved = save_scene(slicer, image_id, scene)
        assert saved["image"] == image_id
        stored = requests.get(f"{slicer.url}/datastore/label", params={"label": image_id, "tag": "final"}, timeout=30)
        assert stored.status_code == 200
        suffix = ".nii.gz" if stored.content[:2] == b"\x1f\x8b" else ".png"
        path = slicer.tmp / f"stored_{image_id}{suffix}"
        path.write_bytes(stored.content)
        back = label_io.read_label(str(path), scene.shape)
        np.testing.assert_array_equal(back == FINDINGS.index("effusion") + 1, scene.segments["effusion"])
        np.testing.assert_array_equal(back == FINDINGS.index("edema") + 1, scene.segments["edema"])
    assert c.info()["datastore"]["completed"] == done_before + 2

    # onTraining (M:1179-1199): the trainer's options as they are; monitorTraining (M:502-533)
    params = module_params(info, "train", "xflow")
    assert params == {"steps": 10, "lr": 1e-4, "batch": 1, "seed": 0, "interactive_rounds": 6}
    started = c.train_start("xflow", params)
    assert started["status"] in ("SUBMITTED", "RUNNING")
    bars = []
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        status = c.train_status(False)
        if status.get("status") not in ("SUBMITTED", "RUNNING"):
            break
        stats = next(iter((c.info().get("train_stats") or {"": {}}).values()))
        if stats and not stats.get("total_time"):  # with total_time (the run's last moments) M:512 shows 1 %
            bars.append(max(1, 100 * stats.get("epoch", 1) / stats.get("total_epochs", 1)))  # M:512-514
        time.sleep(1)
    assert status["status"] == "DONE", "\n".join(status.get("details", [])[-25:])
    assert bars == sorted(bars) and all(1 <= b <= 100 for b in bars)
    stats = next(iter(c.info()["train_stats"].values()))  # updateGUIFromParameterNode (M:631-635)
    assert stats["epoch"] == stats["total_epochs"] == 10 and stats["total_time"]
    assert 0.0 <= stats["best_metric"] <= 1.0  # Slicer's accuracy bar (M:887-905)
    serving = stats["heldout_iou_candidate"] if stats["promoted"] else stats["heldout_iou_current"]
    assert stats["best_metric"] == pytest.approx(serving)
    assert stats["reason"].startswith("promoted" if stats["promoted"] else "kept aside")

    # onStopTraining (M:1221-1250) once the run is going; the module shows result or details[-1]
    c.train_start("xflow", {**params, "steps": 500})  # long enough to be stopped mid-run
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # until the run has published a step
        running = next(iter((c.info().get("train_stats") or {"": {}}).values()))
        if running and not running.get("total_time"):
            break
        time.sleep(0.5)
    stopped = c.train_stop()
    assert stopped["status"] == "STOPPED", stopped
    shown = stopped.get("result", stopped.get("details", [])[-1])  # M:1247, evaluated as the module does
    assert isinstance(shown, str)
    assert not c.train_status(True)
    after = next(iter(c.info()["train_stats"].values()))
    assert after["best_metric"] == pytest.approx(stats["best_metric"])  # the serving segmenter's, kept
    # ended, not left at its last step for good (the killed subprocess cannot say so itself)
    assert after["total_time"] and after["promoted"] is False and after["reason"] == STOPPED_LINE, after


def test_progress_is_published_as_monai_label_trainers_do(tmp_path):
    """TrainProgress writes what monitorTraining reads: the bar at step/total while running
    (no ``total_time``), the best metric kept from the previous run until measured."""
    from monailabel_xflow.training.promotion import TrainProgress

    path = tmp_path / "train_stats.json"
    path.write_text(json.dumps({"best_metric": 0.42}))
    progress = TrainProgress(path, 10)
    progress.step(3, 10, 0.5)
    stats = json.loads(path.read_text())
    current = 0 if stats.get("total_time") else stats.get("epoch", 1)
    assert 100 * current / stats["total_epochs"] == 30 and stats["best_metric"] == 0.42
    out = progress.done(
        {
            "steps": 10,
            "promoted": False,
            "reason": "kept aside: x",
            "heldout_iou_current": 0.5,
            "heldout_iou_candidate": 0.4,
        }
    )
    assert json.loads(path.read_text()) == out
    assert out["epoch"] == out["total_epochs"] == 10 and out["total_time"] and out["best_metric"] == 0.5
    assert not list(tmp_path.glob("*.tmp"))
    assert os.path.getsize(path) > 0


def test_answer_numbering_and_its_way_back_to_fixed_values():
    """``label_values``: Slicer's pick numbers an answer 1..N in FINDINGS order; the option list
    sent back (OHIF) or nothing (API) keeps the fixed values; stored SEGs get fixed values back."""
    from monailabel_xflow.app.errors import RequestError
    from monailabel_xflow.task_options import LABEL_VALUE_CHOICES, label_names_for
    from monailabel_xflow.transforms.labels import to_fixed_values
    from monailabel_xflow.vocabulary import label_value

    asked = ["effusion", "edema", "effusion"]
    answer = label_names_for(asked, {"label_values": "answer"})
    assert answer == {"edema": 1, "effusion": 2}
    fixed = {"edema": label_value("edema"), "effusion": label_value("effusion")}
    assert label_names_for(asked, {}) == label_names_for(asked, {"label_values": list(LABEL_VALUE_CHOICES)}) == fixed
    with pytest.raises(RequestError, match="label_values"):
        label_names_for(asked, {"label_values": "/etc/passwd"})
    label = np.array([[0, 1, 2], [2, 1, 0]], np.uint8)
    back = to_fixed_values(label, answer)
    np.testing.assert_array_equal(
        back, np.where(label == 1, fixed["edema"], np.where(label == 2, fixed["effusion"], 0))
    )
    np.testing.assert_array_equal(to_fixed_values(back, fixed), back)


def test_a_run_that_ended_without_an_outcome_is_closed_not_left_at_its_last_step(tmp_path):
    from monailabel_xflow.training.promotion import TrainProgress, close_progress

    path = tmp_path / "train_stats.json"
    assert close_progress(path, "stopped") is False  # no record: nothing to close
    progress = TrainProgress(path, 500)
    progress.step(85, 500, 1.1)
    assert close_progress(path, "failed: out of memory") is True
    closed = json.loads(path.read_text())
    assert closed["epoch"] == 85 and closed["total_time"] and closed["promoted"] is False
    assert closed["reason"] == "failed: out of memory"
    assert close_progress(path, "stopped") is False  # a finished record is left as it is
    assert json.loads(path.read_text()) == closed
