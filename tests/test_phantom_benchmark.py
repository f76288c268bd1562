"""``xflow benchmark phantom``: the oracle reviser, the shared Stage 1, the revision bookkeeping, and
the whole command on tiny random models and a handful of phantom questions (resumable)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monailabel_xflow.cli import main
from monailabel_xflow.eval.phantom_benchmark import (
    GroundTruthReviser,
    SharedStage1,
    contact_cases,
    stage2_effect,
)
from monailabel_xflow.geometry import mask_to_box
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.protocol import BoxRef, Stage1Output, format_stage1
from monailabel_xflow.testing import ScriptedPolicy, ScriptedSegmenter, disk, ellipse
from monailabel_xflow.workflow.xflow import XFlow

H, W = 128, 160
EDEMA = Instruction("edema", ("left lung",))


def stage1_text(boxes) -> str:
    lungs = [BoxRef("right lung", (0.1, 0.1, 0.45, 0.9)), BoxRef("left lung", (0.55, 0.1, 0.9, 0.9))]
    return format_stage1(Stage1Output(lungs, True, [BoxRef("edema", b) for b in boxes], ""))


def test_oracle_reviser_targets_the_component_of_each_box():
    left, right = disk((H, W), 40, 40, 10), disk((H, W), 90, 120, 12)
    reviser = GroundTruthReviser(left | right)
    assert np.array_equal(reviser.target(mask_to_box(left)), left)
    assert np.array_equal(reviser.target(mask_to_box(right)), right)
    # a box holding no GT pixel is revised towards the nearest lesion
    assert np.array_equal(reviser.target((0.9, 0.9, 1.0, 1.0)), right)
    assert np.array_equal(reviser.target((0.0, 0.0, 0.1, 0.1)), left)
    assert not GroundTruthReviser(np.zeros((H, W), bool)).target((0.1, 0.1, 0.5, 0.5)).any()


def test_oracle_clicks_raise_the_iou_stage1_left():
    """XFlow with the oracle as π_rev: the Stage 1 box covers half the lesion; oracle clicks grow it."""
    rng = np.random.default_rng(0)
    image = rng.uniform(0, 1, (H, W)).astype(np.float32)
    lesion = ellipse((H, W), 64, 80, 20, 40)
    half = (80 / W - 40 / W, 44 / H, 80 / W, 84 / H)  # the left half of the lesion's box
    flow = XFlow(ScriptedPolicy([stage1_text([half])] * 2), None, ScriptedSegmenter(lesion, positive_radius_px=15))
    s1 = flow.run(image, EDEMA, revise=False).mask
    oracle = flow.run(image, EDEMA, reviser=GroundTruthReviser(lesion)).mask

    def iou(m):
        return (m & lesion).sum() / (m | lesion).sum()

    assert iou(s1) < 0.6 and iou(oracle) >= 0.7  # Algorithm 1 stops at tau = 0.7


class CountingPolicy:
    def __init__(self) -> None:
        self.single, self.batched = 0, []

    def stage1(self, image, instruction):
        self.single += 1
        return f"text of {instruction.text}"

    def stage1_many(self, image, instructions):
        self.batched.append(len(instructions))
        return [f"text of {i.text}" for i in instructions]


def test_shared_stage1_runs_the_policy_once_and_persists(tmp_path):
    image = np.zeros((8, 8), np.float32)
    other = np.ones((8, 8), np.float32)
    a, b = Instruction("edema", ("right lung",)), Instruction("effusion", ("left lung",))
    policy = CountingPolicy()
    shared = SharedStage1(policy, tmp_path / "texts.jsonl", identity="model-1")
    assert shared.stage1_many(image, [a, b]) == ["text of " + a.text, "text of " + b.text]
    assert shared.stage1(image, a) == "text of " + a.text and shared.stage1(other, a) == "text of " + a.text
    assert policy.batched == [2] and policy.single == 1  # the other image is a new question
    again = SharedStage1(CountingPolicy(), tmp_path / "texts.jsonl", identity="model-1")
    assert again.stage1(image, b) == "text of " + b.text and again.policy.single == 0
    retrained = SharedStage1(CountingPolicy(), tmp_path / "texts.jsonl", identity="model-2")
    retrained.stage1(image, b)
    assert retrained.policy.single == 1  # texts of another model are not reused


def _record(inter, union, pred, gt):
    return {"stats": {"intersection": inter, "union": union, "pred_area": pred, "gt_area": gt, "image_area": 100,
                      "pred_components": int(pred > 0), "gt_components": int(gt > 0), "pred_specks": 0,
                      "pred_specks_outside_gt": 0, "pred_speck_area": 0, "gt_specks": 0, "gt_speck_area": 0}}


def test_stage2_effect_counts_changes_and_iou_moves():
    before = {"a": _record(5, 10, 8, 7), "b": _record(5, 10, 8, 7), "c": _record(0, 4, 4, 0), "d": _record(0, 0, 0, 0)}
    after = {"a": _record(6, 10, 9, 7), "b": _record(5, 10, 8, 7), "c": _record(0, 0, 0, 0), "d": _record(0, 3, 3, 0)}
    e = stage2_effect(before, after)
    assert (e["n"], e["changed"], e["iou_up"], e["iou_down"]) == (4, 3, 1, 0)
    assert (e["presence_gained"], e["presence_lost"]) == (1, 1)
    assert e["mean_iou_delta"] == pytest.approx((0.6 - 0.5) / 2)


@pytest.fixture(scope="module")
def bench_models(tmp_path_factory, tiny_vlm):
    from monailabel_xflow.segmenter.configs import build_random_sam3

    folder = tmp_path_factory.mktemp("tiny-models")
    (folder / "vlm").symlink_to(tiny_vlm.base.parent, target_is_directory=True)  # copytree copies the files
    build_random_sam3(folder / "sam3", size="tiny", seed=0, image_size=112)  # 112 px input: a quicker F_seg
    cfg = folder / "models.yaml"
    cfg.write_text("vlm_base: ./vlm/base\ninit_adapter: ./vlm/init\nrev_adapter: ./vlm/rev\nsegmenter: ./sam3\n"
                   "device: cpu\nmax_clicks: 1\nmax_new_tokens: 24\n")
    return cfg


def test_command_runs_resumes_and_writes_the_report(bench_models, tmp_path, capsys):
    out = tmp_path / "bench"
    args = ["benchmark", "phantom", "--out", str(out), "--model", str(bench_models), "--questions", "6",
            "--size", "128", "--no-progress"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "XFlow Stage 1 only" in printed and "XFlow + oracle clicks" in printed
    summary = json.loads((out / "benchmark.json").read_text())
    assert summary["questions"] == 6 and list(summary["methods"]) == ["stage1", "stage1+2", "oracle"]
    for m in ("stage1", "stage1+2", "oracle"):
        lines = (out / m / "results.jsonl").read_text().splitlines()
        assert len(lines) == 6 and all("stats" in json.loads(x) for x in lines)
        assert len((out / m / "latency.jsonl").read_text().splitlines()) == 6
    levels = [json.loads(x)["level"] for x in (out / "stage1" / "results.jsonl").read_text().splitlines()]
    assert sorted(levels) == ["chest", "chest", "lung", "lung", "zone", "zone"]
    md = (out / "benchmark.md").read_text()
    assert "| **XFlow Stage 1 + 2** | **average** |" in md and "ΔC" in md and "What revision changed" in md
    for png in ("levels.png", "findings.png", "contact-sheet.png"):
        assert (out / png).stat().st_size > 1000
    # Stage 1 ran once per question for all three methods (texts stored with the model's identity)
    assert len((out / "stage1-texts.jsonl").read_text().splitlines()) == 6
    # resumable: a second run predicts nothing again
    assert main(args) == 0
    for m in ("stage1", "stage1+2", "oracle"):
        assert len((out / m / "latency.jsonl").read_text().splitlines()) == 6


def test_command_refuses_bad_arguments(bench_models, tmp_path, capsys):
    base = ["benchmark", "phantom", "--out", str(tmp_path / "b"), "--model", str(bench_models), "--size", "128"]
    assert main(base + ["--questions", "3"]) == 2
    assert main(base + ["--questions", "6", "--methods", "stage3"]) == 2
    assert main(base + ["--questions", "6", "--methods", "rosalia"]) == 2
    err = capsys.readouterr().err
    assert "at least 6" in err and "unknown method" in err and "--rosalia" in err


def test_contact_cases_cover_every_level_and_a_negative_each():
    class C:
        def __init__(self, level, finding, positive):
            self.level, self.finding, self.positive = level, finding, positive

    cases = [C(lv, f, p) for lv in ("chest", "lung", "zone") for f in ("edema", "edema", "opacity") for p in (True, False)]
    chosen = contact_cases(cases)
    assert [(c.level, c.positive) for c in chosen] == [(lv, p) for lv in ("chest", "lung", "zone") for p in (True, True, False)]
    assert all(len({c.finding for c in chosen if c.level == lv and c.positive}) == 2 for lv in ("chest", "lung", "zone"))


def test_interleaved_order_keeps_every_prefix_balanced():
    from monailabel_xflow.eval.phantom_benchmark import interleaved

    class C:
        def __init__(self, k, level, positive):
            self.k, self.level, self.positive = k, level, positive

    cases = [C(k, lv, p) for k, (lv, p) in enumerate([(lv, p) for lv in ("chest", "lung", "zone")
                                                       for p in (True, False) for _ in range(3)])]
    order = interleaved(cases[::-1])
    assert sorted(c.k for c in order) == list(range(18))
    first = order[:6]
    assert {(c.level, c.positive) for c in first} == {(lv, p) for lv in ("chest", "lung", "zone") for p in (True, False)}
    # each stratum keeps its own order
    chest_pos = [c.k for c in order if c.level == "chest" and c.positive]
    assert chest_pos == sorted(chest_pos, reverse=True)


def test_stage1_identity_follows_pi_init_bytes_only(bench_models, tmp_path):
    """The Stage 1 text cache key: the same for a copied model or another F_seg / π_rev, new for a
    π_init whose bytes changed."""
    import shutil

    from monailabel_xflow.eval.phantom_benchmark import stage1_identity
    from monailabel_xflow.workflow.model_config import ModelConfig

    copy = tmp_path / "copy"
    shutil.copytree(bench_models.parent, copy)
    first = stage1_identity(ModelConfig.load(bench_models))
    assert stage1_identity(ModelConfig.load(copy / "models.yaml")) == first  # mtimes differ, bytes do not
    cfg = ModelConfig.load(copy / "models.yaml")
    for f in (copy / "sam3").rglob("*.safetensors"):  # another F_seg
        f.write_bytes(f.read_bytes()[:-1] + b"\0")
    assert stage1_identity(ModelConfig.load(copy / "models.yaml")) == first
    adapter = next((cfg.resolve("init_adapter")).rglob("adapter_model.safetensors"))
    data = bytearray(adapter.read_bytes())
    data[-1] ^= 1
    adapter.write_bytes(bytes(data))
    assert stage1_identity(ModelConfig.load(copy / "models.yaml")) != first
