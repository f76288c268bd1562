"""Location verification, CTR, QC and the instruction/answer rules (monailabel_xflow/ils/pairs.py).

Scene (24 x 24): each lung is 4 zones of 4 rows (rows 2..17), right lung columns 2..9, left lung
columns 14..21; the heart columns 10..13, rows 12..19.
"""

from __future__ import annotations

import numpy as np
import pytest

from monailabel_xflow.data.mimic_ils import ReportedFinding
from monailabel_xflow.data.readers import read_mimic_ils  # noqa: F401  (the reader the pairs are for)
from monailabel_xflow.ils import pairs as rules
from monailabel_xflow.ils.pairs import FindingOutcome
from monailabel_xflow.instructions import parse_instruction
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS, ZONES

N = 24


def rect(r0, r1, c0, c1):
    m = np.zeros((N, N), bool)
    m[r0 : r1 + 1, c0 : c1 + 1] = True
    return m


def scene():
    masks = {"right lung": rect(2, 17, 2, 9), "left lung": rect(2, 17, 14, 21)}
    for lung, (c0, c1) in (("right lung", (2, 9)), ("left lung", (14, 21))):
        for k, zone in enumerate(ZONES[lung]):
            masks[zone] = rect(2 + 4 * k, 5 + 4 * k, c0, c1)
    masks["right lower lobe"] = masks["right lung base"]
    masks["left upper lobe"] = rect(2, 13, 14, 21)
    return masks


MASKS = scene()
HEART = rect(12, 19, 10, 13)


def rf(finding, locations=(), present=True, tentative=False, sentence=1):
    return ReportedFinding(finding or "nodule", sentence, present, tentative, tuple(locations), finding)


def test_reported_labels():
    assert rules.reported_labels(rf("edema")) == LUNGS  # a lung finding without location: both lungs
    assert rules.reported_labels(rf("effusion", ["pleura"])) == LUNGS  # outside the lungs only
    assert rules.reported_labels(rf("atelectasis", ["lung"])) == LUNGS
    assert rules.reported_labels(rf("atelectasis", ["right lung base", "left lung base", "rib"])) == (
        "right lung base",
        "left lung base",
    )
    assert rules.reported_labels(rf("pneumonia", ["right lower lobe"])) == ("right lower lobe",)
    assert rules.reported_labels(rf("cardiomegaly", ["heart"])) == ()


def test_grounded_is_the_reported_labels_the_mask_overlaps():
    lesion = rect(14, 16, 3, 6)  # right lung base only
    reported = ("right lung base", "left lung base")
    assert rules.grounded_labels(reported, MASKS, lesion) == ("right lung base",)
    assert rules.grounded_labels(reported, MASKS, np.zeros((N, N), bool)) == ()
    assert rules.grounded_labels(("right lower lobe", "unknown"), MASKS, lesion) == ("right lower lobe",)


def test_instruction_regions_turn_lobes_into_zones_and_drop_zones_of_grounded_lungs():
    lesion = rect(7, 11, 15, 18)  # left upper and mid zones, inside the left upper lobe
    assert rules.instruction_regions(("left upper lobe",), MASKS, lesion) == (
        "left upper zone lung",
        "left mid zone lung",
    )
    assert rules.instruction_regions(("left lung", "left mid zone lung"), MASKS, lesion) == ("left lung",)
    assert rules.instruction_regions(("left lung base", "right lung base"), MASKS, lesion) == (
        "right lung base",
        "left lung base",
    )  # vocabulary order


def test_empty_regions_overlap_nothing_reported():
    occupied = MASKS["right lung base"] | MASKS["left lung base"]
    assert rules.empty_regions(occupied, MASKS) == tuple(z for z in ALL_ZONES if not z.endswith("base"))
    assert rules.empty_regions(np.zeros((N, N), bool), MASKS) == LUNGS + ALL_ZONES
    assert rules.empty_regions(MASKS["right lung"], MASKS) == ("left lung",) + ZONES["left lung"]


