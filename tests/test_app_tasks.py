"""The MONAI Label tasks of the XFlow app, in-process, with scripted policies and segmenter.

Every mask is predictable, so these tests check label values, geometry (an asymmetric image
read back with MONAI's own readers), answers, click conversion, the uncertainty formula, the
strategy, the error mapping, SEG writing and the serve command. The real server is exercised
in ``test_app_server.py`` and ``test_orthanc.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow import rle
from monailabel_xflow.app.errors import LabelError, RequestError, http_errors, status_of
from monailabel_xflow.geometry import Click, box_from_text, box_to_text, mask_to_box, pixel_to_point
from monailabel_xflow.instructions import Instruction, InstructionError
from monailabel_xflow.policy.protocol import BoxRef, Stage1Output, Stage2Action, format_stage1, format_stage2
from monailabel_xflow.testing import ScriptedPolicy, ScriptedSegmenter, StubRuntime, ellipse
from monailabel_xflow.transforms import labels as label_io
from monailabel_xflow.vocabulary import FINDINGS
from monailabel_xflow.workflow.xflow import XFlow

H, W = 256, 320  # asymmetric: a transpose anywhere moves masks off target
LUNGS = [BoxRef("right lung", (0.10, 0.15, 0.45, 0.85)), BoxRef("left lung", (0.55, 0.15, 0.90, 0.85))]
EFFUSION_GT = ellipse((H, W), 190, 230, 18, 30)  # image right = patient's left, low
EDEMA_GT = ellipse((H, W), 60, 70, 12, 20)  # image left, high
BOTH_GT = EFFUSION_GT | EDEMA_GT


def box_of(mask):
    return box_from_text(box_to_text(mask_to_box(mask)))


def stage1(present: bool, boxes=(), label="effusion") -> str:
    return format_stage1(Stage1Output(LUNGS, present, [BoxRef(label, b) for b in boxes]))


@pytest.fixture()
def png(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "cxr.png"
    Image.fromarray((rng.uniform(0, 255, (H, W))).astype(np.uint8), mode="L").save(path)
    return path


def read_monai(path) -> np.ndarray:
    """A label as MONAI Label's clients get it: MONAI LoadImage, (W, H[, 1])."""
    from monai.transforms import LoadImage

    return np.asarray(LoadImage(image_only=True)(str(path)))


# --- infer ----------------------------------------------------------------------------------


def infer_task(texts, segmenter=None):
    from monailabel_xflow.app.infer import XFlowInferTask

    policy = ScriptedPolicy(texts)
    return XFlowInferTask(StubRuntime(XFlow(policy, None, segmenter or ScriptedSegmenter(BOTH_GT))))


def test_infer_paints_label_values_in_the_image_geometry(png):
    task = infer_task([stage1(True, [box_of(EFFUSION_GT)]), stage1(True, [box_of(EDEMA_GT)], "edema")])
    label_file, params = task({"image": str(png), "finding": ["effusion", "edema"], "overlay": True})
    label = read_monai(label_file)
    assert label.shape == (W, H)  # MONAI's PIL reader: (W, H) like the image
    # pixel (row 190, col 230) is effusion (7); (row 60, col 70) edema (6): index [col, row]
    assert label[230, 190] == 7 and label[70, 60] == 6 and label[5, 5] == 0
    assert set(np.unique(label)) == {0, 6, 7}
    assert (label == 7).sum() == np.count_nonzero(EFFUSION_GT) and (label == 6).sum() == np.count_nonzero(EDEMA_GT)
    assert [f["finding"] for f in params["findings"]] == ["effusion", "edema"]
    assert all(f["present"] and not f["empty"] for f in params["findings"])
    assert params["label_names"]["effusion"] == 7 and params["empty"] is False
    assert len(params["traces"]) == 2 and params["traces"][0]["schema"].startswith("xflow-trace")
    overlay = Image.open(__import__("io").BytesIO(__import__("base64").b64decode(params["overlay_png_base64"])))
    assert overlay.size == (W, H) and overlay.mode == "RGB"
    rgb = np.asarray(overlay).astype(int)
    assert rgb[5, 5, 0] == rgb[5, 5, 1] == rgb[5, 5, 2]  # background stays grey
    effusion, edema = rgb[190, 230], rgb[60, 70]  # tinted with their finding colours
    assert len(set(effusion)) > 1 and len(set(edema)) > 1 and tuple(effusion) != tuple(edema)


