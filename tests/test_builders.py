"""Data builders: phrasings, Stage 1 targets, resumable sharded builds, oracle trajectories."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.data.readers import read_mimic_ils
from monailabel_xflow.geometry import lesion_boxes
from monailabel_xflow.instructions import Instruction, parse_instruction, phrasings
from monailabel_xflow.policy.protocol import parse_stage1, parse_stage2
from monailabel_xflow.policy.targets import BuildError, init_target
from monailabel_xflow.training.builders import LungBoxes, build, load_built
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS

SAMPLE = Path(__file__).resolve().parents[1] / "sample-data"


@pytest.fixture(scope="module")
def cases():
    result = read_mimic_ils(
        SAMPLE / "ground-truth" / "mimic_ils.json", split="train", kinds=("basic", "global", "lesion_inference")
    )
    assert result.cases and not result.problems
    return result.cases


def test_every_phrasing_parses_back():
    instructions = [Instruction(f, (), "global") for f in FINDINGS]
    instructions += [Instruction(f, (r,)) for f in FINDINGS if f != "cardiomegaly" for r in LUNGS + ALL_ZONES]
    instructions += [Instruction("opacity", (r,), "lesion_inference") for r in LUNGS + ALL_ZONES]
    assert [p for ins in instructions for p in phrasings(ins) if parse_instruction(p) != ins] == []
    assert len(set(phrasings(Instruction("edema", ("left lung",))))) == 5


def test_lesion_boxes_one_per_component_and_specks_skipped():
    mask = np.zeros((100, 200), bool)
    mask[10:30, 20:60] = True
    mask[60:90, 150:190] = True
    mask[95, 5] = True  # a one-pixel speck
    boxes = lesion_boxes(mask)
    assert sorted(boxes) == sorted([(0.1, 0.1, 0.3, 0.3), (0.75, 0.6, 0.95, 0.9)])
    assert lesion_boxes(None) == [] and lesion_boxes(np.zeros((4, 4), bool)) == []


def test_init_target_round_trips_through_the_protocol():
    ins = Instruction("effusion", ("left lung base",))
    mask = np.zeros((100, 100), bool)
    mask[70:90, 60:90] = True
    lungs = {"left lung": (0.55, 0.1, 0.95, 0.92), "right lung": (0.05, 0.1, 0.45, 0.92)}
    parsed = parse_stage1(init_target(ins, mask, lungs))
    assert parsed.ok, parsed.problems
    assert [b.label for b in parsed.value.lungs] == ["left lung"]  # only the side asked about
    assert parsed.value.present is True
    assert [b.box for b in parsed.value.lesions] == [(0.6, 0.7, 0.9, 0.9)]
    negative = parse_stage1(init_target(Instruction("edema", (), "global"), None, lungs))
    assert negative.ok and negative.value.present is False and len(negative.value.lungs) == 2
    with pytest.raises(BuildError, match="no box for left lung"):
        init_target(ins, mask, {"right lung": lungs["right lung"]})


def test_lung_boxes_from_phantom_anatomy(cases):
    boxes = LungBoxes.for_dataset(SAMPLE)(cases[0].image_path)
    assert set(boxes) == set(LUNGS)
    # Patient-left lung on the image right.
    assert boxes["left lung"][0] > boxes["right lung"][0]


def test_init_sft_build_resumes_and_shards(cases, tmp_path):
    subset = cases[:40]
    lungs = LungBoxes.for_dataset(SAMPLE)
    report = build("init-sft", subset, tmp_path / "a", lung_boxes=lungs, chunk_size=16, progress=False)
    assert report.rows == 40 and report.chunks_written == 3 and not report.rejected
    ds = load_built(tmp_path / "a")
    row = ds[0]
    case = subset[0]
    assert parse_instruction(row["prompt"]) == case.instruction
    assert row["instruction"] == case.instruction.text
    assert parse_stage1(row["target"]).ok
    assert row["positive"] == (row["lesion_mask"] is not None) == case.positive
    # Resuming rewrites nothing and yields the same rows.
    again = build("init-sft", subset, tmp_path / "a", lung_boxes=lungs, chunk_size=16, progress=False)
    assert again.chunks_written == 0 and again.chunks_reused == 3 and again.rows == 40
    assert load_built(tmp_path / "a")["target"] == ds["target"]
    # Two shards cover the cases exactly once.
    for i in range(2):
        build("init-sft", subset, tmp_path / "b", lung_boxes=lungs, shard=(i, 2), chunk_size=16, progress=False)
    assert sorted(load_built(tmp_path / "b")["case_id"]) == sorted(ds["case_id"])


def test_init_sft_rows_carry_every_lesion_of_each_finding(cases, tmp_path):
    """finding_masks: per image and finding, the union of every positive question's mask."""
    from PIL import Image

    build("init-sft", cases, tmp_path, lung_boxes=LungBoxes.for_dataset(SAMPLE), progress=False)
    rows = load_built(tmp_path)
    by_case = {c.case_id: c for c in cases}
    checked = 0
    for row in rows:
        assert len(row["finding_masks"]) == len(FINDINGS)
        case = by_case[row["case_id"]]
        if case.finding not in FINDINGS:  # lesion-inference "opacity" questions
            continue
        union_png = row["finding_masks"][FINDINGS.index(case.finding)]
        if not case.positive:
            continue
        union = np.asarray(Image.open(union_png)) > 127
        mask = case.load_mask() > 0
        assert not (mask & ~union).any()  # the question's lesions are all in the finding's channel
        if case.level == "chest":  # "segment the effusion": its mask is the whole channel
            assert (mask == union).all()
        checked += 1
    assert checked > 20
    # A finding that no question about an image calls present has no mask for that image.
    present: dict[Path, set[str]] = {}
    for c in cases:
        present.setdefault(c.image_path, set()).update({c.finding} if c.positive else set())
    for row in rows:
        have = {f for f, png in zip(FINDINGS, row["finding_masks"], strict=True) if png}
        assert have == present[by_case[row["case_id"]].image_path] & set(FINDINGS)


