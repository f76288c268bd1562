"""The external-label evaluation harness of report structuring (reports/ils/external.md):
the CMC 2007 reader and its chest filter, the dev / held-out split, report labels under the
MIMIC-ILS §C.1 certainty rule, bootstrap scoring, the comparison structurers, the LLM path."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("medspacy", reason="medspaCy is not installed here: run `make setup`")

from monailabel_xflow.data.mimic_ils import ReportedFinding as F  # noqa: E402
from monailabel_xflow.ils.report_eval import (  # noqa: E402
    KEYWORDS,
    LabelledReport,
    PhraseNegExStructurer,
    certainty_agreement,
    chexpert_structurer,
    evaluate_external,
    external_structurers,
    main,
    read_cmc2007,
    read_openi_csv,
    report_labels,
    score_labels,
    split_of,
)

# The CMC layout; impressions are real CMC 2007 sentences (its unlabelled test file), codes ours.
CMC_XML = """<?xml version='1.0' standalone='yes'?>
<docs>
  <doc id="1001" type="RADIOLOGY_REPORT">
    <codes><code origin="CMC_MAJORITY" type="ICD-9-CM">486</code>
           <code origin="COMPANY1" type="ICD-9-CM">518.0</code></codes>
    <texts><text origin="CCHMC_RADIOLOGY" type="CLINICAL_HISTORY">Cough and fever.</text>
           <text origin="CCHMC_RADIOLOGY" type="IMPRESSION">New left basilar infiltrate, as described above.</text></texts>
  </doc>
  <doc id="1002" type="RADIOLOGY_REPORT">
    <codes><code origin="CMC_MAJORITY" type="ICD-9-CM">786.2</code></codes>
    <texts><text origin="CCHMC_RADIOLOGY" type="CLINICAL_HISTORY">Rule out pneumonia.</text>
           <text origin="CCHMC_RADIOLOGY" type="IMPRESSION">Left lower lobe atelectasis vs pneumonia.</text></texts>
  </doc>
  <doc id="1003" type="RADIOLOGY_REPORT">
    <codes><code origin="CMC_MAJORITY" type="ICD-9-CM">593.70</code></codes>
    <texts><text origin="CCHMC_RADIOLOGY" type="CLINICAL_HISTORY">Reflux.</text>
           <text origin="CCHMC_RADIOLOGY" type="IMPRESSION">Normal study.</text></texts>
  </doc>
  <doc id="1004" type="RADIOLOGY_REPORT">
    <codes><code origin="CMC_MAJORITY" type="ICD-9-CM">780.6</code></codes>
    <texts><text origin="CCHMC_RADIOLOGY" type="CLINICAL_HISTORY">Fever.</text>
           <text origin="CCHMC_RADIOLOGY" type="IMPRESSION">Enlarged kidneys.</text></texts>
  </doc>
  <doc id="1005" type="RADIOLOGY_REPORT">
    <codes><code origin="CMC_MAJORITY" type="ICD-9-CM">518.0</code>
           <code origin="CMC_MAJORITY" type="ICD-9-CM">786.2</code></codes>
    <texts><text origin="CCHMC_RADIOLOGY" type="CLINICAL_HISTORY">Cough.</text>
           <text origin="CCHMC_RADIOLOGY" type="IMPRESSION">Right basilar plate - like atelectasis.</text></texts>
  </doc>
