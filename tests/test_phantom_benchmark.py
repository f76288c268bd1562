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
from monailabel_xflow.instructions import Instruction, parse_instruction
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
    return {
        "stats": {
            "intersection": inter,
            "union": union,
            "pred_area": pred,
            "gt_area": gt,
            "image_area": 100,
            "pred_components": int(pred > 0),
            "gt_components": int(gt > 0),
            "pred_specks": 0,
            "pred_specks_outside_gt": 0,
            "pred_speck_area": 0,
            "gt_specks": 0,
            "gt_speck_area": 0,
        }
    }


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
    cfg.write_text(
        "vlm_base: ./vlm/base\ninit_adapter: ./vlm/init\nrev_adapter: ./vlm/rev\nsegmenter: ./sam3\n"
        "device: cpu\nmax_clicks: 1\nmax_new_tokens: 24\n"
    )
    return cfg


def _bench_args(out, cfg, *extra):
    return [
        "benchmark",
        "phantom",
        "--out",
        str(out),
        "--model",
        str(cfg),
        "--questions",
        "6",
        "--size",
        "128",
        "--no-progress",
        *extra,
    ]


@pytest.fixture(scope="module")
def bench_out(bench_models, tmp_path_factory):
    """One dev-split run of the whole command on six questions (the tests below read or copy it)."""
    out = tmp_path_factory.mktemp("bench") / "out"
    assert main(_bench_args(out, bench_models)) == 0
    return out


def test_command_runs_resumes_and_writes_the_report(bench_out, bench_models, capsys):
    out = bench_out
    summary = json.loads((out / "benchmark.json").read_text())
    assert summary["questions"] == 6
    assert list(summary["methods"]) == [
        "never-present",
        "always-present",
        "question-only",
        "stage1",
        "stage1+2",
        "oracle",
    ]
    assert summary["protocol"]["split"] == "dev" and summary["protocol"]["seed"] == 1000
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["split"], manifest["seed"], manifest["questions"], manifest["size"]) == ("dev", 1000, 6, 128)
    assert set(manifest["models"]) == {"xflow"} and manifest["data"]
    for m in ("stage1", "stage1+2", "oracle"):
        lines = (out / m / "results.jsonl").read_text().splitlines()
        assert len(lines) == 6 and all("stats" in json.loads(x) for x in lines)
        assert len((out / m / "latency.jsonl").read_text().splitlines()) == 6
    levels = [json.loads(x)["level"] for x in (out / "stage1" / "results.jsonl").read_text().splitlines()]
    assert sorted(levels) == ["chest", "chest", "lung", "lung", "zone", "zone"]
    # the trivial baselines: never present answers every negative right and finds nothing; always
    # present finds every positive (F1 2P / (2P + N) = 2/3 on a balanced set) and no negative
    never, always = summary["methods"]["never-present"], summary["methods"]["always-present"]
    assert (
        never["ci"]["n_acc"]["value"] == 1.0
        and never["ci"]["f1"]["value"] == 0.0
        and never["ci"]["giou"]["value"] == 0.0
    )
    assert always["ci"]["n_acc"]["value"] == 0.0 and always["ci"]["f1"]["value"] == pytest.approx(2 / 3)
    assert 0.0 < always["ci"]["giou"]["value"] < 1.0
    # the question-only baseline draws the whole region exactly when the question names >= 2 regions
    # (zone-level positives list every zone their lesion touches), so it reads only the text
    drawn = {
        r["case_id"]: r["stats"]["pred_area"] > 0
        for r in map(json.loads, (out / "question-only" / "results.jsonl").read_text().splitlines())
    }
    always_area = {
        r["case_id"]: r["stats"]["pred_area"]
        for r in map(json.loads, (out / "always-present" / "results.jsonl").read_text().splitlines())
    }
    for r in map(json.loads, (out / "stage1" / "results.jsonl").read_text().splitlines()):
        assert drawn[r["case_id"]] == (len(parse_instruction(r["instruction"]).regions) >= 2)
        assert always_area[r["case_id"]] > 0
    claims = {c["claim"]: c for c in summary["bootstrap"]["claims"]}
    assert claims["XFlow's zone-level presence beats reading the question alone (zone F1)"]["b"] == "question-only"
    ci = summary["methods"]["stage1"]["ci"]["giou"]
    assert ci["low"] <= ci["value"] <= ci["high"]
    md = (out / "benchmark.md").read_text()
    assert "dev split, seed 1000" in md and "Trivial: always present, whole region" in md
    assert "ΔC (all drew)" in md and "What revision changed" in md and "bootstrap 95 %" in md
    assert "| Stage 2 adds to Stage 1 (gIoU, Table 2) |" in md
    decisions = summary["revision_decisions"]  # π_rev's stops beside the oracle's, when it drew lesions
    assert decisions is None or ("π_rev's first decision" in md and decisions["lesions"] > 0)
    # the questions' wording says nothing about presence (issue 35): reported per level
    assert "Can presence be read off the question?" in md
    for level in ("chest", "lung", "zone"):
        audit = summary["text_shortcut"][level]
        assert audit["questions"] == 2 and audit["unmatched"] == 0
        assert audit["question_only"]["value"] == 0.5
    for png in ("levels.png", "findings.png", "contact-sheet.png"):
        assert (out / png).stat().st_size > 1000
    # Stage 1 ran once per question for all three methods (texts stored with the model's identity)
    assert len((out / "stage1-texts.jsonl").read_text().splitlines()) == 6
    # resumable: a second run predicts nothing again
    capsys.readouterr()
    assert main(_bench_args(out, bench_models)) == 0
    assert "dev split, seed 1000" in capsys.readouterr().out
    for m in ("stage1", "stage1+2", "oracle"):
        assert len((out / m / "latency.jsonl").read_text().splitlines()) == 6


