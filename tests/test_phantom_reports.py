"""Phantom reports: `xflow phantom` writes a radiology-style report per study and the tuples it
states; the words are true to the masks, and the rule-based structurer recovers the tuples."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from monailabel_xflow.data.export import GT_DIR, META_NAME, REPORTS_CSV, export_set
from monailabel_xflow.data.mimic_ils import TRUTH_NAME
from monailabel_xflow.data.phantom import generate_phantom
from monailabel_xflow.data.phantom_reports import phantom_report
from monailabel_xflow.ils.report_eval import tuple_from_dict
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS, ZONES

N = 24


@pytest.fixture(scope="module")
def phantom_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("phantom_reports")
    release, phantoms = export_set(out, N, seed=5, size=128)
    return out, release, phantoms


def test_reports_csv_and_truth_written(phantom_set):
    out, release, _ = phantom_set
    with (out / REPORTS_CSV).open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["study_id", "image_path", "report"]
    assert len(rows) == N
    truth = json.loads((out / GT_DIR / TRUTH_NAME).read_text())
    studies = {sid: st for split in release.values() for sid, st in split.items()}
    assert set(truth) == set(studies) == {r["study_id"] for r in rows}
    names = set()
    for r in rows:
        st, t = studies[r["study_id"]], truth[r["study_id"]]
        assert (out / r["image_path"]).is_file() and r["image_path"] == st["image_path"]
        assert t["section_text"] in r["report"]
        # the MIMIC-ILS JSON carries the same section, and sent_idx points into it
        assert (st["section_name"], st["section_content"]) == (t["section_name"], t["section_text"])
        names.add(t["section_name"])
        findings = [tuple_from_dict(d) for d in t["findings"]]
        for p in st["instruction_answer_pairs"]["positive_pairs"]:
            if p["sent_idx"] is not None:
                assert any(f.sentence == p["sent_idx"] + 1 and f.finding == p["target"] and f.present for f in findings)
    assert "findings" in names


def test_report_words_true_to_masks(phantom_set):
    out, _, phantoms = phantom_set
    truth = json.loads((out / GT_DIR / TRUTH_NAME).read_text())
    meta = json.loads((out / GT_DIR / META_NAME).read_text())
    seen_present, seen_absent, seen_tentative = set(), set(), False
    for m, ph in zip(meta, phantoms, strict=True):
        for d in truth[m["study"]]["findings"]:
            t = tuple_from_dict(d)
            if t.finding is None:
                continue
            if not t.present:
                assert t.finding not in ph.findings  # negated and resolved findings are absent
                seen_absent.add(t.finding)
                continue
            assert t.finding in ph.findings
            seen_present.add(t.finding)
            seen_tentative |= t.tentative
            occupied = set(ph.occupied_zones(t.finding))
            for loc in t.locations:
                if loc in ALL_ZONES:
                    assert loc in occupied, (t, occupied)
                elif loc in LUNGS:
                    assert any(z in occupied for z in ZONES[loc])
                elif loc.endswith(" lower lobe"):
                    assert f"{loc.split()[0]} lung base" in occupied
                elif loc.endswith(" upper lobe"):
                    side = f"{loc.split()[0]} lung"
                    assert occupied & set(ZONES[side][:2]) and not occupied & set(ZONES[side][2:])
                else:
                    assert loc == "heart" and t.finding == "cardiomegaly"
            if t.tentative:  # hedged wording only for lesions the phantom marks not confident
                assert not all(les.confident for les in ph.lesions if les.finding == t.finding)
    assert seen_present == set(FINDINGS) and seen_tentative and seen_absent


def test_reports_deterministic_and_leave_images_alone():
    ph = generate_phantom(9, 128, findings=("effusion", "atelectasis"))
    a = phantom_report(ph, np.random.default_rng(3))
    b = phantom_report(ph, np.random.default_rng(3))
    assert a == b
    again = generate_phantom(9, 128, findings=("effusion", "atelectasis"))
    assert again.image.tobytes() == ph.image.tobytes()
    assert a.section_text in a.text and a.sentences
    assert all(1 <= t.sentence <= len(a.sentences) for t in a.truth)


def test_structurer_recovers_phantom_truth(phantom_set, tmp_path):
    pytest.importorskip("medspacy", reason="medspaCy is not installed here: run `make setup`")
    from monailabel_xflow.ils.report import split_sentences
    from monailabel_xflow.ils.report_eval import evaluate_phantoms, main

    out, _, _ = phantom_set
    truth = json.loads((out / GT_DIR / TRUTH_NAME).read_text())
    for t in truth.values():  # the writer's sentences are the structurer's sentences
        assert len(split_sentences(t["section_text"])) == len(t["section_text"].split(". "))
    result = evaluate_phantoms(out)
    assert result["studies"] == N and result["section_correct"] == N
    for field, s in result["scores"].items():
        assert s["true"] > 0
        assert s["precision"] >= 0.95 and s["recall"] >= 0.95, (field, s, result["errors"][:3])
    assert main(["--phantoms", str(out), "--out", str(tmp_path / "s.md")]) == 0
    assert "| presence |" in (tmp_path / "s.md").read_text()
    assert json.loads((tmp_path / "s.json").read_text())["studies"] == N
