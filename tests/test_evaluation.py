"""Running an evaluation set: scores, resume, reports and the ``xflow eval`` command."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.cli import main
from monailabel_xflow.data.readers import read_folder
from monailabel_xflow.eval.evaluate import (
    RESULTS_NAME,
    EvaluationError,
    evaluate,
    files_fingerprint,
    load_results,
)
from monailabel_xflow.geometry import resize_mask

SIZE = 32


def build_folder(tmp_path):
    """Six questions on two images: 3 positives (one per level) and 3 negatives.

    Returns the folder and the "perfect" predictions (GT for positives, empty for negatives).
    """
    data = tmp_path / "data"
    (data / "masks").mkdir(parents=True)
    for name in ("a", "b"):
        Image.fromarray(np.full((SIZE, SIZE), 100, np.uint8)).save(data / f"{name}.png")
    m1 = np.zeros((SIZE, SIZE), bool)
    m1[4:12, 4:12] = True
    m2 = np.zeros((SIZE, SIZE), bool)
    m2[20:28, 18:30] = True
    rows = [
        ("a.png", m1, "Segment the effusion."),
        ("a.png", m1, "Segment the effusion in the right lung."),
        ("b.png", m2, "Segment the edema in the left lung base."),
        ("a.png", None, "Segment the edema."),
        ("b.png", None, "Segment the effusion in the right lung."),
        ("b.png", None, "Segment the edema in the right apical zone lung."),
    ]
    lines = ["image,mask,instruction"]
    for n, (image, mask, text) in enumerate(rows):
        rel = ""
        if mask is not None:
            rel = f"masks/{n}.png"
            Image.fromarray(mask.astype(np.uint8) * 255).save(data / rel)
        lines.append(f"{image},{rel},{text}")
    (data / "instructions.csv").write_text("\n".join(lines) + "\n")
    return data


class Predictor:
    """Counts calls; predicts the GT shifted by ``shift`` px for positives, a stray pixel on one negative."""

    def __init__(self, shift=0, fail_after=None):
        self.calls = 0
        self.shift = shift
        self.fail_after = fail_after

    def __call__(self, case):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt  # simulates a killed run
        self.calls += 1
        gt = case.load_mask()
        if gt is None:
            if case.level == "zone":
                pred = np.zeros((SIZE, SIZE), bool)
                pred[0, 0] = True
                return pred
            return None
        return np.roll(gt, self.shift, axis=1)


def test_scores_by_level_and_reports(tmp_path):
    cases = read_folder(build_folder(tmp_path)).cases
    assert len(cases) == 6
    out = tmp_path / "out"
    report = evaluate(cases, Predictor(shift=2), out, progress=False)
    # m1: 8x8 shifted by 2 -> I = 8*6 = 48, U = 64 + 64 - 48 = 80 -> 0.6 (chest and lung)
    # m2: 8x12 shifted by 2 -> I = 8*10 = 80, U = 96 + 96 - 80 = 112 (zone)
    assert report["levels"]["chest"]["giou"] == pytest.approx(0.6)
    assert report["levels"]["lung"]["giou"] == pytest.approx(0.6)
    assert report["levels"]["zone"]["giou"] == pytest.approx(80 / 112)
    assert report["average"]["giou"] == pytest.approx((0.6 + 0.6 + 80 / 112) / 3)
    # the zone-level negative got a stray pixel: N-Acc 0 there, 1 elsewhere; F1 = 2/(2+1) at zone
    assert report["levels"]["zone"]["n_acc"] == 0.0
    assert report["levels"]["chest"]["n_acc"] == 1.0
    assert report["levels"]["zone"]["f1"] == pytest.approx(2 / 3)
    assert report["average"]["f1"] == pytest.approx((1 + 1 + 2 / 3) / 3)
    assert report["noise"]["delta_c"] == 0
    assert report["findings"]["effusion"]["levels"]["chest"]["n_positive"] == 1
    for name in ("report.json", "report.md", "levels.png", "findings.png", "fragmentation.png", RESULTS_NAME):
        assert (out / name).is_file(), name
    saved = json.loads((out / "report.json").read_text())
    assert saved["levels"]["chest"]["precision"] == 1.0
    md = (out / "report.md").read_text()
    assert "| **average** |" in md and "Table 3" in md and "| chest | 1 | 1 |" in md
    with Image.open(out / "levels.png") as im:
        assert im.size[0] > 100


def test_resume_skips_finished_cases(tmp_path):
    cases = read_folder(build_folder(tmp_path)).cases
    out = tmp_path / "out"
    first = Predictor(fail_after=4)
    with pytest.raises(KeyboardInterrupt):
        evaluate(cases, first, out, progress=False, plots=False)
    assert first.calls == 4
    assert len(load_results(out)) == 4
    second = Predictor()
    report = evaluate(cases, second, out, progress=False, plots=False)
    assert second.calls == 2  # only the two unfinished cases
    assert report["n_scored"] == 6
    third = Predictor()
    evaluate(cases, third, out, progress=False, plots=False)
    assert third.calls == 0
    # a changed instruction for the same id is redone; resume=False redoes everything
    fresh = Predictor()
    evaluate(cases, fresh, out, progress=False, resume=False)
    assert fresh.calls == 6


def test_a_corrected_ground_truth_is_scored_again_on_resume(tmp_path):
    """Only the question, the predictor and the connectivity were compared: a mask corrected after
    a run kept its old score on resume, without a word."""
    import os

    data = build_folder(tmp_path)
    cases = read_folder(data).cases
    out = tmp_path / "out"

    def perfect(case):
        return case.load_mask()

    first = evaluate(cases, perfect, out, progress=False, plots=False)
    assert first["levels"]["chest"]["giou"] == 1.0
    fixed = cases[0].mask_path
    corrected = np.zeros((SIZE, SIZE), np.uint8)
    corrected[4:12, 4:20] = 255  # the annotator widened the lesion
    Image.fromarray(corrected).save(fixed)
    os.utime(fixed, ns=(os.stat(fixed).st_atime_ns, os.stat(fixed).st_mtime_ns + 10**9))
    stale = Predictor()  # predicts the *current* GT: only a re-scored case can be perfect again
    again = evaluate(read_folder(data).cases, stale, out, progress=False, plots=False)
    assert stale.calls == 1  # that case alone
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    latest = [r for r in records if r["case_id"] == cases[0].case_id][-1]
    assert latest["stats"]["gt_area"] == 8 * 16  # scored against the corrected mask (8 x 8 before)
    assert again["levels"]["chest"]["giou"] == 1.0


def test_errors_are_recorded_and_retried(tmp_path):
    cases = read_folder(build_folder(tmp_path)).cases

    def flaky(case):
        if case.case_id == cases[0].case_id:
            raise RuntimeError("model exploded")
        return case.load_mask()

    out = tmp_path / "out"
    report = evaluate(cases, flaky, out, progress=False, plots=False)
    assert report["n_scored"] == 5 and "model exploded" in report["errors"][cases[0].case_id]
    again = Predictor()
    report = evaluate(cases, again, out, progress=False, plots=False)
    assert again.calls == 1 and report["errors"] == {}


def test_prediction_resized_to_gt_and_bad_shapes(tmp_path):
    cases = read_folder(build_folder(tmp_path)).cases

    def upsampled(case):
        gt = case.load_mask()
        return None if gt is None else np.kron(gt, np.ones((2, 2), bool))[None]  # (1, 2H, 2W)

    report = evaluate(cases, upsampled, tmp_path / "o1", progress=False, plots=False)
    assert report["resized"] == 3 and report["levels"]["chest"]["giou"] == 1.0
    assert not any("aspect ratio" in n for n in report["notes"])  # same shape, twice the size: by design

    def transposed(case):
        gt = case.load_mask()
        return None if gt is None else np.pad(gt, ((0, gt.shape[0]), (0, 0)))  # (2H, W): another image's shape

    report = evaluate(cases, transposed, tmp_path / "o4", progress=False, plots=False)
    assert report["resized"] == 3 and sum("another aspect ratio" in n for n in report["notes"]) == 3
    report = evaluate(cases, lambda c: np.zeros((2, 2, 2)), tmp_path / "o2", progress=False, plots=False)
    assert len(report["errors"]) == 6 and "2-D" in next(iter(report["errors"].values()))
    assert resize_mask(np.eye(2, dtype=bool), (4, 4)).sum() == 8
    with pytest.raises(EvaluationError, match="unique"):
        evaluate(cases + cases[:1], Predictor(), tmp_path / "o3", progress=False)


def test_cli_with_saved_predictions(tmp_path, capsys):
    data = build_folder(tmp_path)
    cases = read_folder(data).cases
    preds = tmp_path / "preds"
    preds.mkdir()
    for case in cases[:-1]:  # the last prediction is missing
        gt = case.load_mask()
        mask = gt if gt is not None else np.zeros((SIZE, SIZE), bool)
        Image.fromarray(mask.astype(np.uint8) * 255).save(preds / f"{case.case_id}.png")
    out = tmp_path / "out"
    status = main(["eval", "--dataset", f"folder:{data}", "--predictions", str(preds), "--out", str(out), "--no-plots"])
    captured = capsys.readouterr()
    assert status == 1 and "missing prediction" in captured.err
    report = json.loads((out / "report.json").read_text())
    assert report["n_scored"] == 5 and report["levels"]["chest"]["giou"] == 1.0
    # supply the missing mask: the predictions changed, so the rerun scores them again
    Image.fromarray(np.zeros((SIZE, SIZE), np.uint8)).save(preds / f"{cases[-1].case_id}.png")
    assert (
        main(["eval", "--dataset", f"folder:{data}", "--predictions", str(preds), "--out", str(out), "--no-plots"]) == 0
    )
    assert json.loads((out / "report.json").read_text())["n_scored"] == 6
    # a rewritten prediction is scored anew, not read back from results.jsonl
    chest = next(c for c in cases if c.level == "chest" and c.positive)
    Image.fromarray(np.zeros((SIZE, SIZE), np.uint8)).save(preds / f"{chest.case_id}.png")
    assert (
        main(["eval", "--dataset", f"folder:{data}", "--predictions", str(preds), "--out", str(out), "--no-plots"]) == 0
    )
    assert json.loads((out / "report.json").read_text())["levels"]["chest"]["giou"] == 0.0


def test_records_of_another_predictor_are_redone(tmp_path):
    cases = read_folder(build_folder(tmp_path)).cases
    out = tmp_path / "out"
    evaluate(cases, Predictor(), out, progress=False, plots=False)  # no identity (older records)
    runs = {}
    for name in ("model-a", "model-a", "model-b"):
        runs.setdefault(name, []).append(Predictor())
        evaluate(cases, runs[name][-1], out, progress=False, plots=False, predictor_id=name)
    assert [p.calls for p in runs["model-a"]] == [6, 0] and runs["model-b"][0].calls == 6
    assert {r["predictor"] for r in load_results(out).values()} == {"model-b"}


def test_files_fingerprint_follows_the_files(tmp_path):
    model = tmp_path / "model"
    (model / "rev").mkdir(parents=True)
    (model / "rev" / "adapter.safetensors").write_bytes(b"x" * 10)
    config = tmp_path / "models.yaml"
    config.write_text("vlm_base: ./model\n")
    first = files_fingerprint(config, model, "org/hub-model")
    assert files_fingerprint(config, model, "org/hub-model") == first
    assert files_fingerprint(config, model, "org/other-model") != first
    (model / "rev" / "adapter.safetensors").write_bytes(b"y" * 11)  # retrained
    second = files_fingerprint(config, model, "org/hub-model")
    assert second != first
    (model / "rev" / "extra.json").write_text("{}")
    assert files_fingerprint(config, model, "org/hub-model") != second


def test_cli_model_identity_covers_the_weights_it_names(tmp_path):
    from monailabel_xflow.eval.evaluate import model_identity

    for name in ("base", "init", "segmenter"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.bin").write_bytes(b"0")
    config = tmp_path / "models.yaml"
    config.write_text("vlm_base: ./base\ninit_adapter: ./init\nsegmenter: ./segmenter\n")
    before = model_identity(str(config))
    assert model_identity(str(config)) == before
    (tmp_path / "init" / "weights.bin").write_bytes(b"01")  # a retrained adapter
    assert model_identity(str(config)) != before


def test_cli_bad_input_exits_2(tmp_path, capsys, monkeypatch):
    data = build_folder(tmp_path)
    assert main(["eval", "--dataset", "nonsense:x", "--predictions", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "bad dataset spec" in capsys.readouterr().err
    assert (
        main(
            [
                "eval",
                "--dataset",
                f"folder:{data}",
                "--predictions",
                str(tmp_path / "none"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
        == 2
    )
    # --model without the workflow module: a clear message, exit 2
    monkeypatch.setitem(sys.modules, "monailabel_xflow.workflow.xflow", None)
    assert main(["eval", "--dataset", f"folder:{data}", "--model", "cfg.yaml", "--out", str(tmp_path / "o")]) == 2
    assert "--predictions" in capsys.readouterr().err


def test_changed_instruction_is_redone(tmp_path):
    cases = read_folder(build_folder(tmp_path)).cases
    out = tmp_path / "out"
    evaluate(cases, Predictor(), out, progress=False, plots=False)
    path = out / RESULTS_NAME
    lines = path.read_text().splitlines()
    record = json.loads(lines[0])
    record["instruction"] = "Segment the opacity."
    path.write_text("\n".join([json.dumps(record)] + lines[1:]) + "\n{truncated")  # and a torn last line
    again = Predictor()
    evaluate(cases, again, out, progress=False, plots=False)
    assert again.calls == 1
    # records scored with another connectivity are not reused
    four = Predictor()
    report = evaluate(cases, four, out, progress=False, plots=False, connectivity=4)
    assert four.calls == 6 and report["connectivity"] == 4


def test_cli_model_hook_uses_workflow(tmp_path, monkeypatch, capsys):
    """--model builds XFlow.from_config(CONFIG) and calls run(image, instruction).mask per case."""
    import types

    import monailabel_xflow.transforms.loading as loading

    data = build_folder(tmp_path)
    seen = {}

    class FakeXFlow:
        @classmethod
        def from_config(cls, config):
            seen["config"] = config
            return cls()

        def run(self, image, instruction):
            seen.setdefault("instructions", []).append(instruction.text)
            mask = np.zeros(image.shape, bool)
            mask[4:12, 4:12] = instruction.finding == "effusion"
            return types.SimpleNamespace(mask=mask)

    fake = types.ModuleType("monailabel_xflow.workflow.xflow")
    fake.XFlow = FakeXFlow
    monkeypatch.setitem(sys.modules, "monailabel_xflow.workflow.xflow", fake)
    monkeypatch.setattr(loading, "load_cxr", lambda path: (np.zeros((SIZE, SIZE), np.float32), {}))
    out = tmp_path / "out"
    status = main(
        [
            "eval",
            "--dataset",
            f"folder:{data}",
            "--model",
            "my.yaml",
            "--out",
            str(out),
            "--save-predictions",
            "--no-plots",
        ]
    )
    assert status == 0, capsys.readouterr().err
    assert seen["config"] == "my.yaml" and len(seen["instructions"]) == 6
    assert len(list((out / "predictions").glob("*.png"))) == 6
    report = json.loads((out / "report.json").read_text())
    assert report["levels"]["chest"]["giou"] == 1.0  # the effusion mask is m1 itself
    assert report["levels"]["lung"]["n_acc"] == 0.0  # effusion predicted in the "right lung" negative