def test_infer_absent_finding_returns_empty_label_and_says_so(png):
    task = infer_task([stage1(False)])
    label_file, params = task({"image": str(png), "instruction": "is there fluid on the left?", "trace": False})
    assert not read_monai(label_file).any()
    assert params["answer"] == "There is no effusion in the left lung."
    assert params["empty"] is True and params["findings"][0]["empty"] and "traces" not in params


def test_infer_on_nifti_keeps_the_image_affine(tmp_path):
    import nibabel as nib

    from monailabel_xflow.transforms.loading import save_nifti_2d

    rng = np.random.default_rng(1)
    image = tmp_path / "cxr.nii.gz"
    save_nifti_2d(rng.uniform(0, 1, (H, W)).astype(np.float32), image, spacing=(0.2, 0.15))
    task = infer_task([stage1(True, [box_of(EFFUSION_GT)])])
    label_file, _ = task({"image": str(image), "instruction": "Segment the effusion in the left lung."})
    assert label_file.endswith(".nii.gz")
    lab, img = nib.load(label_file), nib.load(image)
    assert lab.shape == (W, H, 1) and np.allclose(lab.affine, img.affine)
    assert np.asarray(lab.dataobj)[230, 190, 0] == 7


def test_pickers_text_and_defaults():
    from monailabel_xflow.task_options import FINDING_CHOICES, LOCATION_CHOICES, instructions_from_request

    got = instructions_from_request({"instruction": "", "finding": "effusion", "location": "left lung base"})
    assert [i.text for i in got] == ["Segment the effusion in the left lung base."]
    # the option lists themselves (a client that never touched the pickers, e.g. OHIF's panel) mean
    # "not chosen", and nothing chosen means every finding (the screening use)
    everything = instructions_from_request(
        {"instruction": "", "finding": FINDING_CHOICES, "location": LOCATION_CHOICES}
    )
    assert [i.finding for i in everything] == list(FINDINGS) and all(i.level == "chest" for i in everything)
    assert [i.finding for i in instructions_from_request({})] == list(FINDINGS)
    assert len(instructions_from_request({"finding": "all findings"})) == 7
    assert instructions_from_request({"instruction": "edema", "finding": "effusion"})[0].finding == "edema"
    with pytest.raises(InstructionError):
        instructions_from_request({"instruction": "segment the pneumothorax"})
    with pytest.raises(InstructionError):
        instructions_from_request({"instruction": "x" * 5000})
    with pytest.raises(RequestError):
        instructions_from_request({"finding": 3})


@pytest.mark.parametrize("bad", [{"max_clicks": -1}, {"max_clicks": "many"}, {"max_clicks": 99}, {"revise": "maybe"}])
def test_bad_options_are_request_errors(png, bad):
    from fastapi import HTTPException

    task = infer_task([stage1(False)])
    with pytest.raises(HTTPException) as err:
        task({"image": str(png), "instruction": "effusion", **bad})
    assert err.value.status_code == 422 and next(iter(bad)) in err.value.detail


# --- revise ---------------------------------------------------------------------------------


def revise_task(segmenter):
    from monailabel_xflow.app.revise import XFlowReviseTask

    return XFlowReviseTask(StubRuntime(XFlow(ScriptedPolicy([]), None, segmenter)))


