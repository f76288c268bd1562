"""The MIMIC-ILS pipeline end to end on phantoms: stages, files, readers, resume, shards, Dask."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.cli import main
from monailabel_xflow.data.export import export_set, quantize
from monailabel_xflow.data.mimic_ils import ReportedFinding
from monailabel_xflow.data.readers import read_mimic_ils
from monailabel_xflow.ils import masks as alg
from monailabel_xflow.ils.masks import Detection
from monailabel_xflow.ils.phantom_truth import mask_iou_by_finding, truth_inputs
from monailabel_xflow.ils.pipeline import PipelineConfig, PipelineError, StudyInput, read_reports, run
from monailabel_xflow.ils.stages import PhantomSet, StageError, StudyImage, load_stages


@pytest.fixture(scope="module")
def phantoms(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ils-phantoms")
    export_set(root, 10, seed=5, size=128)
    return root


@pytest.fixture(scope="module")
def built(phantoms, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ils-out")
    run(truth_inputs(phantoms), PipelineConfig(out, None, phantoms, alg.HIGH_RECALL_THRESHOLDS))
    return out


def tree(root: Path) -> dict[str, bytes]:
    """Every output file but the resume records, by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "work" not in p.parts
    }


def test_phantom_stages_match_the_set_and_the_healthy_twin_differs_only_at_lesions(phantoms):
    stages = load_stages(None, phantoms)
    rec = json.loads((phantoms / "ground-truth" / "phantoms.json").read_text())[0]
    path = phantoms / rec["image"]
    pixels = np.asarray(Image.open(path))
    image = StudyImage(rec["study"], path, pixels)
    ph = stages.anatomy.phantoms.phantom(image)
    assert np.array_equal(quantize(ph.image)[1], pixels)  # the regenerated phantom is the file's
    organs = stages.anatomy.organs(image)
    healthy = stages.healthy.healthy(image, organs.edit_region())
    lesions = np.zeros(pixels.shape, bool)
    for les in ph.lesions:
        if les.finding != "cardiomegaly":
            lesions |= les.mask
    diff = np.abs(pixels.astype(int) - healthy.astype(int))
    if lesions.any():
        assert diff[lesions].mean() > 5 * diff[~lesions].mean()
    assert np.array_equal(healthy[~organs.edit_region()], pixels[~organs.edit_region()])
    masks = stages.locations.location_masks(image, healthy, ["right lower lobe", "left lung base", "heart", "rib"])
    assert set(masks) == {"right lower lobe", "left lung base", "heart"}  # no rib segmentation
    assert np.array_equal(masks["right lower lobe"], ph.zones["right lung base"])
    boxes = stages.detector.detect(image)
    assert boxes == stages.detector.detect(image)  # seeded by the study: repeatable
    assert all(0 <= d.box[0] < d.box[2] <= 128 and 0 <= d.confidence <= 1 for d in boxes)


def test_output_is_read_unchanged_by_the_mimic_ils_reader(built, phantoms):
    counts = {}
    for split in ("train", "val", "test"):
        res = read_mimic_ils(
            built / "ground-truth" / "mimic_ils.json",
            split=split,
            strict=True,
            kinds=("basic", "global", "lesion_inference"),
        )
        counts[split] = len(res.cases)
        for case in res.cases:
            image = np.asarray(Image.open(case.image_path))
            if case.positive:
                mask = case.load_mask()
                assert mask.shape == image.shape and mask.any()
    assert counts["train"] > 0 and sum(counts.values()) > 50
    summary = json.loads((built / "summary.json").read_text())
    assert summary["studies"] == 10 and summary["positive_pairs"] > 0
    anatomy = list((built / "ground-truth" / "anatomy").glob("*.png"))
    assert len(anatomy) == 10
    label = np.asarray(Image.open(anatomy[0]))
    assert set(np.unique(label)) <= set(range(10)) and 9 in label


def test_review_sheets_list_every_pair_and_finding(built):
    import csv

    pairs = list(csv.DictReader((built / "review" / "pairs.csv").open()))
    release = json.loads((built / "ground-truth" / "mimic_ils.json").read_text())
    n = sum(
        len(e["instruction_answer_pairs"][k])
        for s in release.values()
        for e in s.values()
        for k in ("positive_pairs", "negative_pairs")
    )
    assert len(pairs) == n and {"verdict", "comment", "instruction", "mask"} <= set(pairs[0])
    findings = list(csv.DictReader((built / "review" / "findings.csv").open()))
    assert findings and all(
        f["generated"] == "True" or f["reason"]
        for f in findings
        if f["present"] == "True" and f["finding"] != "cardiomegaly"
    )