def test_ctr_and_the_cardiomegaly_negative_rule():
    # thorax: columns 2..21 = 20 px
    assert rules.ctr(MASKS["right lung"], MASKS["left lung"], rect(12, 19, 10, 15)) == pytest.approx(6 / 20)
    ratio = rules.ctr(MASKS["right lung"], MASKS["left lung"], rect(12, 19, 8, 16))
    assert ratio == pytest.approx(9 / 20) and rules.cardiomegaly_negative_allowed(ratio)  # 0.45 itself
    ratio = rules.ctr(MASKS["right lung"], MASKS["left lung"], rect(12, 19, 8, 17))
    assert ratio == pytest.approx(0.5) and not rules.cardiomegaly_negative_allowed(ratio)
    assert rules.ctr(MASKS["right lung"], np.zeros((N, N), bool), HEART) is None
    assert not rules.cardiomegaly_negative_allowed(None)


def test_anatomy_cross_check():
    first = {"right lung": MASKS["right lung"], "left lung": MASKS["left lung"], "heart": HEART}
    assert rules.anatomy_disagreement(first, dict(first)) == []
    # one column off = 1/24 = 4 % of the width: within 5 %
    assert rules.anatomy_disagreement(first, {**first, "right lung": rect(2, 17, 3, 9)}) == []
    moved = {**first, "left lung": rect(2, 17, 14, 19), "heart": rect(12, 21, 10, 13)}
    assert rules.anatomy_disagreement(first, moved) == [
        "left lung: outermost column 21 vs 19",
        "heart: lowest row 19 vs 21",
    ]
    assert rules.anatomy_disagreement(first, {k: v for k, v in first.items() if k != "heart"}) == [
        "heart: missing in one anatomy model"
    ]


def outcome(f, mask=None, grounded=()):
    return FindingOutcome(f, rules.reported_labels(f), tuple(grounded), mask)


def by_instruction(pairs):
    return {p["instruction"]: p for p in pairs.positive + pairs.negative}


def assert_readable(pairs):
    """Every pair reads back as the XFlow instruction of its type, with the canonical answer."""
    for p in pairs.positive + pairs.negative:
        ins = parse_instruction(p["instruction"])
        assert ins.kind == p["type"] and ins.text == p["instruction"]
        if not p["seg"]:
            assert p["answer"] == ins.absent_answer()


def test_bibasilar_atelectasis_grounded_on_one_side():
    f = rf("atelectasis", ["right lung base", "left lung base"])
    lesion = rect(14, 16, 3, 6)
    pairs = rules.study_pairs(
        "s1", [outcome(f, lesion, ("right lung base",))], MASKS, HEART, 0.4, np.random.default_rng(0)
    )
    got = by_instruction(pairs)
    basic = got["Segment the atelectasis in the right lung base."]
    assert basic["seg"] and basic["answer"] == "" and basic["seg_mask_path"] == "s1/finding0_atelectasis.png"
    assert basic["location"] == ["right lung base"] and basic["sent_idx"] == 0
    assert "Segment the atelectasis." not in got  # grounded != reported: no global
    li = got["Segment the opacity in the right lung base and predict its type."]
    assert li["seg"] and li["answer"] == "It is highly suggestive of atelectasis."
    assert np.array_equal(pairs.masks["s1/finding0_atelectasis.png"], lesion)
    assert [p["pair_id"] for p in pairs.positive + pairs.negative] == [
        f"s1_{i:03d}" for i in range(len(pairs.positive) + len(pairs.negative))
    ]
    assert_readable(pairs)


def test_global_only_when_grounded_equals_reported_and_tentative_becomes_opacity():
    definite = rf("effusion", ["left lung base"])
    lesion = rect(14, 17, 15, 20)
    pairs = rules.study_pairs(
        "s2", [outcome(definite, lesion, ("left lung base",))], MASKS, HEART, 0.4, np.random.default_rng(0)
    )
    got = by_instruction(pairs)
    assert got["Segment the effusion."]["answer"] == "It is located in the left lung base."
    assert got["Segment the effusion in the left lung base."]["seg"]
    assert not any(p["type"] == "lesion_inference" and p["seg"] for p in pairs.positive)  # effusion: none

    tentative = rf("pneumonia", ["left lung base"], tentative=True)
    pairs = rules.study_pairs(
        "s3", [outcome(tentative, lesion, ("left lung base",))], MASKS, HEART, 0.4, np.random.default_rng(0)
    )
    got = by_instruction(pairs)
    assert got["Segment the opacity in the left lung base."]["seg"]
    assert got["Segment the opacity in the left lung base."]["target"] == "opacity"
    assert "Segment the pneumonia in the left lung base." not in got
    assert "Segment the opacity." not in got and "Segment the pneumonia." not in got
    li = got["Segment the opacity in the left lung base and predict its type."]
    assert li["answer"] == "It possibly reflects pneumonia." and li["target"] == "pneumonia"
    assert_readable(pairs)