def test_revise_converts_client_clicks_and_keeps_other_findings(png, tmp_path):
    seg = ScriptedSegmenter(BOTH_GT, positive_radius_px=10, negative_radius_px=6)
    previous = np.zeros((H, W), np.uint8)
    previous[EFFUSION_GT] = 7
    previous[EDEMA_GT] = 6
    ref = label_io.load_image(str(png))[1]
    prev_file = label_io.write_label(previous, ref, str(tmp_path))
    # clicks as Slicer sends them: [i = column, j = row, k = 0]
    label_file, params = revise_task(seg)(
        {
            "image": str(png),
            "finding": "effusion",
            "label": prev_file,
            "foreground": [[300, 200, 0]],
            "background": [[230, 190, 0]],
        }
    )
    call = seg.calls[-1]
    pos, neg = call.clicks[0]
    assert (pos.positive, neg.positive) == (True, False)
    assert (pos.x, pos.y) == pytest.approx(pixel_to_point(200, 300, (H, W)))
    assert (neg.x, neg.y) == pytest.approx(pixel_to_point(190, 230, (H, W)))
    out = label_io.read_label(label_file, (H, W))  # (H, W)
    assert out[200, 300] == 7 and out[190, 230] == 0  # grown at the positive click, carved at the negative
    assert read_monai(label_file)[300, 200] == 7  # what Slicer reads: index [i = column, j = row]
    np.testing.assert_array_equal(out == 6, EDEMA_GT)  # the other finding is kept
    assert params["finding"] == "effusion" and params["label_value"] == 7 and params["pixels"] == (out == 7).sum()


@pytest.mark.parametrize(
    "clicks",
    [
        {"foreground": [[W, 10, 0]]},
        {"foreground": [[10, H, 0]]},
        {"background": [[5, 5, 1]]},
        {"foreground": [[1]]},
        {"foreground": "here"},
    ],
)
def test_revise_refuses_clicks_outside_the_image(png, clicks):
    from fastapi import HTTPException

    with pytest.raises(HTTPException) as err:
        revise_task(ScriptedSegmenter(BOTH_GT))({"image": str(png), "finding": "effusion", **clicks})
    assert err.value.status_code == 422


def test_revise_needs_a_finding_and_something_to_start_from(png):
    from fastapi import HTTPException

    task = revise_task(ScriptedSegmenter(BOTH_GT))
    with pytest.raises(HTTPException, match="which finding"):
        task({"image": str(png), "foreground": [[3, 3, 0]]})
    with pytest.raises(HTTPException, match="no clicks"):
        task({"image": str(png), "finding": "edema"})


# --- labels, errors -------------------------------------------------------------------------


def test_read_label_refuses_wrong_size_and_values(png, tmp_path):
    ref = label_io.load_image(str(png))[1]
    good = label_io.write_label(np.full((H, W), 3, np.uint8), ref, str(tmp_path))
    assert label_io.read_label(good, (H, W)).shape == (H, W)
    with pytest.raises(LabelError, match="320 x 256"):
        label_io.read_label(good, (W, H))
    bad = tmp_path / "bad.png"
    Image.fromarray(np.full((H, W), 200, np.uint8)).save(bad)
    with pytest.raises(LabelError, match="0..7"):
        label_io.read_label(bad, (H, W))
    junk = tmp_path / "junk.nii.gz"
    junk.write_bytes(b"not a nifti")
    with pytest.raises(LabelError, match="unreadable"):
        label_io.read_label(junk)


def test_error_mapping_is_one_table():
    from monailabel.interfaces.exception import ImageNotFoundException

    from monailabel_xflow.app.errors import ImageNotFoundError, ModelsNotConfiguredError
    from monailabel_xflow.geometry import GeometryError
    from monailabel_xflow.transforms.loading import CXRLoadError
    from monailabel_xflow.workflow.model_config import ModelConfigError

    cases = {
        InstructionError("x"): 422,
        GeometryError("x"): 422,
        CXRLoadError("f", "x"): 400,
        ModelConfigError("x"): 503,
        ModelsNotConfiguredError("x"): 503,
        ImageNotFoundError("x"): 404,
        ImageNotFoundException("x"): 404,
        LabelError("x"): 422,
        RequestError("x"): 422,
    }
    assert {type(e).__name__: status_of(e) for e in cases} == {type(e).__name__: s for e, s in cases.items()}
    assert status_of(KeyError("bug")) is None
    with pytest.raises(KeyError), http_errors():  # a bug stays a 500
        raise KeyError("bug")


# --- scoring, strategy ----------------------------------------------------------------------