def test_command_refuses_an_out_of_another_benchmark(bench_out, bench_models, tmp_path, capsys):
    """Results and drawings are keyed by case id: a folder made with another seed, size or
    question count is refused, not silently reused; so is a folder without a manifest."""
    before = (bench_out / "stage1" / "results.jsonl").read_text()
    assert main(_bench_args(bench_out, bench_models, "--seed", "1001")) == 2
    assert main(_bench_args(bench_out, bench_models, "--test")) == 2  # the test seed, into the dev folder
    err = capsys.readouterr().err
    assert "seed 1000" in err and "1001" in err and "new --out" in err and "split 'dev'" in err
    assert (bench_out / "stage1" / "results.jsonl").read_text() == before
    legacy = tmp_path / "legacy"
    (legacy / "data").mkdir(parents=True)
    assert main(_bench_args(legacy, bench_models)) == 2
    assert "without manifest.json" in capsys.readouterr().err
    assert main(_bench_args(tmp_path / "train", bench_models, "--seed", "0")) == 2
    assert "training phantoms" in capsys.readouterr().err


def test_manifest_refuses_changed_data_and_test_split_models(tmp_path):
    from monailabel_xflow.eval.phantom_benchmark import BenchmarkOutError, check_manifest

    setup = {"split": "test", "seed": 7301, "questions": 6, "size": 128}
    first = check_manifest(tmp_path, {**setup, "data": "aaa", "models": {"xflow": "m1"}})
    (tmp_path / "manifest.json").write_text(json.dumps(first))
    assert check_manifest(tmp_path, {**setup, "data": "aaa", "models": {"xflow": "m1", "rosalia": "r1"}})["models"] == {
        "xflow": "m1",
        "rosalia": "r1",
    }
    with pytest.raises(BenchmarkOutError, match="data"):
        check_manifest(tmp_path, {**setup, "data": "bbb"})  # same seed, other phantoms (e.g. a changed generator)
    with pytest.raises(BenchmarkOutError, match="scored once"):
        check_manifest(tmp_path, {**setup, "data": "aaa", "models": {"xflow": "m2"}})
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "manifest.json").write_text(json.dumps({**first, "split": "dev", "seed": 1000}))
    again = check_manifest(
        dev, {"split": "dev", "seed": 1000, "questions": 6, "size": 128, "data": "aaa", "models": {"xflow": "m2"}}
    )
    assert again["models"]["xflow"] == "m2"  # dev: another model is redone, not refused


