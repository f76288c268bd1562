"""Train, scoring and model loading under bad requests (issue 15, items 2 and 3), in-process:
strict bounded parameters, the held-out gate before a fine-tuned segmenter may serve, bounded
incremental scoring that skips and reports unknown ids, a failed model load that backs off.
The request validation module itself is checked here too."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from monailabel_xflow import parameters as pm
from monailabel_xflow.app import requests as rq
from monailabel_xflow.app.errors import RequestError, RequestTooLargeError, UnsafeIdError, status_of
from monailabel_xflow.testing import StubRuntime

# --- the validation module ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    ["/etc/passwd", "../x", "a/b", "a\\b", "..", "a..b", "a\x00b", "tab\there", "x" * 257, "", " lead", ".", 7, None],
)
def test_unsafe_ids_get_one_message(value):
    with pytest.raises(UnsafeIdError) as err:
        pm.check_id(value)
    assert str(err.value) == f"invalid image id: {pm.ID_RULES}"  # the same whatever it names
    assert status_of(err.value) == 400


@pytest.mark.parametrize("value", ["phantom_1_00006", "1.2.826.0.1.3680043.8.498.1", "patient 1 (copy)", "x" * 256])
def test_plain_ids_pass(value):
    assert pm.check_id(value) == value


@pytest.mark.parametrize(
    "value",
    [math.inf, -math.inf, math.nan, 10**400, "9" * 400, "1e400", 2.5, True, "lots", [3], {"a": 1}, 17, -1, "3.5"],
)
def test_integers_are_strict_and_bounded(value):
    with pytest.raises(RequestError, match="n must be an integer 0..16"):
        pm.as_int(value, "n", 0, 16)


@pytest.mark.parametrize("value,expected", [(3, 3), (3.0, 3), ("3", 3), (" 16 ", 16), ("4.0", 4), (None, 5), ("", 5)])
def test_integers_accept_what_clients_send(value, expected):
    assert pm.as_int(value, "n", 0, 16, default=5) == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, "1e400", 10**400, "x" * 40, 1.0, -1e-9, True])
def test_floats_are_finite_and_bounded(value):
    with pytest.raises(RequestError, match="lr must be a finite number"):
        pm.as_float(value, "lr", 0.0, 0.5)


def test_params_limits_and_reserved_keys():
    assert rq.parse_params('{"instruction": "edema"}') == {"instruction": "edema"}
    with pytest.raises(RequestTooLargeError):
        rq.parse_params("{" + " " * pm.MAX_PARAMS_BYTES + "}")
    for key in ("image", "label", "session", "save_label", "label_tag", "_secret"):
        with pytest.raises(RequestError, match="may not set"):
            rq.parse_params(f'{{"{key}": 1}}')
    with pytest.raises(RequestError, match="JSON"):
        rq.parse_params('{"n": ' + "9" * 5000 + "}")  # Python's integer digit limit
    with pytest.raises(RequestError, match="keys"):
        rq.parse_params({f"k{i}": 1 for i in range(pm.MAX_PARAM_KEYS + 1)}.__repr__().replace("'", '"'))
    assert status_of(RequestTooLargeError("x")) == 413


def test_work_bound_and_click_lists():
    pm.check_work(7, 8)  # all findings, 8 clicks: 63 steps
    with pytest.raises(RequestError, match="request too large"):
        pm.check_work(7, 16)
    assert pm.number_lists([[1, 2, 0]], "foreground") == [[1.0, 2.0, 0.0]]
    for bad in ([[math.inf, 1, 0]], [[10**400, 1, 0]], [[1, 2, 3, 4]], "abc", [[1, "2", 0]], [[1, 2, 0]] * 65):
        with pytest.raises(RequestError):
            pm.number_lists(bad, "foreground")


# --- train --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,value",
    [
        ("lr", math.nan),
        ("lr", math.inf),
        ("lr", "1e400"),
        ("lr", 0.5),
        ("lr", 0),
        ("steps", 10**9),
        ("steps", 0),
        ("steps", 2.5),
        ("batch", 0),
        ("batch", 1000),
        ("seed", -1),
        ("steps", "many"),
        ("interactive_rounds", 17),
        ("interactive_rounds", -1),
    ],
)
def test_train_parameters_are_bounded(key, value):
    from monailabel_xflow.task_options import train_params

    with pytest.raises(RequestError, match=key):
        train_params({key: value})


def test_train_parameters_defaults():
    from monailabel_xflow.task_options import train_params

    assert train_params({}) == {"steps": 10, "lr": 1e-4, "batch": 1, "seed": 0, "interactive_rounds": 6}
    assert train_params({"steps": "20", "lr": "0.001"})["steps"] == 20


@pytest.fixture(scope="module")
def held(cxr_samples):
    from PIL import Image

    from monailabel_xflow.training.promotion import component_prompts
    from monailabel_xflow.transforms.loading import load_cxr

    image, _ = load_cxr(cxr_samples / "nih" / "images" / "00004296_000.png")
    image = np.asarray(Image.fromarray((image * 255).astype(np.uint8)).resize((256, 256)), np.float32) / 255
    label = np.zeros((256, 256), np.uint8)
    label[60:140, 150:220] = 7
    label[160:200, 40:90] = 5
    return [(image, component_prompts(label))]


def test_a_fine_tuned_segmenter_serves_only_after_the_held_out_check(tiny_sam3, held, tmp_path):
    import torch

    from monailabel_xflow.segmenter.sam3 import load_tracker_model
    from monailabel_xflow.training.promotion import promotion_check

    same = tmp_path / "same"
    shutil.copytree(tiny_sam3, same)
    check = promotion_check(tiny_sam3, same, held)
    assert check["promoted"] and check["heldout_iou_candidate"] == check["heldout_iou_current"]
    assert check["heldout_iou_clicks_candidate"] == check["heldout_iou_clicks_current"]

    no_heldout = promotion_check(tiny_sam3, same, [])
    assert not no_heldout["promoted"] and "no held-out label" in no_heldout["reason"]

    model = load_tracker_model(tiny_sam3)
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if n.startswith("mask_decoder")).view(-1)[0] = float("nan")
    model.save_pretrained(tmp_path / "nan")
    poisoned = promotion_check(tiny_sam3, tmp_path / "nan", held)
    assert not poisoned["promoted"] and "not finite" in poisoned["reason"]

    model = load_tracker_model(tiny_sam3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("mask_decoder"):
                p.add_(torch.randn_like(p) * 3)
    model.save_pretrained(tmp_path / "noisy")
    noisy = promotion_check(tiny_sam3, tmp_path / "noisy", held)
    assert noisy["promoted"] == (
        noisy["heldout_iou_candidate"] >= noisy["heldout_iou_current"]
        and noisy["heldout_iou_clicks_candidate"] >= noisy["heldout_iou_clicks_current"]
    )
    assert ("kept aside" in noisy["reason"]) != noisy["promoted"]


def test_held_out_split():
    from monailabel_xflow.training.promotion import MAX_HELDOUT, split_heldout

    assert split_heldout(["a"]) == ([], ["a"])
    assert split_heldout(["a", "b"]) == (["b"], ["a"])
    held, train = split_heldout(list(range(100)))
    assert len(held) == MAX_HELDOUT and not set(held) & set(train) and len(held) + len(train) == 100


# --- scoring ------------------------------------------------------------------------------------


class FakeStore:
    def __init__(self, folder: Path, ids):
        self.folder = folder
        self.info: dict[str, dict] = {i: {} for i in ids}
        for i in ids:
            (folder / f"{i}.png").write_bytes(b"x")

    def list_images(self):
        return list(self.info)

    def get_unlabeled_images(self, tag=None):
        return list(self.info)

    def get_image_uri(self, image_id):
        return str(self.folder / f"{image_id}.png")

    def get_image_info(self, image_id):
        return dict(self.info[image_id])

    def update_image_info(self, image_id, info):
        self.info[image_id].update(info)


class FakeFlow:
    max_clicks = 2

    def __init__(self):
        self.runs = 0
        self.prepared = 0

    def prepare(self, image):  # 3D Slicer's Next Sample auto-run, kept in the workspace store
        self.prepared += 1
        return False

    def run_all(self, image, max_clicks=None, instructions=()):
        self.runs += 1
        return [SimpleNamespace(present=False, trace=SimpleNamespace(lesions=[]), instruction=i) for i in instructions]


def scoring(monkeypatch, flow):
    from monailabel_xflow.app.scoring import XFlowUncertaintyScoring
    from monailabel_xflow.transforms import labels as layout

    monkeypatch.setattr(layout, "load_image", lambda uri, image_id=None: (np.zeros((8, 8), np.float32), None))
    return XFlowUncertaintyScoring(StubRuntime(flow))


def test_scoring_is_bounded_incremental_and_reports_unknown_ids(monkeypatch, tmp_path):
    from fastapi import HTTPException

    flow = FakeFlow()
    task = scoring(monkeypatch, flow)
    store = FakeStore(tmp_path, ["a", "b", "c"])
    first = task({"images": ["a", "nope", "b", "a"], "instruction": "edema"}, store)
    assert first["scored"] == 2 and first["skipped"] == {"nope": "unknown image"} and flow.runs == 2
    assert flow.prepared == 2  # each scored image also gets the auto-run's answer kept
    again = task({"images": ["a", "b"], "instruction": "edema"}, store)
    assert again["scored"] == 0 and sorted(again["cached"]) == ["a", "b"] and flow.runs == 2  # cached
    import os

    os.utime(tmp_path / "b.png", ns=(1, 10**18))  # a changed study is scored again
    changed = task({"images": ["a", "b"], "instruction": "edema"}, store)
    assert changed["scores"].keys() == {"b"} and flow.runs == 3
    other_question = task({"images": ["a"], "instruction": "effusion"}, store)
    assert other_question["scored"] == 1
    bounded = task({"max_images": 1}, store)
    assert bounded["scored"] + len(bounded["cached"]) == 1
    for bad, status in (
        ({"max_images": 0}, 422),
        ({"max_images": 10**9}, 422),
        ({"images": "all"}, 422),
        ({"images": ["../../etc/passwd"]}, 400),
        ({"max_clicks": math.inf}, 422),
        ({"instruction": "pneumothorax"}, 422),
    ):
        with pytest.raises(HTTPException) as err:
            task(bad, store)
        assert err.value.status_code == status, bad


# --- model loading ------------------------------------------------------------------------------


def test_a_failed_model_load_backs_off_and_answers_503(monkeypatch, tmp_path):
    import time

    from monailabel_xflow.app.errors import ModelUnavailableError
    from monailabel_xflow.workflow import runtime as rt
    from monailabel_xflow.workflow.xflow import XFlow

    calls = []

    def broken(config):
        calls.append(time.monotonic())
        raise RuntimeError("weights truncated")

    monkeypatch.setattr(XFlow, "from_config", staticmethod(broken))
    runtime = rt.XFlowRuntime({}, environ={}, preload=False)  # the committed demo configuration
    with pytest.raises(ModelUnavailableError, match="weights truncated"):
        runtime.get()
    for _ in range(5):  # inside the back-off: no reload under the lock, a 503 with the reason
        with pytest.raises(ModelUnavailableError, match="next attempt in"):
            runtime.get()
    assert len(calls) == 1 and status_of(ModelUnavailableError("x")) == 503
    runtime.model.retry_at = 0.0  # the back-off has passed: one more attempt, then a longer wait
    with pytest.raises(ModelUnavailableError):
        runtime.get()
    assert len(calls) == 2 and runtime.model.retry_at - time.monotonic() > rt.LOAD_BACKOFF_S * 1.5


def test_a_failed_rosalia_load_backs_off_as_xflow_does(monkeypatch, tmp_path):
    """ROSALIA's runtime is the same lazy model as XFlow's: a broken folder is read once, then
    503 for the back-off (doubling), not a reload per request; /info says why."""
    from monailabel_xflow.app.errors import ModelUnavailableError
    from monailabel_xflow.rosalia.predictor import RosaliaPredictor
    from monailabel_xflow.rosalia.runtime import RosaliaRuntime
    from monailabel_xflow.workflow import runtime as rt
    from monailabel_xflow.workflow.model_config import ModelConfigError

    now = [1000.0]
    calls = []
    real = RosaliaPredictor.from_pretrained

    def counted(path, **kwargs):
        calls.append(path)
        return real(path, **kwargs)

    monkeypatch.setattr(RosaliaPredictor, "from_pretrained", staticmethod(counted))
    monkeypatch.setattr(rt.time, "monotonic", lambda: now[0])
    broken = tmp_path / "rosalia"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    runtime = RosaliaRuntime({}, environ={"XFLOW_ROSALIA": str(broken)}, preload=False)
    assert runtime.status()["configured"] and not runtime.status()["loaded"]
    with pytest.raises(ModelConfigError, match="cannot be loaded") as first:
        runtime.get()
    assert status_of(first.value) == 503
    for _ in range(5):  # inside the back-off: 503 with the reason, no second read of the folder
        with pytest.raises(ModelUnavailableError, match="ROSALIA weights failed to load .*next attempt in 30 s"):
            runtime.get()
    assert len(calls) == 1 and "cannot be loaded" in runtime.status()["error"]
    now[0] += rt.LOAD_BACKOFF_S + 1  # the back-off has passed: one more attempt, then twice as long
    with pytest.raises(ModelConfigError):
        runtime.get()
    assert len(calls) == 2 and runtime.model.retry_at - now[0] == 2 * rt.LOAD_BACKOFF_S
    with pytest.raises(ModelUnavailableError, match="next attempt in 60 s"):
        runtime.get()


def test_background_task_processes_are_recognised(monkeypatch):
    import sys

    from monailabel_xflow.app import scoring as rt

    assert rt.background_task() is None  # pytest is not a MONAI Label task subprocess
    main = SimpleNamespace(__spec__=SimpleNamespace(name="monailabel.interfaces.utils.app"))
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["app.py", "-m", "scoring", "-r", "{}"])
    assert rt.background_task() == "scoring"
    niced = []
    monkeypatch.setattr(rt.os, "nice", lambda n: niced.append(n))
    monkeypatch.setattr(rt, "_NICED", False)
    rt.lower_priority_if_background()
    rt.lower_priority_if_background()
    assert niced == [rt.BACKGROUND_NICE]  # once, before models are loaded


def test_choices():
    assert pm.as_choice(".nrrd", "result_extension", [".nii.gz", ".nrrd"]) == ".nrrd"
    assert pm.as_choice(None, "result_extension", [".nii.gz"], ".nii.gz") == ".nii.gz"
    with pytest.raises(RequestError, match="result_extension must be one of"):
        pm.as_choice("../x", "result_extension", [".nii.gz", ".nrrd"])