def test_uncertainty_formula(png):
    from monailabel_xflow.eval.uncertainty import image_uncertainty

    image = label_io.load_image(str(png))[0]
    box = box_of(EFFUSION_GT)
    far = Click(True, *pixel_to_point(120, 300, (H, W)))
    policy = ScriptedPolicy(
        [stage1(True, [box]), stage1(False)], [[format_stage2(Stage2Action(far)), format_stage2(Stage2Action(None))]]
    )
    flow = XFlow(policy, policy, ScriptedSegmenter(EFFUSION_GT, positive_radius_px=15))
    present = flow.run(image, Instruction("effusion", kind="global"), max_clicks=2)
    absent = flow.run(image, Instruction("edema", kind="global"), max_clicks=2)
    score, parts = image_uncertainty([present, absent], max_clicks=2)
    p = parts["effusion"]
    assert set(parts) == {"effusion"}  # absent findings do not count
    m0 = rle.decode(present.trace.lesions[0].initial_mask)  # Stage 1 mask M_0
    expected_d = 1 - (m0 & present.mask).sum() / (m0 | present.mask).sum()
    assert p["disagreement"] == pytest.approx(expected_d) and p["disagreement"] > 0
    assert p["effort"] == pytest.approx(1 / 2)  # one click of a budget of two
    assert 0 <= p["doubt"] <= 1 and score == pytest.approx((p["disagreement"] + 0.5 + p["doubt"]) / 3)
    assert image_uncertainty([absent], 2)[0] == 0.0


class FakeDatastore:
    def __init__(self, unlabeled, infos):
        self.unlabeled, self.infos = unlabeled, infos

    def get_unlabeled_images(self, tag=None):
        return list(self.unlabeled)

    def get_image_info(self, image_id):
        return dict(self.infos.get(image_id, {}))


def test_strategy_picks_most_uncertain_unlabeled_else_random():
    from monailabel_xflow.app.strategy import XFlowUncertaintyStrategy

    strategy = XFlowUncertaintyStrategy(seed=0)
    ds = FakeDatastore(
        ["a", "b", "c"],
        {"a": {"xflow_uncertainty": 0.2}, "b": {"xflow_uncertainty": 0.7}, "z": {"xflow_uncertainty": 0.9}},
    )  # z is labeled: ignored
    assert strategy({}, ds) == {"id": "b", "xflow_uncertainty": 0.7, "fallback": False}
    picked = strategy({}, FakeDatastore(["a", "b"], {}))
    assert picked["id"] in {"a", "b"} and picked["fallback"] is True
    assert strategy({}, FakeDatastore([], {})) is None


# --- DICOM SEG ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["findings", "empty"])
def test_seg_round_trip_for_a_cr_without_image_position(cxr_samples, tmp_path, kind):
    import pydicom

    from monailabel_xflow.data.seg import read_seg, write_seg
    from monailabel_xflow.vocabulary import NO_FINDING

    source = cxr_samples / "dicom" / "cr.dcm"
    ds = pydicom.dcmread(source, stop_before_pixels=True)
    assert "ImagePositionPatient" not in ds  # the case upstream cannot write
    label = np.zeros((int(ds.Rows), int(ds.Columns)), np.uint8)
    if kind == "findings":
        label[100:180, 600:700] = 7
        label[300:320, 40:90] = 2
    write_seg(label, source, tmp_path / "seg.dcm")
    seg = pydicom.dcmread(tmp_path / "seg.dcm")
    assert seg.Modality == "SEG" and seg.ReferencedSeriesSequence[0].SeriesInstanceUID == ds.SeriesInstanceUID
    names = [s.SegmentLabel for s in seg.SegmentSequence]
    assert names == (["pneumonia", "effusion"] if kind == "findings" else [NO_FINDING])
    np.testing.assert_array_equal(read_seg(seg), label)


# --- serve command --------------------------------------------------------------------------