def test_generated_masks_overlap_the_phantom_truth(built, phantoms):
    records = [json.loads(p.read_text()) for p in sorted((built / "work" / "studies").glob("*.json"))]
    ious = mask_iou_by_finding(phantoms, built, records)
    assert ious and all(0.0 <= v["mean_iou"] <= 1.0 for v in ious.values())
    assert max(v["mean_iou"] for v in ious.values()) > 0.3


def test_resume_redoes_nothing_and_shards_give_the_same_files(built, phantoms, tmp_path):
    inputs = truth_inputs(phantoms)
    seen = []
    run(
        inputs,
        PipelineConfig(built, None, phantoms, alg.HIGH_RECALL_THRESHOLDS),
        progress=lambda it: seen.extend(it) or seen,
    )
    assert seen == []  # every study already done
    out = tmp_path  # as deep as `built`, so the relative image paths are the same
    cfg = PipelineConfig(out, None, phantoms, alg.HIGH_RECALL_THRESHOLDS)
    first = run(inputs, cfg, shard=(0, 2))
    assert first["studies"] == 5
    run(inputs, cfg, shard=(1, 2))
    assert tree(out) == tree(built)


def test_dask_local_cluster_of_two_workers_gives_byte_identical_output(built, phantoms, tmp_path):
    from distributed import Client, LocalCluster

    out = tmp_path
    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        run(truth_inputs(phantoms), PipelineConfig(out, None, phantoms, alg.HIGH_RECALL_THRESHOLDS), scheduler=client)
        assert len(client.scheduler_info()["workers"]) == 2
    assert tree(out) == tree(built)


def test_recall_report_table8_layout_default_no_more_than_halved(phantoms, tmp_path, capsys):
    pytest.importorskip("medspacy", reason="medspaCy is not installed here: run `make setup`")
    assert main(["ils", "recall", "--images", str(phantoms), "--out", str(tmp_path)]) == 0
    figures = json.loads((tmp_path / "recall.json").read_text())
    assert set(figures["runs"]) == {"reports", "truth"}  # the set's reports.csv, structured, and the truth
    for src in ("reports", "truth"):
        default, halved = figures["runs"][src]["default"]["recall"], figures["runs"][src]["halved"]["recall"]
        assert default["mean"]["reported"] == halved["mean"]["reported"] > 0
        for f in ("atelectasis", "edema", "effusion", "mean"):
            assert default[f]["generated"] <= halved[f]["generated"]
        assert all(0 <= v["mean_iou"] <= 1 for v in figures["runs"][src]["halved"]["mask_iou"].values())
    # the structured reports state the lung findings the truth does (phantom reports are exact)
    rep, tru = figures["runs"]["reports"]["default"]["recall"], figures["runs"]["truth"]["default"]["recall"]
    assert {f: v["reported"] for f, v in rep.items()} == {f: v["reported"] for f, v in tru.items()}
    scores = figures["structuring"]["scores"]
    assert set(scores) == {"entity", "presence", "certainty", "location"} and scores["entity"]["true"] > 0
    text = (tmp_path / "recall.md").read_text()
    assert "| field | precision | recall | F1 |" in text
    assert (
        "| thresholds | findings from | pneumonia | atelectasis | opacity | consolidation | edema | effusion | mean |"
        in text
    )
    assert "| default | paper (MIMIC-CXR) |" in text and "28.3" in text
    assert main(["ils", "recall", "--images", str(tmp_path), "--out", str(tmp_path)]) == 2


def test_build_structures_the_phantom_reports_csv(phantoms, tmp_path, capsys):
    pytest.importorskip("medspacy", reason="medspaCy is not installed here: run `make setup`")
    out = tmp_path / "out"
    assert (
        main(["ils", "build", "--images", str(phantoms), "--reports", str(phantoms / "reports.csv"), "--out", str(out)])
        == 0
    )
    truth = {s.study: s for s in truth_inputs(phantoms)}
    records = {p.stem: json.loads(p.read_text()) for p in (out / "work" / "studies").glob("*.json")}
    assert set(records) == set(truth)
    sections = json.loads((phantoms / "ground-truth" / "report_findings.json").read_text())
    for study, rec in records.items():
        assert rec["entry"]["section_name"] == sections[study]["section_name"]  # the section the reader chose
        present = {f["finding"] for f in rec["findings"] if f["present"] and f["finding"]}
        assert present == {f.finding for f in truth[study].findings}
    read_mimic_ils(out / "ground-truth" / "mimic_ils.json", split="train", strict=True)
    assert (
        main(
            [
                "ils",
                "build",
                "--images",
                str(phantoms),
                "--reports",
                str(phantoms / "reports.csv"),
                "--out",
                str(tmp_path / "o2"),
                "--structurer",
                "llm",
            ]
        )
        == 2
    )
    assert "--llm-model" in capsys.readouterr().err