def test_a_missing_prediction_is_an_error_not_an_empty_mask(bench_out, bench_models, tmp_path, capsys):
    import shutil

    from monailabel_xflow.data.readers import read_mimic_ils
    from monailabel_xflow.eval.phantom_benchmark import interleaved

    out = tmp_path / "copy"
    shutil.copytree(bench_out, out)
    cases = interleaved(read_mimic_ils(out / "data" / "ground-truth" / "heldout.json", split="test").cases)
    drawn = contact_cases(cases)[0]
    (out / "stage1+2" / "predictions" / f"{drawn.case_id}.png").unlink()
    assert main(_bench_args(out, bench_models)) == 2
    err = capsys.readouterr().err
    assert "XFlow Stage 1 + 2" in err and drawn.case_id in err and "never drawn as empty" in err


def test_command_refuses_bad_arguments(bench_models, tmp_path, capsys):
    base = ["benchmark", "phantom", "--out", str(tmp_path / "b"), "--model", str(bench_models), "--size", "128"]
    assert main(base + ["--questions", "3"]) == 2
    assert main(base + ["--questions", "6", "--methods", "stage3"]) == 2
    assert main(base + ["--questions", "6", "--methods", "rosalia"]) == 2
    err = capsys.readouterr().err
    assert "at least 6" in err and "unknown method" in err and "--rosalia" in err
    from monailabel_xflow.eval.phantom_protocol import SPENT_TEST_SEEDS, TEST_SEED, TRAIN_SEED

    for seed in (TEST_SEED, SPENT_TEST_SEEDS[-1], TRAIN_SEED):  # a test seed is never a dev choice's
        assert main(base + ["--questions", "6", "--seed", str(seed)]) == 2
        assert str(seed) in capsys.readouterr().err
    assert not (tmp_path / "b").exists()  # refused before anything is written


def test_contact_cases_cover_every_level_and_a_negative_each():
    class C:
        def __init__(self, level, finding, positive):
            self.level, self.finding, self.positive = level, finding, positive

    cases = [
        C(lv, f, p) for lv in ("chest", "lung", "zone") for f in ("edema", "edema", "opacity") for p in (True, False)
    ]
    chosen = contact_cases(cases)
    assert [(c.level, c.positive) for c in chosen] == [
        (lv, p) for lv in ("chest", "lung", "zone") for p in (True, True, False)
    ]
    assert all(
        len({c.finding for c in chosen if c.level == lv and c.positive}) == 2 for lv in ("chest", "lung", "zone")
    )


def test_interleaved_order_keeps_every_prefix_balanced():
    from monailabel_xflow.eval.phantom_benchmark import interleaved

    class C:
        def __init__(self, k, level, positive):
            self.k, self.level, self.positive = k, level, positive

    cases = [
        C(k, lv, p)
        for k, (lv, p) in enumerate(
            [(lv, p) for lv in ("chest", "lung", "zone") for p in (True, False) for _ in range(3)]
        )
    ]
    order = interleaved(cases[::-1])
    assert sorted(c.k for c in order) == list(range(18))
    first = order[:6]
    assert {(c.level, c.positive) for c in first} == {
        (lv, p) for lv in ("chest", "lung", "zone") for p in (True, False)
    }
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


# --- bootstrap intervals over phantoms ------------------------------------------------------------


def _scored_records(ious, level="chest", drawn=None):
    """Positive records with the given IoUs (GT 100 px, prediction of the same size)."""
    out = []
    for k, iou in enumerate(ious):
        inter = round(200 * iou / (1 + iou))  # |A| = |B| = 100: IoU = I / (200 - I)
        pred = 100 if (drawn is None or drawn[k]) else 0
        inter = inter if pred else 0
        rec = _record(inter, 200 - inter if pred else 100, pred, 100)
        out.append({"case_id": str(k), "level": level, **rec})
    return out


def test_bootstrap_resamples_phantoms_not_questions():
    """Two phantoms of 50 questions each, every question of one perfect, of the other missed: the
    only uncertainty is which phantoms were drawn. Resampling phantoms gives the exact
    distribution {0: 1/4, 0.5: 1/2, 1: 1/4}, so the 95 % interval is [0, 1]; resampling the 100
    questions as if independent would give about 0.5 ± 0.1."""
    from monailabel_xflow.eval.bootstrap import Scored, interval, metrics, resample_weights

    records = _scored_records([1.0] * 50 + [0.0] * 50)
    s = Scored.from_records(records, ["a"] * 50 + ["b"] * 50)
    w = resample_weights(s.group, 4000, seed=0)
    assert w.shape == (4000, 100) and set(np.unique(w)) <= {0.0, 1.0, 2.0}
    assert np.all(w.sum(1) == 100)  # two phantoms drawn, 50 questions each
    giou = metrics(s, w)["giou"]
    assert np.mean(giou == 0.5) == pytest.approx(0.5, abs=0.03) and np.mean(giou == 0.0) == pytest.approx(
        0.25, abs=0.03
    )
    ci = interval(giou, float(metrics(s, np.ones((1, 100)))["giou"][0]))
    assert ci == {"value": 0.5, "low": 0.0, "high": 1.0}