def test_negatives_one_per_absent_type_substitution_and_cardiomegaly_rule():
    f = rf("atelectasis", ["right lung base"])
    lesion = rect(14, 16, 3, 6)
    outcomes = [outcome(f, lesion, ("right lung base",)), outcome(rf("effusion", present=False))]
    for ratio, cardio_negative in ((0.40, True), (0.45, True), (0.46, False), (None, False)):
        pairs = rules.study_pairs("s4", outcomes, MASKS, HEART, ratio, np.random.default_rng(1))
        assert_readable(pairs)
        targets = [p["target"] for p in pairs.negative if p["type"] != "lesion_inference"]
        absent = [t for t in FINDINGS if t != "atelectasis" and (t != "cardiomegaly" or cardio_negative)]
        # one negative per absent type (negated effusion included), plus one substitution for atelectasis
        assert sorted(targets) == sorted(absent + ["atelectasis"])
        sub = next(p for p in pairs.negative if p["target"] == "atelectasis")
        assert sub["type"] == "basic" and sub["location"][0] in rules.empty_regions(MASKS["right lung base"], MASKS)
        assert sub["answer"] == f"There is no atelectasis in the {sub['location'][0]}."
        # atelectasis is opacity-like: the opacity negative lies in an empty region, never global
        op = next(p for p in pairs.negative if p["target"] == "opacity")
        assert op["type"] == "basic" and op["location"][0] != "right lung base" and op["location"][0] != "right lung"
        li = [p for p in pairs.negative if p["type"] == "lesion_inference"]
        assert len(li) == 1 and li[0]["answer"] == f"There is no opacity in the {li[0]['location'][0]}."


def test_no_location_means_no_empty_region_and_unmasked_findings_give_no_positive():
    edema = rf("edema")  # both lungs reported: nothing is empty
    pairs = rules.study_pairs("s5", [outcome(edema)], MASKS, HEART, 0.4, np.random.default_rng(0))
    assert pairs.positive == []
    assert not any(p["type"] == "lesion_inference" for p in pairs.negative)
    assert not any(p["target"] == "edema" for p in pairs.negative)  # present, just not masked
    assert not any(p["target"] == "opacity" for p in pairs.negative)  # every region is occupied
    assert_readable(pairs)


def test_cardiomegaly_positive_is_global_with_the_heart_and_no_negative():
    cardio = rf("cardiomegaly", ["heart"])
    pairs = rules.study_pairs("s6", [outcome(cardio, HEART, ("heart",))], MASKS, HEART, 0.6, np.random.default_rng(0))
    got = by_instruction(pairs)
    pos = got["Segment the cardiomegaly."]
    assert pos["seg"] and pos["answer"] == "It is located in the heart." and pos["type"] == "global"
    assert np.array_equal(pairs.masks[pos["seg_mask_path"]], HEART)
    assert not any(p["target"] == "cardiomegaly" for p in pairs.negative)


def test_global_refused_when_another_finding_answers_the_same_target():
    op = rf("opacity", ["right lung base"])
    pn = rf("pneumonia", ["left lung base"], sentence=2)
    outs = [
        outcome(op, rect(14, 16, 3, 6), ("right lung base",)),
        outcome(pn, rect(14, 16, 15, 18), ("left lung base",)),
    ]
    got = by_instruction(rules.study_pairs("s7", outs, MASKS, HEART, 0.4, np.random.default_rng(0)))
    assert "Segment the opacity." not in got  # the pneumonia is an opacity too
    assert got["Segment the pneumonia."]["answer"] == "It is located in the left lung base."
    assert got["Segment the pneumonia in the left lung base."]["sent_idx"] == 1
