"""CheXpercept construction: three-source agreement, questions and the patient-level split."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from monailabel_xflow.data.chexpercept import (
    CHEST,
    CheXperceptError,
    SplitItem,
    agree,
    default_strata,
    patient_split,
    questions,
    verdicts_from_zones,
)


def test_verdicts_from_zones_expand_to_lungs_and_chest():
    v = verdicts_from_zones("img", "effusion", ["left lung base"])
    assert len(v) == 1 + 2 + 8
    assert v[("img", "effusion", CHEST)] is True
    assert v[("img", "effusion", "left lung")] is True and v[("img", "effusion", "right lung")] is False
    assert v[("img", "effusion", "left lung base")] is True and v[("img", "effusion", "left mid zone lung")] is False
    whole = verdicts_from_zones("img", "edema", ["right lung"])
    assert (
        sum(
            whole[("img", "edema", z)]
            for z in ("right apical zone lung", "right upper zone lung", "right mid zone lung", "right lung base")
        )
        == 4
    )
    assert verdicts_from_zones("img", "cardiomegaly", [], present=True) == {("img", "cardiomegaly", CHEST): True}
    absent = verdicts_from_zones("img", "edema", [])
    assert not any(absent.values())
    with pytest.raises(CheXperceptError):
        verdicts_from_zones("img", "edema", ["heart"])


def test_agreement_keeps_only_unanimous_triples():
    t1, t2, t3, t4 = (("i", "edema", r) for r in (CHEST, "left lung", "right lung", "left lung base"))
    sources = {
        "chexpercept": {t1: True, t2: True, t3: False, t4: True},
        "report": {t1: True, t2: True, t3: True, t4: True},
        "imagenome": {t1: True, t2: True, t3: False},  # silent about t4
    }
    result = agree(sources)
    assert result.admitted == {t1: True, t2: True}
    assert result.dropped[t3].startswith("disagree") and "report=present" in result.dropped[t3]
    assert result.dropped[t4] == "missing in imagenome"
    assert result.images() == {"i"}
    # agreement on "absent" is admitted as a negative
    neg = agree({"a": {t3: False}, "b": {t3: False}, "c": {t3: False}})
    assert neg.admitted == {t3: False}
    with pytest.raises(CheXperceptError):
        agree({})


def test_questions_per_level():
    admitted = verdicts_from_zones("img", "effusion", ["left lung base", "left mid zone lung"])
    admitted.update(verdicts_from_zones("img", "cardiomegaly", [], present=False))
    qs = questions(admitted)
    texts = {(q.instruction.text, q.positive) for q in qs}
    assert ("Segment the effusion.", True) in texts
    assert ("Segment the effusion in the left lung.", True) in texts
    assert ("Segment the effusion in the right lung.", False) in texts
    assert ("Segment the effusion in the left mid zone lung and left lung base.", True) in texts
    assert ("Segment the cardiomegaly.", False) in texts
    levels = Counter((q.level, q.positive) for q in qs)
    # zone negatives: 4 right + 2 empty left zones; one merged zone positive
    assert levels[("zone", False)] == 6 and levels[("zone", True)] == 1
    assert levels[("lung", True)] == 1 and levels[("lung", False)] == 1
    # a lung whose zones are not all admitted gets no zone-level positive
    partial = dict(admitted)
    del partial[("img", "effusion", "left apical zone lung")]
    assert not any(q.level == "zone" and q.positive for q in questions(partial))
    # all four zones of a lung present: that is the lung question, not repeated at zone level
    whole = verdicts_from_zones("img", "edema", ["right lung"])
    assert not any(q.level == "zone" and q.positive for q in questions(whole))


def test_default_strata():
    admitted = verdicts_from_zones("a", "effusion", ["left lung base"])
    admitted.update(verdicts_from_zones("a", "edema", ["left lung", "right lung"]))
    admitted.update(verdicts_from_zones("b", "edema", []))
    strata = default_strata(admitted)
    assert sorted(strata["a"]) == ["positive:edema", "positive:effusion", "unilateral"]
    assert strata["b"] == []


def make_cohort(seed=0):
    """~1,500 patients, some with several radiographs; rare strata as in the paper."""
    rng = np.random.default_rng(seed)
    items = []
    n = 0
    for p in range(1500):
        for _ in range(1 if rng.random() > 0.15 else int(rng.integers(2, 5))):
            strata = []
            if rng.random() < 0.05:
                strata.append("unilateral")
            if rng.random() < 0.01:
                strata.append("positive:pneumonia")
            if rng.random() < 0.3:
                strata.append("positive:effusion")
            items.append(SplitItem(f"img{n}", f"pat{p}", strata))
            n += 1
    return items


def test_patient_split_respects_patients_ratio_and_scarce_strata():
    items = make_cohort()
    result = patient_split(items, {"rl": 0.7, "eval": 0.3})
    # no patient on both sides
    sides = {}
    for it in items:
        sides.setdefault(it.patient_id, set()).add(result.assignment[it.image_id])
    assert all(len(s) == 1 for s in sides.values())
    # overall ratio near the target
    assert result.share("rl") == pytest.approx(0.7, abs=0.02)
    # every stratum divided near the ratio, the rare ones included
    for stratum in ("unilateral", "positive:pneumonia", "positive:effusion"):
        total = result.totals[stratum]
        assert total >= 10
        assert result.share("eval", stratum) == pytest.approx(0.3, abs=max(0.05, 2.5 / total)), stratum
    assert sum(result.counts[s]["radiographs"] for s in ("rl", "eval")) == len(items)


def test_scarce_stratum_is_divided_not_stranded():
    # 10 patients carry the rare stratum; ordering by id would put them all first on one side
    items = [SplitItem(f"r{k}", f"rare{k}", ["unilateral"]) for k in range(10)]
    items += [SplitItem(f"c{k}", f"common{k}") for k in range(90)]
    result = patient_split(items, {"rl": 0.7, "eval": 0.3})
    assert result.counts["rl"]["unilateral"] == 7 and result.counts["eval"]["unilateral"] == 3
    assert result.counts["eval"]["radiographs"] == 30


def test_split_is_deterministic_and_validates():
    items = make_cohort(1)[:300]
    assert patient_split(items, seed=3).assignment == patient_split(items, seed=3).assignment
    with pytest.raises(CheXperceptError):
        patient_split(items + items[:1])
    with pytest.raises(CheXperceptError):
        patient_split(items, {"rl": 1.0, "eval": 0.0})