def test_bootstrap_interval_matches_the_normal_approximation():
    """One question per phantom: the percentile interval of a mean is close to mean ± 1.96 sd / √n."""
    from monailabel_xflow.eval.bootstrap import Scored, interval, metrics, resample_weights

    rng = np.random.default_rng(3)
    ious = rng.uniform(0, 1, 400)
    records = _scored_records(ious)
    s = Scored.from_records(records, list(range(400)))
    point = float(metrics(s, np.ones((1, 400)))["giou"][0])
    got = [r["stats"] for r in records]
    exact = np.mean([g["intersection"] / g["union"] for g in got])
    assert point == pytest.approx(exact)
    ci = interval(metrics(s, resample_weights(s.group, 3000, seed=1))["giou"], point)
    half = 1.96 * np.std([g["intersection"] / g["union"] for g in got], ddof=1) / np.sqrt(400)
    assert ci["low"] == pytest.approx(point - half, abs=0.15 * half)
    assert ci["high"] == pytest.approx(point + half, abs=0.15 * half)


def test_paired_difference_of_a_constant_gain_has_no_width():
    """Method b gains 0.1 IoU on every question of every phantom: whatever phantoms are drawn the
    paired difference is 0.1, so its interval is [0.1, 0.1] (an unpaired comparison would be wide)."""
    from monailabel_xflow.eval.bootstrap import Scored, interval, metrics, resample_weights

    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 0.8, 60)
    groups = np.repeat(np.arange(12), 5).tolist()
    a = Scored.from_records(_scored_records(base), groups)
    b = Scored.from_records(_scored_records(base + 0.1), groups)
    w = resample_weights(a.group, 1000, seed=2)
    diff = metrics(b, w)["giou"] - metrics(a, w)["giou"]
    point = float(metrics(b, np.ones((1, 60)))["giou"][0] - metrics(a, np.ones((1, 60)))["giou"][0])
    ci = interval(diff, point)
    assert ci["value"] == pytest.approx(0.1, abs=0.01) and ci["high"] - ci["low"] < 0.005