def test_xflow_eval_and_build_accept_the_output(built, tmp_path, capsys):
    spec = f"mimic-ils:{built / 'ground-truth' / 'mimic_ils.json'}"
    res = read_mimic_ils(built / "ground-truth" / "mimic_ils.json", split="train")
    preds = tmp_path / "preds"
    preds.mkdir()
    for case in res.cases:  # perfect predictions: the generated masks themselves
        mask = case.load_mask()
        if mask is None:
            shape = np.asarray(Image.open(case.image_path)).shape
            mask = np.zeros(shape, bool)
        Image.fromarray(np.where(mask, 255, 0).astype(np.uint8)).save(preds / f"{case.case_id}.png")
    assert (
        main(
            [
                "eval",
                "--dataset",
                spec,
                "--split",
                "train",
                "--predictions",
                str(preds),
                "--out",
                str(tmp_path / "eval"),
                "--no-plots",
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["n_scored"] == len(res.cases) and report["average"]["n_acc"] == 1.0
    assert main(["build", "init-sft", "--dataset", spec, "--out", str(tmp_path / "sft")]) == 0
    assert "init-sft:" in capsys.readouterr().out


def test_cli_build_on_phantoms_and_its_errors(phantoms, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["ils", "build", "--images", str(phantoms), "--reports", "phantom-truth", "--out", str(out)]) == 0
    assert "studies written" in capsys.readouterr().out
    assert (out / "ground-truth" / "mimic_ils.json").is_file()
    assert (
        main(
            ["ils", "build", "--images", str(phantoms), "--reports", "phantom-truth", "--out", str(out), "--shard", "x"]
        )
        == 2
    )
    plain = tmp_path / "plain"
    plain.mkdir()
    Image.fromarray(np.zeros((8, 8), np.uint8)).save(plain / "a.png")
    (tmp_path / "r.csv").write_text("study_id,image,report\ns1,a.png,FINDINGS: Clear lungs.\n")
    assert main(["ils", "build", "--images", str(plain), "--reports", str(tmp_path / "r.csv"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "anatomy" in err and "HybridGNet" in err


def test_stage_configuration_errors_name_the_stage(phantoms, tmp_path):
    with pytest.raises(StageError, match="'detector' .*YOLO"):
        load_stages({"anatomy": "phantom", "healthy": "phantom", "locations": "phantom"}, phantoms)
    with pytest.raises(StageError, match="'healthy' .*RadEdit.*cannot import"):
        load_stages(
            {"anatomy": "phantom", "healthy": "no_such_module:X", "locations": "phantom", "detector": "phantom"},
            phantoms,
        )
    with pytest.raises(StageError, match="'anatomy' .*lacks the method of AnatomyStage"):
        load_stages(
            {"anatomy": "collections:OrderedDict", "healthy": "phantom", "locations": "phantom", "detector": "phantom"},
            phantoms,
        )
    with pytest.raises(StageError, match="is 'phantom' but the images are not a phantom set"):
        load_stages({k: "phantom" for k in ("anatomy", "healthy", "locations", "detector")}, tmp_path)
    with pytest.raises(StageError, match="unknown stage key"):
        load_stages({"segmenter": "phantom"}, phantoms)
    yaml_file = tmp_path / "stages.yaml"
    yaml_file.write_text(
        "anatomy: phantom\nhealthy: phantom\nlocations: phantom\n"
        "detector: {class: test_ils_pipeline:OneBoxDetector, args: {confidence: 0.9}}\n"
    )
    stages = load_stages(yaml_file, phantoms)
    assert isinstance(stages.detector, OneBoxDetector) and stages.detector.confidence == 0.9


class OneBoxDetector:
    """A user's detector plugged in by configuration: one box over the right lower image."""

    def __init__(self, confidence: float = 0.5) -> None:
        self.confidence = confidence

    def detect(self, image: StudyImage) -> list[Detection]:
        h, w = image.pixels.shape
        return [
            Detection((0.1 * w, 0.5 * h, 0.5 * w, 0.9 * h), self.confidence, "consolidation"),
            Detection((0.0, 0.0, w / 2, h / 2), 0.99, "aortic enlargement"),
        ]  # dropped by class


def test_custom_detector_runs_in_the_pipeline(phantoms, tmp_path):
    config = {
        "anatomy": "phantom",
        "healthy": "phantom",
        "locations": "phantom",
        "detector": "test_ils_pipeline:OneBoxDetector",
    }
    inputs = truth_inputs(phantoms)[:2]
    summary = run(inputs, PipelineConfig(tmp_path, config, phantoms))
    assert summary["studies"] == 2
    rec = json.loads((tmp_path / "work" / "studies" / f"{inputs[0].study}.json").read_text())
    assert rec["detections"] == 1  # the aortic-enlargement box is not a lung lesion


def test_read_reports_and_bad_input(phantoms, tmp_path):
    table = tmp_path / "reports.csv"
    rec = json.loads((phantoms / "ground-truth" / "phantoms.json").read_text())
    table.write_text(
        "study_id,image,report,split\n"
        f"{rec[0]['study']},{rec[0]['image']},FINDINGS: Left base effusion.,test\n"
        f"s2,missing.png,FINDINGS: x,\n"
        f"s3,{rec[1]['image']},,\n"
    )

    def structure(text):
        return (
            [ReportedFinding("effusion", 1, True, False, ("left lung base",), "effusion")] if "effusion" in text else []
        )

    def choose(text):
        return ("findings", text.split(":", 1)[1].strip()) if ":" in text else None

    studies, skipped = read_reports(table, phantoms, structure, choose)
    assert [s.study for s in studies] == [rec[0]["study"]]
    assert studies[0].split == "test" and studies[0].section_content == "Left base effusion."
    assert studies[0].findings[0].finding == "effusion"
    assert len(skipped) == 2 and "missing.png" in skipped[0] and "no findings" in skipped[1]
    (tmp_path / "bad.csv").write_text("study_id,report\ns1,x\n")
    with pytest.raises(PipelineError, match="no image column"):
        read_reports(tmp_path / "bad.csv", phantoms, structure)
    with pytest.raises(PipelineError, match="study ids repeat"):
        run([studies[0], studies[0]], PipelineConfig(tmp_path / "o", None, phantoms))
    broken = StudyInput("s9", tmp_path / "bad.csv", ())
    summary = run([broken], PipelineConfig(tmp_path / "o2", None, phantoms))
    assert summary["errors"] == 1  # an unreadable image is recorded, the run goes on
    assert isinstance(PhantomSet(phantoms).records, dict)


def test_read_reports_skips_repeated_studies_and_unstructurable_reports(phantoms, tmp_path):
    from types import SimpleNamespace

    rec = json.loads((phantoms / "ground-truth" / "phantoms.json").read_text())
    table = tmp_path / "reports.csv"
    table.write_text(
        "study_id,image_path,report\n"
        f"a1,{rec[0]['image']},FINDINGS: fine\n"
        f"a1,{rec[1]['image']},FINDINGS: fine\n"  # a second image of study a1
        f"a2,{rec[2]['image']},\n"
        f"a3,{rec[3]['image']},FINDINGS: garbled\n"
    )

    def choose(text):  # like report.choose_section: an object with name/text, ValueError when empty
        if not text.strip():
            raise ValueError("no findings, impression or last paragraph: the report has no text")
        return SimpleNamespace(name="findings", text=text.split(":", 1)[1].strip())

    def structure(text):
        if text == "garbled":
            raise ValueError("the answer holds no JSON array")
        return []

    studies, skipped = read_reports(table, phantoms, structure, choose)
    assert [(s.study, s.section_name, s.section_content) for s in studies] == [("a1", "findings", "fine")]
    assert studies[0].image == phantoms / rec[0]["image"]
    assert len(skipped) == 3
    assert "already has an image" in skipped[0] and "has no text" in skipped[1] and "no JSON array" in skipped[2]


# --- an audit's findings: stale resume records, failures never retried, colliding names, rows
# swallowed by an unclosed quote ----------------------------------------------------------------


def test_resume_redoes_a_study_whose_inputs_changed_and_retries_failures(built, phantoms, tmp_path):
    """Any record counted as done before: a study moved to another split stayed in the first one
    (train/test leakage), and a study whose image failed once was never tried again."""
    import dataclasses
    import shutil

    inputs = truth_inputs(phantoms)[:3]
    cfg = PipelineConfig(tmp_path, None, phantoms, alg.HIGH_RECALL_THRESHOLDS)
    assert {inp.split for inp in inputs} == {"train"}
    run(inputs, cfg)
    moved = [dataclasses.replace(inp, split="test") if k == 1 else inp for k, inp in enumerate(inputs)]
    seen: list = []
    run(moved, cfg, progress=lambda it: seen.extend(it) or seen)
    assert [s.study for s in seen] == [inputs[1].study]  # only the changed one is redone
    release = json.loads((tmp_path / "ground-truth" / "mimic_ils.json").read_text())
    assert set(release["test"]) == {inputs[1].study} and inputs[1].study not in release["train"]
    again = run(moved, dataclasses.replace(cfg, thresholds=alg.DEFAULT_THRESHOLDS), progress=lambda it: list(it))
    assert again["studies"] == 3  # other thresholds: every record redone, none merged stale

    copy = tmp_path / "set"
    shutil.copytree(phantoms, copy)
    study = truth_inputs(copy)[0]
    good = study.image.read_bytes()
    study.image.write_text("not an image")
    out, cfg2 = tmp_path / "o2", PipelineConfig(tmp_path / "o2", None, copy)
    first = run([study], cfg2)
    assert first["errors"] == 1 and list(first["failed"]) == [study.study]
    tried: list = []
    run([study], cfg2, progress=lambda it: tried.extend(it) or tried)
    assert [s.study for s in tried] == [study.study]  # the same inputs, but a failure is tried again
    study.image.write_bytes(good)  # fixed, as the user is told to
    fixed = run([study], cfg2)
    assert fixed["errors"] == 0 and fixed["written"] == 1
    assert "error" not in json.loads((out / "work" / "studies" / f"{study.study}.json").read_text())


def test_anatomy_maps_are_named_by_study_and_read_back_by_dicom_id(built, tmp_path):
    """Named by image file name before: <study>/frontal.png of two studies was one map, and one
    study trained on the other's lung boxes."""
    from monailabel_xflow.training.builders import LungBoxes

    release = json.loads((built / "ground-truth" / "mimic_ils.json").read_text())
    entries = {s: e for split in release.values() for s, e in split.items()}
    maps = {p.stem for p in (built / "ground-truth" / "anatomy").glob("*.png")}
    assert maps == set(entries) and all(e["dicom_id"] == s for s, e in entries.items())
    lungs = LungBoxes.for_spec(f"mimic-ils:{built / 'ground-truth' / 'mimic_ils.json'}")
    study, entry = next(iter(entries.items()))
    boxes = lungs(built / entry["image_path"], entry["dicom_id"])
    assert set(boxes) == {"right lung", "left lung"}
    assert lungs(built / entry["image_path"]) == {}  # by file name there is no map: it is the study's


def test_read_reports_names_swallowed_rows_colliding_ids_and_long_reports(phantoms, tmp_path):
    rec = json.loads((phantoms / "ground-truth" / "phantoms.json").read_text())
    table = tmp_path / "reports.csv"
    table.write_text(
        "study_id,image_path,report\n"
        f'q1,{rec[0]["image"]},"FINDINGS: Right lower lobe opacity.\n'  # the quote is never closed
        f"q2,{rec[1]['image']},FINDINGS: No effusion.\n"
    )
    studies, skipped = read_reports(table, phantoms, lambda text: [])
    assert studies == [] and "an unclosed quote?" in skipped[0] and "q2," in skipped[0]
    table.write_text(
        "study_id,image_path,report\n"
        f"a/b,{rec[0]['image']},FINDINGS: fine\n"
        f"a_b,{rec[1]['image']},FINDINGS: fine\n"
        f",{rec[2]['image']},FINDINGS: fine\n"
        f"big,{rec[3]['image']},FINDINGS: {'x' * 130_000}\n"
    )
    studies, skipped = read_reports(table, phantoms, lambda text: [])
    assert [s.study for s in studies] == ["a_b"]
    assert "names the same files as 'a/b'" in skipped[0] and "no study id" in skipped[1]
    assert "report of 130,010 characters; at most 20,000 are read" in skipped[2]


def test_cli_build_refuses_bad_options_before_any_work(phantoms, tmp_path, capsys):
    plain = tmp_path / "imgs"
    plain.mkdir()
    (plain / "junk.png").write_text("not an image")
    (tmp_path / "r.csv").write_text("study_id,image,report\ns1,junk.png,FINDINGS: Clear lungs.\n")
    (tmp_path / "afile").write_text("")
    base = ["ils", "build", "--images", str(plain), "--reports", str(tmp_path / "r.csv")]
    for extra, says in (
        (["--out", str(tmp_path / "afile")], "is a file"),
        (["--out", str(tmp_path / "o"), "--dask", "local:0"], "--dask local:N needs N in 1..256"),
        (["--out", str(tmp_path / "o"), "--dask", "local:abc"], "--dask local:N needs N in 1..256"),
    ):
        assert main([*base, *extra]) == 2
        assert says in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--out", str(tmp_path / "o"), "--workers", "0"])
    assert "--workers" in capsys.readouterr().err