def test_serve_dry_run_prints_the_command(tmp_path, capsys):
    """The command only: the radiograph settings are the app's own (app/server_defaults.py), so
    upstream's ``monailabel start_server`` gets them too (tests/test_upstream_app.py)."""
    import shlex

    from monailabel_xflow.cli import main

    models = tmp_path / "models.yaml"
    models.write_text("segmenter: ./x\n")
    workspace = tmp_path / "ws"
    assert (
        main(
            [
                "serve",
                "--workspace",
                str(workspace),
                "--studies",
                str(tmp_path),
                "--port",
                "8123",
                "--models",
                str(models),
                "--conf",
                "model_dir",
                "/m",
                "--dry-run",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert len(out.strip().splitlines()) == 1 and "MONAI_LABEL_" not in out
    assert shlex.split(out)[1:6] == ["-m", "monailabel.main", "start_server", "--app", str(workspace.resolve())]
    assert "--port 8123" in out and "--host 127.0.0.1" in out
    assert f"--conf model_dir /m --conf models_file {models.resolve()}" in out
    assert "import XFlowApp" in (workspace / "main.py").read_text()  # the pointer MONAI Label loads
    assert main(["serve", "--app", str(tmp_path), "--studies", str(tmp_path), "--dry-run"]) == 2  # no main.py
    assert main(["serve", "--workspace", str(workspace), "--studies", str(tmp_path / "nope"), "--dry-run"]) == 2


def test_findings_order_matches_label_values():
    from monailabel_xflow.serving.answering import LABELS

    assert list(LABELS) == list(FINDINGS) and list(LABELS.values()) == list(range(1, 8))


def test_component_prompts_skip_specks_and_keep_the_largest():
    from monailabel_xflow.training.promotion import component_prompts

    label = np.zeros((H, W), np.uint8)
    label[EFFUSION_GT] = 7
    label[EDEMA_GT] = 6
    label[5, 5] = 7  # a one-pixel speck
    prompts = component_prompts(label)
    assert len(prompts) == 2
    boxes = [b for b, _ in prompts]
    assert boxes[0] == pytest.approx(mask_to_box(EFFUSION_GT)) and boxes[1] == pytest.approx(mask_to_box(EDEMA_GT))
    np.testing.assert_array_equal(prompts[0][1], EFFUSION_GT)
    assert component_prompts(np.zeros((H, W), np.uint8)) == []
    assert len(component_prompts(label, max_prompts=1)) == 1


def test_revise_auto_lets_the_revision_policy_click(png):
    from monailabel_xflow.app.revise import XFlowReviseTask

    far = Click(True, *pixel_to_point(120, 300, (H, W)))
    policy = ScriptedPolicy(
        [stage1(True, [box_of(EFFUSION_GT)])], [[format_stage2(Stage2Action(far)), format_stage2(Stage2Action(None))]]
    )
    seg = ScriptedSegmenter(EFFUSION_GT, positive_radius_px=15)
    task = XFlowReviseTask(StubRuntime(XFlow(policy, policy, seg)))
    label_file, params = task({"image": str(png), "finding": "effusion", "auto": True, "max_clicks": 2})
    (proposed,) = params["proposed_clicks"]  # the policy speaks 0..1000 text coordinates
    assert proposed["positive"] and (proposed["x"], proposed["y"]) == pytest.approx((far.x, far.y), abs=1e-3)
    out = label_io.read_label(label_file, (H, W))
    assert out[120, 300] == 7 and out[190, 230] == 7 and set(np.unique(out)) == {0, 7}


def test_runtime_without_or_with_a_broken_configuration_still_answers(tmp_path):
    from monailabel_xflow.app.errors import ModelsNotConfiguredError
    from monailabel_xflow.workflow.model_config import DEMO_NOTICE, ModelConfigError
    from monailabel_xflow.workflow.runtime import XFlowRuntime

    demo = XFlowRuntime({}, environ={}, preload=False)  # nothing configured: the committed demo
    assert demo.status()["source"] == "demo" and demo.status()["demo"] == DEMO_NOTICE
    empty = XFlowRuntime({}, environ={"XFLOW_NO_DEMO": "1"})
    assert empty.status()["configured"] is False and "--conf models" in empty.status()["message"]
    with pytest.raises(ModelsNotConfiguredError, match="XFLOW_MODELS"):
        empty.get()
    broken = XFlowRuntime({"models": str(tmp_path / "missing.yaml")}, environ={})
    assert "does not exist" in broken.status()["error"]
    with pytest.raises(ModelConfigError, match="does not exist"):
        broken.get()
    assert status_of(ModelConfigError("x")) == 503


def test_the_models_line_names_a_promoted_segmenter_so_cached_scores_are_redone(tmp_path):
    """The uncertainty scores' cache key holds this line: it named the configured segmenter only,
    so after a promotion Next Sample kept ranking images by the replaced segmenter's scores."""
    import os

    from monailabel_xflow.app.scoring import _score_key
    from monailabel_xflow.workflow.runtime import TRAINED_SEGMENTER_DIR, XFlowRuntime

    runtime = XFlowRuntime({}, environ={}, preload=False, model_dir=tmp_path)
    before = runtime.describe()
    trained = tmp_path / TRAINED_SEGMENTER_DIR
    trained.mkdir()
    (trained / "config.json").write_text("{}")
    promoted = runtime.describe()
    assert promoted != before and f"fine-tuned segmenter={TRAINED_SEGMENTER_DIR}@" in promoted
    stat = (trained / "config.json").stat()
    os.utime(trained / "config.json", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # promoted again
    again = runtime.describe()
    assert again != promoted
    image = tmp_path / "x.png"
    image.write_bytes(b"x")
    keys = {_score_key(str(image), "Segment the edema.", 4, line) for line in (before, promoted, again)}
    assert len(keys) == 3


def test_a_click_revision_answers_from_the_cached_embedding_while_another_image_is_in_stage1(tmp_path):
    """One lock: a person's click on image B is not queued behind a run on image A that is stuck
    in Stage 1; it reuses B's cached embedding (no encoder call) on a fork of the segmenter."""
    import threading

    from monailabel_xflow.app.infer import XFlowInferTask
    from monailabel_xflow.app.revise import XFlowReviseTask
    from monailabel_xflow.segmenter.cache import EmbeddingCache
    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter

    paths = {}
    for name, seed in (("a", 1), ("b", 2)):
        paths[name] = tmp_path / f"{name}.png"
        pixels = np.random.default_rng(seed).uniform(0, 255, (H, W)).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(paths[name])
    cache = EmbeddingCache(max_entries=8)
    segmenter = load_segmenter(str(build_random_sam3(tmp_path / "sam", "tiny")), device="cpu", cache=cache)
    in_stage1, release = threading.Event(), threading.Event()

    class StuckOnA(ScriptedPolicy):
        """Answers B (the first question) at once; stays in Stage 1 on A (the second)."""

        def stage1(self, image, instruction):
            self.calls.append(("stage1", instruction))
            if len(self.calls) == 2:
                in_stage1.set()
                assert release.wait(120), "the test never released Stage 1"
            return stage1(False)

    runtime = StubRuntime(XFlow(StuckOnA(), None, segmenter))
    infer, revise = XFlowInferTask(runtime), XFlowReviseTask(runtime)
    infer({"image": str(paths["b"]), "finding": "effusion", "trace": False})  # B's embedding now cached
    encoded = cache.stats.misses
    run_a = threading.Thread(target=infer, args=({"image": str(paths["a"]), "finding": "effusion", "trace": False},))
    run_a.start()
    try:
        assert in_stage1.wait(120), "the run on A never reached Stage 1"
        assert cache.stats.misses == encoded + 1  # A was encoded; its run now holds the workflow
        label_file, params = revise({"image": str(paths["b"]), "finding": "effusion", "foreground": [[150, 100, 0]]})
        assert not release.is_set() and run_a.is_alive()  # answered while A is still in Stage 1
        assert cache.stats.misses == encoded + 1  # B's embedding came from the cache
        assert params["clicks"] and params["box"] is not None and Path(label_file).is_file()
    finally:
        release.set()
        run_a.join(120)
    assert not run_a.is_alive()


def test_store_seg_hands_the_tasks_masks_to_the_datastore_without_reading_files_back(monkeypatch):
    """The SEG is written from each finding's full mask the task answered: the image is not decoded
    again and the label file not read back (issue 28)."""
    from monailabel_xflow.app import xflow_app

    def no_reading(*args, **kwargs):
        raise AssertionError("store_result_seg read a file back")

    monkeypatch.setattr(label_io, "load_image", no_reading)
    monkeypatch.setattr(label_io, "read_label", no_reading)
    calls = []

    class PACS:
        def store_seg(self, image_id, label, findings=(), algorithm="XFlow", masks=None):
            calls.append((image_id, label, list(findings), algorithm, masks))
            return "1.2.3"

    masks = {"effusion": EFFUSION_GT, "edema": EDEMA_GT}
    wanted = {"findings": ["edema", "effusion"], "algorithm": "ROSALIA", "masks": masks}
    result = {"file": "/no/such/label.png", "params": {"store_seg": wanted, "label_names": {"edema": 1}}}
    xflow_app.store_result_seg(PACS(), "series-1", result)
    assert calls == [("series-1", None, ["edema", "effusion"], "ROSALIA", masks)]
    assert result["params"]["seg_series"] == "1.2.3" and "store_seg" not in result["params"]


def test_a_label_file_is_written_once_with_the_answer_in_its_header(tmp_path, monkeypatch):
    import nibabel as nib

    from monailabel_xflow.transforms.loading import save_nifti_2d

    image = tmp_path / "cxr.nii.gz"
    save_nifti_2d(np.random.default_rng(0).uniform(0, 1, (H, W)).astype(np.float32), image, spacing=(0.5, 0.25))
    ref = label_io.load_image(str(image))[1]
    saves = []
    real_save = nib.save
    monkeypatch.setattr(nib, "save", lambda img, path: (saves.append(path), real_save(img, path)))
    label = np.zeros((H, W), np.uint8)
    label[EFFUSION_GT] = 7
    for extension, dtype in ((None, "uint8"), (".nii", "float32")):
        saves.clear()
        path = label_io.write_label(label, ref, str(tmp_path), extension=extension, dtype=dtype, answer="Effusion.")
        assert saves == [path]  # one pass: built in memory, saved once, never reloaded
        assert label_io.answer_of_file(path) == "Effusion."
        np.testing.assert_array_equal(label_io.read_label(path, (H, W)), label)
        assert np.allclose(nib.load(path).affine, nib.load(str(image)).affine)  # the image's own geometry


def test_results_are_written_apart_from_where_clients_save_them(tmp_path, monkeypatch):
    """A server's result goes to its own private folder, never into the temporary folder itself:
    MONAI Label's client saves a result as ``<its temporary folder>/<the name the server sent>``
    and the server deletes its copy once sent, so a client beside the server lost its file (whenever
    the deletion came after the client's save; tests/test_hostile_client.py checks a live server)."""
    import os
    import stat
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(label_io, "_RESULTS", [])
    ref = label_io.ImageRef(str(tmp_path / "x.png"), (H, W), "PNG", (1.0, 1.0), {})
    first = label_io.write_label(np.zeros((H, W), np.uint8), ref)
    second = label_io.write_label(np.zeros((H, W), np.uint8), ref)
    folder = Path(first).parent
    assert folder == tmp_path / f"xflow-results-{os.getuid()}" and folder == Path(second).parent and first != second
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # not another local user's to swap
    assert not (tmp_path / Path(first).name).exists()  # where a client saves it stays free

    # a folder of that name open to others (or a link to one) is not used
    monkeypatch.setattr(label_io, "_RESULTS", [])
    for p in folder.iterdir():
        p.unlink()
    folder.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o777)
    os.chmod(tmp_path / "elsewhere", 0o777)
    folder.symlink_to(tmp_path / "elsewhere")
    third = Path(label_io.write_label(np.zeros((H, W), np.uint8), ref))
    assert third.parent.parent == tmp_path and third.parent.name.startswith("xflow-results-")
    assert third.parent != folder and stat.S_IMODE(third.parent.stat().st_mode) == 0o700
    assert not list((tmp_path / "elsewhere").iterdir())


SCORING_IMAGES = 48
"""Radiographs in the stop test's studies folder: enough that the startup scoring of the tiny
models is still running when the server is stopped (it takes minutes on two CPU cores)."""


STOP_S = 20
"""Seconds a stopped ``xflow serve`` has to end every process it started: the server's clean
shutdown, then up to 10 s for what the server started to end after SIGTERM."""


def is_scoring(proc) -> bool:
    """Whether ``proc`` (psutil) is MONAI Label's scoring subprocess (``python -m
    monailabel.interfaces.utils.app -m scoring ...``)."""
    import psutil

    try:
        cmd = proc.cmdline()
    except psutil.Error:
        return False
    return "monailabel.interfaces.utils.app" in cmd and "scoring" in cmd


def describe(proc) -> str:
    """``proc``'s command line, shortened, for a failure message."""
    import psutil

    try:
        return " ".join(proc.cmdline())[:160]
    except psutil.Error as exc:
        return f"({exc})"


@pytest.mark.parametrize(
    "how",
    [
        # make run's server, stopped as a terminal's Ctrl-C does: SIGINT to the whole foreground
        # process group, here while the startup scoring subprocess runs
        "ctrl-c to the group",
        # `kill PID` of `xflow serve`, what a service manager sends to the process it started: the
        # launcher passes SIGTERM on to the server it started, and ends what the server started
        "sigterm to the launcher",
    ],
)
def test_a_stopped_server_shuts_down_cleanly_and_leaves_no_process(tmp_path, tiny_models, how):
    """``xflow serve`` stopped either way while its startup scoring runs: every process it had
    started (the server and the server's scoring subprocess) is gone within seconds, long before
    the scoring would have ended, nothing of its process group is left holding the port, and
    uvicorn shut down cleanly (not killed)."""
    import os
    import signal
    import sys
    import time

    import psutil
    from servers import ServerProcess, free_port, monailabel_env

    studies = tmp_path / "studies"
    studies.mkdir()
    samples = sorted((Path(__file__).resolve().parents[1] / "sample-data").glob("phantom_1_*.png"))
    for i in range(SCORING_IMAGES):  # distinct pixels: no cached answer shortens the scoring
        pixels = np.array(Image.open(samples[i % len(samples)]))
        pixels[0, i // len(samples)] ^= 1
        Image.fromarray(pixels).save(studies / f"cxr_{i:03d}.png")
    port = free_port()
    cmd = [sys.executable, "-m", "monailabel_xflow.cli", "serve", "--studies", str(studies)]
    cmd += ["--workspace", str(tmp_path / "ws"), "--port", str(port), "--models", str(tiny_models(tmp_path / "m"))]
    # scoring at start-up, as `xflow serve` runs by default (the test environment turns it off)
    env = monailabel_env(tmp_path, {"MONAI_LABEL_AUTO_UPDATE_SCORING": "true"})
    server = ServerProcess(cmd, tmp_path / "serve.log", env=env)
    try:
        server.wait_http(f"http://127.0.0.1:{port}/info/", 240)
        # stopped once an image is scored: a scoring subprocess still loading its models may die on
        # its own at its next write to the closed pipe of a server gone, and then proves nothing
        deadline = time.monotonic() + 120
        while "xflow_uncertainty cxr_" not in server.log.read_text(errors="replace"):
            if time.monotonic() > deadline or not server.alive():
                pytest.fail(f"no image scored 120 s after the server answered:\n{server.tail()}")
            time.sleep(0.5)
        started = psutil.Process(server.pid).children(recursive=True)  # the server and everything under it
        if not any(is_scoring(p) for p in started):
            pytest.fail(f"the scoring ended before the stop: the test proves nothing\n{server.tail()}")
        if how == "ctrl-c to the group":
            os.killpg(server.pid, signal.SIGINT)
        else:
            os.kill(server.pid, signal.SIGTERM)  # the launcher only, not its group
        stopped = time.monotonic()
        server.proc.wait(60)
        _, alive = psutil.wait_procs(started, timeout=max(0.0, stopped + STOP_S - time.monotonic()))
        if alive:
            left = "\n".join(f"{p.pid}: {describe(p)}" for p in alive)
            pytest.fail(f"processes xflow serve started outlived the {how} by {STOP_S} s:\n{left}\n{server.tail()}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # anything else of the group, e.g. started during the shutdown
            try:
                os.killpg(server.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"processes of the group outlived the {how} by {STOP_S + 30} s:\n{server.tail()}")
        assert "Application shutdown complete" in server.tail(20000), server.tail()
    finally:
        server.stop()