def test_bad_builds_are_refused(cases, tmp_path):
    with pytest.raises(BuildError, match="unknown kind"):
        build("init-dpo", cases, tmp_path)
    with pytest.raises(BuildError, match="shard"):
        build("init-rl", cases, tmp_path, shard=(2, 2))
    with pytest.raises(BuildError, match="lung boxes"):
        build("init-sft", cases, tmp_path)
    with pytest.raises(BuildError, match="segmenter"):
        build("rev-sft", cases, tmp_path)


def test_init_rl_rows_carry_boxes_and_presence(cases, tmp_path):
    build("init-rl", cases[:20], tmp_path, progress=False)
    ds = load_built(tmp_path)
    for row, case in zip(ds, cases[:20], strict=False):
        assert row["present"] == case.positive == bool(row["gt_boxes"])


def _one_component_case(cases):
    for case in cases:
        mask = case.load_mask()
        if mask is not None and len(lesion_boxes(mask)) == 1:
            return case, mask
    pytest.fail("sample-data has no single-component positive")


def test_rev_sft_trajectories_with_a_test_double(cases, tmp_path):
    from monailabel_xflow.testing import ScriptedSegmenter

    case, mask = _one_component_case(cases)
    report = build("rev-sft", [case], tmp_path, segmenter=ScriptedSegmenter(mask), progress=False)
    ds = load_built(tmp_path) if report.rows else None
    if ds is None:  # the double's first mask may already pass τ: then the sole turn is a stop
        pytest.fail(f"no trajectory kept: {report.rejected}")
    row = ds[0]
    assert len(row["observations"]) == len(row["targets"]) >= 1
    actions = [parse_stage2(t) for t in row["targets"]]
    assert all(a.ok for a in actions)
    assert actions[-1].value.stop or len(actions) == 4
    assert all(Path(p).is_file() for p in row["observations"])
    # one error map per observation, at its size: red missed, green spilled (training targets only)
    assert len(row["error_masks"]) == len(row["observations"])
    first = np.asarray(Image.open(row["error_masks"][0]))
    assert first.shape == np.asarray(Image.open(row["observations"][0])).shape
    assert (first[..., 0] > 0).sum() + (first[..., 1] > 0).sum() > 0  # the first mask is not yet the truth


def test_rev_builds_with_tiny_sam3(cases, tiny_sam3, tmp_path):
    from monailabel_xflow.segmenter.loading import load_segmenter

    positives = [c for c in cases if c.positive][:2]
    seg = load_segmenter(str(tiny_sam3))
    report = build("rev-sft", positives, tmp_path / "rev", segmenter=seg, progress=False)
    n_components = sum(len(lesion_boxes(c.load_mask())) for c in positives)
    discarded = report.rejected.get("trajectory discarded (no IoU gain)", 0)
    assert report.rows + discarded == n_components
    rl = build("rev-rl", positives, tmp_path / "rl", progress=False)
    assert rl.rows == n_components
    row = load_built(tmp_path / "rl")[0]
    assert Path(row["gt_mask"]).is_file() and len(row["start_box"]) == 4


def test_build_command(tmp_path, capsys):
    from monailabel_xflow.cli import main

    spec = f"mimic-ils:{SAMPLE / 'ground-truth' / 'mimic_ils.json'}"
    assert main(["build", "init-sft", "--dataset", spec, "--out", str(tmp_path), "--shard", "1/3"]) == 0
    assert "init-sft:" in capsys.readouterr().out
    assert len(load_built(tmp_path)) > 0
    assert main(["build", "init-sft", "--dataset", spec, "--out", str(tmp_path), "--shard", "x"]) == 2
    assert main(["build", "rev-sft", "--dataset", spec, "--out", str(tmp_path)]) == 2
    assert "segmenter" in capsys.readouterr().err
