"""The phantom question set cannot be answered from its wording (issue 35).

Negatives ask positives' exact questions of other phantoms (``data/export.py``), so the
question-only baseline and a classifier on the question text alone are at chance at every level;
the audit (``eval/text_shortcut.py``) is shown to catch the shortcut the old rule had.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from monailabel_xflow.data.export import GT_DIR, JSON_NAME, NEGATIVES_PER_POSITIVE, export_set
from monailabel_xflow.data.readers import read_mimic_ils
from monailabel_xflow.eval.text_shortcut import (
    question_only_accuracy,
    text_balance,
    text_classifier_accuracy,
    text_shortcut_audit,
)
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.training.demo_data import export_heldout, training_cases


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("fair")
    release, phantoms = export_set(out, 24, seed=11, size=128)
    assert json.loads((out / GT_DIR / JSON_NAME).read_text()) == json.loads(json.dumps(release))
    return release, phantoms


def _instruction(pair) -> Instruction:
    regions = () if pair["type"] == "global" else tuple(pair["location"])
    finding = "opacity" if pair["type"] == "lesion_inference" else pair["target"]
    return Instruction(finding, regions, pair["type"])


def _absent(ph, ins: Instruction) -> bool:
    """Whether ``ins`` is truly answered "absent" on ``ph``, read off its masks."""
    if ins.kind == "global":
        return not ph.finding_mask(ins.finding).any()
    if ins.kind == "lesion_inference":  # no lesion of any finding in the named zones
        return not any((les.mask & ph.zones[z]).any() for les in ph.lesions for z in ins.regions)
    return not any(ph.finding_mask(ins.finding, r).any() for r in ins.regions)


def test_every_negative_asks_a_positive_question_of_another_phantom(exported):
    release, phantoms = exported
    pos: Counter[tuple[str, str]] = Counter()
    neg: Counter[tuple[str, str]] = Counter()
    for studies in release.values():
        for study, entry in studies.items():
            ph = phantoms[int(study.split("n")[-1])]
            mine = {p["instruction"] for p in entry["instruction_answer_pairs"]["positive_pairs"]}
            for p in entry["instruction_answer_pairs"]["positive_pairs"]:
                pos[(p["type"], p["instruction"])] += 1
            texts = [p["instruction"] for p in entry["instruction_answer_pairs"]["negative_pairs"]]
            assert len(texts) == len(set(texts)), "a phantom is asked one negative question once"
            for p in entry["instruction_answer_pairs"]["negative_pairs"]:
                ins = _instruction(p)
                assert p["instruction"] == ins.text and p["answer"] == ins.absent_answer()
                assert _absent(ph, ins) and p["instruction"] not in mine
                neg[(p["type"], p["instruction"])] += 1
    # each positive question is asked of NEGATIVES_PER_POSITIVE other phantoms: all of them where
    # enough phantoms lack the finding (a 24-phantom set holds three normal chests)
    assert set(neg) == set(pos) and sum(pos.values()) > 100
    exact = sum(neg[t] == NEGATIVES_PER_POSITIVE * n for t, n in pos.items())
    assert exact >= 0.8 * len(pos) and all(neg[t] <= NEGATIVES_PER_POSITIVE * n for t, n in pos.items())
    kinds = Counter(kind for kind, _ in pos.elements())
    assert kinds["basic"] > kinds["global"] > 0 and kinds["lesion_inference"] > 0


def test_negatives_name_as_many_regions_as_positives(exported):
    """The old rule's tell: zone positives named every zone their lesion touched, negatives one."""
    release, _ = exported
    sizes: dict[bool, Counter[int]] = {True: Counter(), False: Counter()}
    for studies in release.values():
        for entry in studies.values():
            for sign, key in ((True, "positive_pairs"), (False, "negative_pairs")):
                for p in entry["instruction_answer_pairs"][key]:
                    sizes[sign][len(p["location"]) if p["type"] != "global" else 0] += 1
    share = {sign: {k: n / sum(c.values()) for k, n in c.items()} for sign, c in sizes.items()}
    assert set(share[True]) == set(share[False])
    assert all(abs(share[True][k] - share[False][k]) < 0.03 for k in share[True])
    assert sum(n for k, n in sizes[False].items() if k >= 2) > 10  # multi-zone negatives exist


def test_negatives_stay_in_their_split_when_one_fits(exported):
    release, _ = exported
    where = {}
    for split, studies in release.items():
        for entry in studies.values():
            for p in entry["instruction_answer_pairs"]["positive_pairs"]:
                where.setdefault(p["instruction"], []).append(split)
    crossed = 0
    for split, studies in release.items():
        for entry in studies.values():
            for p in entry["instruction_answer_pairs"]["negative_pairs"]:
                crossed += split not in where[p["instruction"]]
    total = sum(len(e["instruction_answer_pairs"]["negative_pairs"]) for s in release.values() for e in s.values())
    assert crossed <= 0.15 * total  # val/test hold 2-3 phantoms each here: some must cross


def test_text_alone_is_at_chance_on_the_heldout_set(tmp_path):
    """On an unseen seed's held-out questions, neither text-only reader beats chance at any level."""
    path = export_heldout(tmp_path / "heldout", seed=4242, questions=90, size=128, progress=False)
    cases = read_mimic_ils(path, split="test", kinds=("basic", "global")).cases
    audit = text_shortcut_audit(cases, replicates=200)
    for level, entry in audit.items():
        assert entry["questions"] == 30 and entry["positives"] == 15 and entry["unmatched"] == 0, level
        assert entry["question_only"]["value"] == pytest.approx(0.5), level
        assert entry["text_classifier"]["value"] <= 0.55, level
        assert entry["text_classifier"]["low"] <= 0.5 <= entry["text_classifier"]["high"] + 1e-9, level


def test_the_audit_catches_the_old_shortcut(tmp_path):
    """Keeping only the old rule's zone questions (multi-zone positives, one-zone negatives) of a
    fair set: both readers see it, so the audit's chance figures above are not vacuous."""
    json_path = tmp_path / "set" / GT_DIR / JSON_NAME
    export_set(tmp_path / "set", 40, seed=12, size=128)
    cases = [c for c in training_cases(json_path) if c.level == "zone"]
    biased = [c for c in cases if (len(c.instruction.regions) >= 2) == c.positive]
    assert sum(c.positive for c in biased) >= 10 and sum(not c.positive for c in biased) >= 10
    assert question_only_accuracy(biased) == 1.0
    assert text_classifier_accuracy(biased) >= 0.8
    assert text_balance(biased)["zone"]["unmatched"] > 0
    fair = text_shortcut_audit(cases, replicates=50)["zone"]
    assert fair["unmatched"] == 0 and fair["question_only"]["value"] == pytest.approx(0.5)
    assert np.isfinite(fair["text_classifier"]["value"])