def test_bootstrap_point_estimates_are_the_reports_figures():
    """With weights of one the bootstrap's figures are build_report's (levels averaged equally,
    noise over positives), on a mix of levels, positives, negatives and empty predictions."""
    from monailabel_xflow.eval.bootstrap import Scored, metrics
    from monailabel_xflow.eval.evaluate import build_report

    rng = np.random.default_rng(5)
    records = []
    for k in range(90):
        level = ("chest", "lung", "zone")[k % 3]
        positive = k % 2 == 0
        pred = int(rng.integers(0, 3)) * 40
        gt = 100 if positive else 0
        inter = min(pred, gt, int(rng.integers(0, 60)))
        rec = _record(inter, pred + gt - inter, pred, gt)
        rec["stats"]["pred_components"] = int(rng.integers(0, 4)) if pred else 0
        rec["stats"]["pred_specks"] = int(rng.integers(0, 3)) if pred else 0
        records.append({"case_id": str(k), "level": level, "finding": "edema", **rec})
    report = build_report(records)
    got = {
        k: float(v[0])
        for k, v in metrics(Scored.from_records(records, [k // 3 for k in range(90)]), np.ones((1, 90))).items()
    }
    for key in ("giou", "ciou", "f1", "n_acc"):
        assert got[key] == pytest.approx(report["average"][key])
        for lv in ("chest", "lung", "zone"):
            assert got[f"{lv}/{key}"] == pytest.approx(report["levels"][lv][key])
    for key in ("delta_c", "specks"):
        assert got[key] == pytest.approx(report["noise"][key])


def test_region_mask_is_the_region_the_question_names():
    from monailabel_xflow.eval.phantom_benchmark import region_mask
    from monailabel_xflow.vocabulary import ALL_ZONES

    anatomy = np.zeros((10, 12), np.uint8)
    for k in range(8):
        anatomy[k, :] = k + 1  # one row per zone, in ALL_ZONES order
    anatomy[8, :6] = 9  # the heart
    assert np.array_equal(region_mask(Instruction("edema", ("left lung",)), anatomy), (anatomy >= 5) & (anatomy <= 8))
    zone = Instruction("effusion", ("right lung base",))
    assert np.array_equal(region_mask(zone, anatomy), anatomy == ALL_ZONES.index("right lung base") + 1)
    chest = region_mask(Instruction("edema", (), "global"), anatomy)
    assert np.array_equal(chest, anatomy > 0) and chest[8, :6].all() and not chest[9].any()
    assert np.array_equal(region_mask(Instruction("cardiomegaly", (), "global"), anatomy), anatomy > 0)


def test_model_content_identity_follows_weights_not_cards_or_times(tmp_path):
    """The manifest's model identity: bytes of the model's files, not their times and not the
    model card (editing a card must not read as another model on the test split)."""
    import os

    from monailabel_xflow.eval.phantom_benchmark import content_identity

    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"\0\1\2")
    (model / "README.md").write_text("card")
    first = content_identity(model)
    os.utime(model / "weights.bin", (1, 1))
    (model / "README.md").write_text("a rewritten card")
    assert content_identity(model) == first
    (model / "weights.bin").write_bytes(b"\0\1\3")
    assert content_identity(model) != first


def test_question_only_baseline_reads_the_number_of_regions_named(tmp_path):
    """The text shortcut of the phantom questions: present (whole region) iff >= 2 regions named."""
    from PIL import Image

    from monailabel_xflow.data.export import GT_DIR
    from monailabel_xflow.data.readers import EvalCase
    from monailabel_xflow.eval.phantom_benchmark import baseline_predictors, region_mask

    anatomy = np.zeros((10, 12), np.uint8)
    for k in range(8):
        anatomy[k, :] = k + 1
    (tmp_path / GT_DIR / "anatomy").mkdir(parents=True)
    Image.fromarray(anatomy).save(tmp_path / GT_DIR / "anatomy" / "p.png")
    predict, identity = baseline_predictors()["question-only"]
    assert identity == "baseline:question-only/1"
    two = Instruction("edema", ("left upper zone lung", "left mid zone lung"))
    for instruction, drawn in (
        (two, region_mask(two, anatomy)),
        (Instruction("edema", ("left upper zone lung",)), None),
        (Instruction("edema", ("left lung",)), None),
        (Instruction("edema", (), "global"), None),
    ):
        got = predict(EvalCase("c", tmp_path / "p.png", instruction, True))
        if drawn is None:
            assert got is None
        else:
            assert got is not None and got.any() and np.array_equal(got, drawn)


def test_stop_decisions_pair_pi_rev_with_the_oracle_lesion_by_lesion(tmp_path):
    """π_rev's first action beside whether the oracle's clicks paid on the same Stage 1 lesion, with
    IoUs measured against the ground truth: the traces' ``iou`` (F_seg's own estimate) is ignored."""
    from monailabel_xflow import rle
    from monailabel_xflow.data.readers import EvalCase
    from monailabel_xflow.eval.phantom_statistics import lesion_gains, stop_decisions
    from monailabel_xflow.metrics import mask_iou

    shape = (40, 40)
    left, right = np.zeros(shape, bool), np.zeros(shape, bool)
    left[10:20, 5:15] = True  # 100 px
    right[10:30, 25:35] = True  # 200 px
    truth = left | right

    def part(mask, rows):  # the rows of mask from rows[0] on, up to rows[1]
        out = np.zeros(shape, bool)
        out[rows[0] : rows[1]] = mask[rows[0] : rows[1]]
        return out

    def lesion(index, box, initial, final, action):
        steps = [{"step": 1, "action": action}] if action else []
        # the estimates say the opposite of the truth: a statistic reading them would fail below
        return {
            "index": index,
            "box": list(box),
            "initial_mask": rle.encode(initial),
            "mask": rle.encode(final),
            "initial_iou": 0.9,
            "iou": 0.1 if final.sum() > initial.sum() else 0.95,
            "steps": steps,
        }

    lbox, rbox = mask_to_box(left), mask_to_box(right)
    spill = left.copy()
    spill[20:25, 5:15] = True
    empty = np.zeros(shape, bool)
    rows = {
        # case: (pi_rev lesions, oracle lesions)
        "a": (  # two lesions on one phantom: the oracle completes the left one, π_rev the right one
            [
                lesion(0, lbox, part(left, (10, 15)), part(left, (10, 15)), "stop"),
                lesion(1, rbox, part(right, (10, 20)), right, "click"),
            ],
            [
                lesion(0, lbox, part(left, (10, 15)), left, "click"),
                lesion(1, rbox, part(right, (10, 20)), part(right, (10, 20)), "stop"),
            ],
        ),
        "b": ([lesion(0, lbox, left, left, "stop")], [lesion(0, lbox, left, left, "stop")]),
        "c": ([lesion(0, lbox, left, spill, "click")], [lesion(0, lbox, spill, left, "click")]),
        "neg": ([lesion(0, lbox, left, left, "click")], [lesion(0, lbox, left, empty, "click")]),  # erasing pays
        "unscored": ([lesion(0, lbox, left, left, "stop")], [lesion(0, lbox, left, empty, "click")]),
    }
    for k, name in enumerate(("stage1+2", "oracle")):
        (tmp_path / name).mkdir()
        lines = [json.dumps({"case_id": c, "lesions": v[k]}) for c, v in rows.items()]
        (tmp_path / name / "revisions.jsonl").write_text("\n".join(lines) + "\n")
    instruction = Instruction("effusion", ("left lung",))
    cases = [EvalCase(c, tmp_path / "x.png", instruction, True, mask_loader=lambda: truth) for c in "abc"]
    cases.append(EvalCase("neg", tmp_path / "x.png", instruction, False))
    got = stop_decisions(tmp_path / "stage1+2", tmp_path / "oracle", cases)
    assert got is not None and got["lesions"] == 5 and got["paid"] == 3  # a/0, c/0 (spill trimmed), neg/0
    assert got["stop_rate"] == {"policy": 0.4, "oracle": 0.4}
    assert got["clicked_when_paid"] == pytest.approx(2 / 3)  # clicked on c/0 and neg/0, stopped on a/0
    assert got["stopped_when_not_paid"] == 0.5  # stopped on b/0, clicked on a/1
    spilled = mask_iou(spill, left)
    assert got["mean_gain"]["policy"] == pytest.approx((0 + 0.5 + 0 + (spilled - 1) + 0) / 5)
    assert got["mean_gain"]["oracle"] == pytest.approx((0.5 + 0 + 0 + (1 - spilled) + 1) / 5)
    # the question without a lesion: only the oracle cleared its box, which is all of its +1
    assert got["boxes_without_lesion"] == 1 and got["cleared"] == {"policy": 0, "oracle": 1}
    assert got["mean_gain_on_lesions"]["oracle"] == pytest.approx((0.5 + 0 + 0 + (1 - spilled)) / 4)
    assert got["mean_gain_on_lesions"]["policy"] == pytest.approx((0 + 0.5 + 0 + (spilled - 1)) / 4)
    # as the benchmark's Markdown shows them
    from monailabel_xflow.eval.phantom_report import decisions_table

    table = "\n".join(decisions_table(got))
    assert f"| … on the 4 boxes on questions with a lesion | {got['mean_gain_on_lesions']['policy']:.4f} |" in table
    assert (
        "| Boxes of lesion-free questions cleared (of 1) | 0 | 1 |" in table
        and "| Stops at once | 0.400 | 0.400 |" in table
    )
    assert stop_decisions(tmp_path / "stage1+2", tmp_path / "missing", cases) is None
    # the per-lesion changes behind those means; a question not scored is left out
    gains = lesion_gains(tmp_path / "oracle", cases)
    assert set(gains) == {("a", 0), ("a", 1), ("b", 0), ("c", 0), ("neg", 0)}
    assert gains["a", 0] == pytest.approx(0.5) and gains["a", 1] == 0 and gains["neg", 0] == pytest.approx(1)
    assert gains["c", 0] == pytest.approx(1 - spilled)