</docs>
"""


@pytest.fixture()
def cmc(tmp_path):
    path = tmp_path / "cmc.xml"
    path.write_text(CMC_XML)
    return path


def test_read_cmc2007_keeps_chest_reports_with_majority_labels(cmc, tmp_path):
    reports = read_cmc2007(cmc)
    assert [r.id for r in reports] == ["1001", "1002", "1005"]  # urinary code / renal words left out
    assert [set(r.labels) for r in reports] == [{"pneumonia"}, set(), {"atelectasis"}]  # majority codes only
    assert (
        reports[0].text
        == "CLINICAL HISTORY: Cough and fever.\n\nIMPRESSION: New left basilar infiltrate, as described above."
    )
    assert all(r.split == split_of(r.id) for r in reports)
    bad = tmp_path / "bad.xml"
    bad.write_text("<docs><doc id='1'><texts/></doc></docs>")
    with pytest.raises(ValueError, match="IMPRESSION"):
        read_cmc2007(bad)
    bad.write_text("not xml")
    with pytest.raises(ValueError, match="cannot read"):
        read_cmc2007(bad)


def test_split_is_fixed_by_the_id_alone():
    ids = [str(97000000 + k) for k in range(2000)]
    splits = [split_of(i) for i in ids]
    assert splits == [split_of(i) for i in ids]
    assert set(splits) == {"dev", "held-out"}
    assert 0.35 < splits.count("dev") / len(ids) < 0.45


def test_report_labels_follow_c1():
    tuples = [
        F("opacity", 1, True, True, ("right lower lobe",), "pneumonia"),  # tentative: an opacity, not pneumonia
        F("opacities", 2, True, False, (), "atelectasis"),  # re-typed opacity: both
        F("pleural effusion", 3, False, False, (), "effusion"),  # absent
        F("pericardial effusion", 4, True, False, (), None),  # not one of ours
        F("enlarged", 5, True, True, ("heart",), "cardiomegaly"),  # tentative cardiomegaly: neither
    ]
    assert report_labels(tuples) == {"opacity", "atelectasis"}
    assert report_labels(tuples, "any") == {"opacity", "pneumonia", "atelectasis", "cardiomegaly"}
    with pytest.raises(ValueError, match="definite, any"):
        report_labels(tuples, "maybe")


def test_score_labels_counts_and_paired_intervals():
    true = np.array([[1, 0], [1, 1], [0, 0], [0, 1], [1, 0], [0, 0]], bool)
    perfect = true.copy()
    some = np.array([[1, 0], [0, 1], [1, 0], [0, 1], [1, 0], [0, 0]], bool)
    out = score_labels(
        {"perfect": perfect, "some": some}, true, ["pneumonia", "atelectasis"], baseline="some", resamples=300
    )
    s = out["systems"]["some"]
    pn = s["per_finding"]["pneumonia"]
    assert (pn["tp"], pn["fp"], pn["fn"], pn["positives"]) == (2, 1, 1, 3)
    assert pn["precision"] == pn["recall"] == pn["f1"] == pytest.approx(2 / 3)
    assert s["per_finding"]["atelectasis"]["f1"] == 1.0
    assert s["micro"] == pytest.approx({"precision": 0.8, "recall": 0.8, "f1": 0.8})
    assert s["micro_f1_ci"][0] <= 0.8 <= s["micro_f1_ci"][1]
    assert out["macro_findings"] == []  # fewer than MACRO_MIN_POSITIVES positives each
    p = out["systems"]["perfect"]
    assert p["micro"]["f1"] == 1.0 and p["micro_f1_ci"] == [1.0, 1.0]
    lo, hi = p["diff_micro_ci"]  # paired: the perfect system is never worse on a resample
    assert 0.0 <= lo <= 0.2 <= hi <= 1.0
    assert "diff_micro_ci" not in s  # the baseline itself


def test_certainty_agreement_with_coded_labels():
    tuples = [
        [F("pneumonia", 1, True, False, (), "pneumonia")],  # definite, coded: agree
        [F("pneumonia", 1, True, True, (), "pneumonia")],  # tentative, not coded: agree
        [F("pneumonia", 1, True, False, (), "pneumonia")],  # definite, not coded: disagree
        [F("pneumonia", 1, False, False, (), "pneumonia")],
    ]  # absent: not a mention
    true = np.array([[1], [0], [0], [1]], bool)
    assert certainty_agreement(tuples, true, ["pneumonia"]) == {
        "pneumonia": {"mentions": 3, "agree": 2, "accuracy": 2 / 3}
    }


def test_keyword_negex_baseline_and_unmentions():
    base = PhraseNegExStructurer(KEYWORDS)
    assert base("No pneumonia. Possible right effusion.") == [
        F("pneumonia", 1, False, False, (), "pneumonia"),
        F("effusion", 2, True, True, (), "effusion"),
    ]
    peer = PhraseNegExStructurer({"effusion": [r"effusion"]}, {"effusion": [r"pericardial effusion"]})
    assert peer("Small pericardial effusion. Small pleural effusion.") == [
        F("effusion", 2, True, False, (), "effusion")
    ]


def test_chexpert_phrases_read_from_a_checkout(tmp_path):
    with pytest.raises(ValueError, match="no CheXpert mention phrases"):
        chexpert_structurer(tmp_path)
    (tmp_path / "phrases" / "mention").mkdir(parents=True)
    (tmp_path / "phrases" / "unmention").mkdir()
    (tmp_path / "phrases" / "mention" / "atelectasis.txt").write_text("atelecta\ncollapse\n")
    (tmp_path / "phrases" / "mention" / "pleural_effusion.txt").write_text("pleural fluid\neffusion")
    (tmp_path / "phrases" / "unmention" / "pleural_effusion.txt").write_text("pericardial effusion")
    peer = chexpert_structurer(tmp_path)
    got = peer("Right basilar plate - like atelectasis. No pericardial effusion.")
    assert [(f.finding, f.present) for f in got] == [("atelectasis", True)]  # prefix match, unmention voids


def test_evaluate_external_scores_every_split_rule_and_mode(cmc):
    reports = read_cmc2007(cmc) + [
        LabelledReport(
            "x1", "FINDINGS: Lungs clear.\n\nIMPRESSION: Right lower lobe pneumonia.", frozenset({"pneumonia"}), "dev"
        )
    ]

    def broken(section):
        raise ValueError("no answer")

    systems = {**external_structurers(), "broken": broken}
    out = evaluate_external(reports, systems, resamples=50)
    assert out["findings"] == ["pneumonia", "atelectasis"]
    assert set(out["splits"]) == {"dev", "held-out", "all"}
    runs = out["splits"]["all"]["runs"]
    assert set(runs) == {
        f"{r}/{m}" for r in ("findings", "findings+impression") for m in ("definite", "any", "per-finding")
    }
    rules_default = runs["findings/definite"]["systems"]["rules"]["per_finding"]["pneumonia"]
    rules_both = runs["findings+impression/definite"]["systems"]["rules"]["per_finding"]["pneumonia"]
    assert rules_default["fn"] == rules_both["fn"] + 1  # the impression-only pneumonia of x1
    # "atelectasis vs pneumonia" is tentative: not pneumonia under C.1, pneumonia when any certainty counts
    assert runs["findings/definite"]["systems"]["rules"]["per_finding"]["pneumonia"]["fp"] == 0
    assert runs["findings/any"]["systems"]["rules"]["per_finding"]["pneumonia"]["fp"] == 1
    assert out["splits"]["all"]["failures"]["broken"] == len(reports)
    assert runs["findings/definite"]["systems"]["broken"]["micro"]["recall"] == 0.0
    assert "diff_micro_ci" in runs["findings/definite"]["systems"]["rules"]


def test_cli_writes_the_report(cmc, tmp_path, capsys):
    out = tmp_path / "ext.md"
    assert main(["--cmc2007", str(cmc), "--resamples", "20", "--splits", "all", "--out", str(out)]) == 0
    text = out.read_text()
    assert "### all (3 reports" in text and "| rules |" in text and "| keyword+NegEx |" in text
    assert json.loads(out.with_suffix(".json").read_text())["splits"]["all"]["reports"] == 3
    with pytest.raises(SystemExit):
        main(["--cmc2007", str(cmc), "--splits", "test"])


@pytest.fixture(scope="module")
def tiny_lm(tmp_path_factory):
    from monailabel_xflow.ils.report_llm import save_random_llm

    return save_random_llm(tmp_path_factory.mktemp("tiny_lm"))


def test_llm_structurer_through_the_same_harness(cmc, tiny_lm):
    """The tiny random model's answers fail validation: every report counts as a failure that
    states nothing, and the harness still scores it beside the rules."""
    systems = external_structurers(llm_model=str(tiny_lm), llm_max_new_tokens=4)
    assert set(systems) == {"rules", "keyword+NegEx", "llm"}
    out = evaluate_external(read_cmc2007(cmc), systems, section_rules=("findings",), resamples=20, splits=("all",))
    assert out["splits"]["all"]["failures"]["llm"] == 3
    llm = out["splits"]["all"]["runs"]["findings/definite"]["systems"]["llm"]
    assert llm["micro"]["recall"] == 0.0 and llm["micro"]["precision"] == 0.0


def test_scripted_llm_through_the_harness(cmc):
    from monailabel_xflow.ils.report_llm import LLMStructurer

    answer = json.dumps(
        [
            {
                "entity": "atelectasis",
                "sentence": 1,
                "presence": "positive",
                "certainty": "definitive",
                "location": ["right basilar"],
                "predicted_type": None,
            }
        ]
    )
    out = evaluate_external(
        read_cmc2007(cmc),
        {"llm": LLMStructurer(lambda prompt: answer)},
        section_rules=("findings",),
        baseline=None,
        resamples=20,
        splits=("all",),
    )
    per = out["splits"]["all"]["runs"]["findings/definite"]["systems"]["llm"]["per_finding"]["atelectasis"]
    assert (per["tp"], per["fp"], per["fn"]) == (1, 2, 0)  # says atelectasis in all three reports


# --- per-finding hedging: which tentative mentions name their finding (issue 38) --------------


def test_report_labels_per_finding_counts_hedge_grades():
    tuples = [
        F("atelectasis", 1, True, True, (), "atelectasis", "probable"),  # likely atelectasis: counts
        F("pneumonia", 2, True, True, (), "pneumonia", "probable"),  # likely pneumonia: an opacity
        F("effusion", 3, True, True, (), "effusion", "possible"),  # possible effusion: nothing
        F("edema", 4, True, True, (), "edema", "probable"),  # likely edema: an opacity
        F("opacity", 5, True, True, (), "opacity", "alternative"),  # a hedged opacity is an opacity
    ]
    assert report_labels(tuples, "per-finding") == {"atelectasis", "opacity"}
    assert report_labels(tuples[2:3], "per-finding") == set()
    # a tentative tuple of unknown grade (an LLM's) counts as "possible"
    assert report_labels([F("atelectasis", 1, True, True, (), "atelectasis")], "per-finding") == {"opacity"}
    with pytest.raises(ValueError, match="definite, any, per-finding"):
        report_labels(tuples, "maybe")


@pytest.mark.parametrize(
    ("sentence", "labels"),
    [
        # CMC 97667049 (dev): probable atelectasis is atelectasis
        ("Probable band of atelectasis seen on lateral view only. No pneumonia.", {"atelectasis"}),
        # CMC 97726428 (dev): "I favor atelectasis" counts; the pneumonia under "unless" is no statement
        (
            "Unless there is clinical information supporting pneumonia such as fever and cough, I favor atelectasis.",
            {"atelectasis"},
        ),
        # CMC 99573144, 99618064 (dev): likely pneumonia is an opacity, not pneumonia (uncoded)
        ("Air space disease at the right base which likely represents pneumonia.", {"opacity"}),
        ("1. Left lower lobe infiltrate, likely representing pneumonia.", {"opacity"}),
        # CMC 97741098 (dev): alternatives name neither
        ("Left lower lobe atelectasis or pneumonia.", {"opacity"}),
        # CMC 99598032 (dev): the disfavored alternative after "favored over" does not count
        ("With greater consolidation than volume loss, pneumonia is favored over atelectasis.", {"opacity"}),
        # CMC 97643888 (dev): "could represent atelectasis" is possible, not probable
        ("Patchy disease is seen in the lingula which could represent atelectasis or early infiltrate.", {"opacity"}),
        # CMC 98571285 (dev): a definite pneumonia
        ("Findings consistent with right lower lobe pneumonia.", {"pneumonia"}),
    ],
)
def test_per_finding_labels_of_real_sentences(sentence, labels):
    from monailabel_xflow.ils.report import structure_section

    assert report_labels(structure_section(sentence), "per-finding") == labels


# --- the CMC 2007 set committed in the repository: the external regression set -----------------

CMC_FILE = Path(__file__).parent / "data" / "cmc2007" / "2007ChallengeTrainData.xml"
CMC_SHA256 = "9ddf73c88eed439c4d5f463954897189cbe8e68760bc65ae645586c1cd6fa7d0"


def test_committed_cmc_set_is_the_published_file_with_its_attribution():
    assert hashlib.sha256(CMC_FILE.read_bytes()).hexdigest() == CMC_SHA256
    source = (CMC_FILE.parent / "SOURCE.md").read_text()
    assert "Computational" in source and "Medicine Center" in source and CMC_SHA256 in source
    reports = read_cmc2007(CMC_FILE)
    splits = [r.split for r in reports]
    assert (len(reports), splits.count("dev"), splits.count("held-out")) == (507, 186, 321)
    dev = [r for r in reports if r.split == "dev"]
    assert sum("pneumonia" in r.labels for r in dev) == 28 and sum("atelectasis" in r.labels for r in dev) == 8


@pytest.fixture(scope="module")
def cmc_dev_scores():
    reports = [r for r in read_cmc2007(CMC_FILE) if r.split == "dev"]
    return evaluate_external(
        reports, external_structurers(), section_rules=("findings",), resamples=200, splits=("dev",)
    )["splits"]["dev"]["runs"]


def test_rules_beat_the_keyword_baseline_on_the_cmc_dev_half(cmc_dev_scores):
    """A regression floor on real reports (dev half only: the held-out half is scored in
    reports/ils/external.md, never in tests): figures at the time of issue 38, less a margin."""
    for mode, floor in (("definite", 0.64), ("per-finding", 0.63)):
        rules = cmc_dev_scores[f"findings/{mode}"]["systems"]["rules"]
        base = cmc_dev_scores[f"findings/{mode}"]["systems"]["keyword+NegEx"]
        assert rules["micro"]["f1"] >= floor
        assert rules["micro"]["f1"] > base["micro"]["f1"]
        assert rules["micro"]["precision"] > base["micro"]["precision"] + 0.15


# --- the Open-i layout (the set itself is not in the repository: CC BY-NC-ND) ------------------

OPENI_CSV = (
    "uid,MeSH,Problems,image,indication,comparison,findings,impression\n"
    '1,normal,normal,PA and lateral,Cough,None.,"The lungs are clear. No pleural effusion.",Normal chest.\n'
    "2,Cardiomegaly/borderline;Pulmonary Atelectasis/base/left,x,PA,Dyspnea,,"
    '"Borderline cardiomegaly. Left basilar atelectasis.",\n'
    "3,Opacity/lung/base/right;Airspace Disease/lung/base/right,x,PA,Fever,,,Right basilar airspace disease.\n"
    "4,normal,normal,PA,Preop,,,\n"
)


def test_read_openi_csv_maps_manual_mesh_to_findings(tmp_path):
    path = tmp_path / "openi.csv"
    path.write_text(OPENI_CSV)
    reports = read_openi_csv(path)
    assert [r.id for r in reports] == ["1", "2", "3"]  # no text: left out
    assert [set(r.labels) for r in reports] == [set(), {"cardiomegaly", "atelectasis"}, {"opacity"}]
    assert reports[0].text == "FINDINGS: The lungs are clear. No pleural effusion.\n\nIMPRESSION: Normal chest."
    assert reports[2].text == "IMPRESSION: Right basilar airspace disease."
    out = tmp_path / "openi.md"
    assert main(["--openi", str(path), "--resamples", "20", "--splits", "all", "--out", str(out)]) == 0
    assert "Open-i" in out.read_text() and "### all (3 reports" in out.read_text()
    path.write_text("uid,findings\n1,x\n")
    with pytest.raises(ValueError, match="needs the columns"):
        read_openi_csv(path)


def test_score_labels_pairs_every_system_with_the_peer_too():
    true = np.array([[1], [1], [0], [0], [1], [0]], bool)
    out = score_labels(
        {"a": true.copy(), "b": ~true, "c": true.copy()}, true, ["pneumonia"], baseline="b", resamples=100, peers=["c"]
    )
    assert out["systems"]["a"]["diff_vs"]["c"] == {"micro_ci": [0.0, 0.0], "macro_ci": [0.0, 0.0]}  # identical
    assert out["systems"]["b"]["diff_vs"]["c"]["micro_ci"][1] < 0  # always worse than the peer
    assert "diff_vs" not in out["systems"]["c"]
