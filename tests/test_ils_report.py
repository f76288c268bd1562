"""Report side of the MIMIC-ILS pipeline: section choice, structuring rules, location mapping.

Every rule is pinned by hand-written, MIMIC-style report sentences (our own wording) with the
tuples a careful reader extracts from them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("medspacy", reason="medspaCy is not installed here: run `make setup`")

from monailabel_xflow.data.mimic_ils import (  # noqa: E402
    LOCATION_CATEGORIES,
    LUNG_LOBES,
    ReportedFinding,
    ReportsCsvError,
    read_reports_csv,
    write_reports_csv,
)
from monailabel_xflow.ils.report import (
    SectionNotFound,
    choose_section,
    finding_of,
    map_location,
    split_sentences,
    structure_report,
    structure_section,
)
from monailabel_xflow.vocabulary import ALL_ZONES, LUNGS  # noqa: E402

F = ReportedFinding
RB, LB = "right lung base", "left lung base"


def _one(text: str) -> ReportedFinding:
    found = structure_section(text)
    assert len(found) == 1, found
    return found[0]


# --- section choice ------------------------------------------------------------------------

MIMIC_STYLE = """                                 FINAL REPORT
 EXAMINATION:  CHEST (PA AND LAT)

 INDICATION:  ___F with cough, evaluate for pneumonia

 COMPARISON:  Chest radiograph from ___.

 FINDINGS:

 Patchy opacity in the right lower lobe.  No pleural effusion or pneumothorax.  Heart size is
 normal.

 IMPRESSION:

 Right lower lobe opacity concerning for pneumonia.
"""


def test_section_findings_first():
    sec = choose_section(MIMIC_STYLE)
    assert sec.name == "findings"
    assert sec.text.startswith("Patchy opacity in the right lower lobe.")
    assert "IMPRESSION" not in sec.text and "evaluate for" not in sec.text
    # the indication's "evaluate for pneumonia" never becomes a finding
    found = structure_report(MIMIC_STYLE)
    assert [(f.finding, f.present, f.sentence) for f in found] == [
        ("opacity", True, 1),
        ("effusion", False, 2),
        (None, False, 2),
    ]
    assert found[0].locations == ("right lower lobe",)


def test_section_impression_when_findings_missing_or_empty():
    text = "INDICATION: fever.\n\nFINDINGS:\n\n___\n\nIMPRESSION:\n\nBibasilar atelectasis.\n"
    sec = choose_section(text)
    assert (sec.name, sec.text) == ("impression", "Bibasilar atelectasis.")
    assert choose_section("Impression: No acute process.").name == "impression"


def test_section_last_paragraph_and_skip():
    text = "PA and lateral views of the chest.\n\nSmall left pleural effusion. No pneumothorax.\n"
    sec = choose_section(text)
    assert (sec.name, sec.text) == ("last_paragraph", "Small left pleural effusion. No pneumothorax.")
    with pytest.raises(SectionNotFound, match="no text"):
        choose_section("   \n\n ___ \n")
    with pytest.raises(SectionNotFound):
        structure_report("")
    with pytest.raises(TypeError):
        choose_section(None)


def test_sentences_skip_list_numbers():
    assert split_sentences("1. Small left effusion.  2. No pneumothorax.\n3. Stable cardiomegaly.") == [
        "Small left effusion.",
        "No pneumothorax.",
        "Stable cardiomegaly.",
    ]
    found = structure_section("1. Small left effusion.  2. No pneumothorax.\n3. Stable cardiomegaly.")
    assert [(f.sentence, f.finding) for f in found] == [(1, "effusion"), (2, None), (3, "cardiomegaly")]


# --- the rules, one hand-written sentence each ------------------------------------------------


@pytest.mark.parametrize(
    "text, want",
    [
        # negation
        ("No pneumothorax.", F("pneumothorax", 1, False, False, (), None)),
        ("There is no pulmonary edema.", F("pulmonary edema", 1, False, False, (), "edema")),
        ("No evidence of pneumonia.", F("pneumonia", 1, False, False, (), "pneumonia")),
        ("Pneumothorax is not seen.", F("Pneumothorax", 1, False, False, (), None)),
        # stable = present
        ("Stable small left pleural effusion.", F("pleural effusion", 1, True, False, ("left lung",), "effusion")),
        (
            "No change in the moderate right pleural effusion.",
            F("pleural effusion", 1, True, False, ("right lung",), "effusion"),
        ),
        ("Moderate cardiomegaly, unchanged.", F("cardiomegaly", 1, True, False, (), "cardiomegaly")),
        (
            "No significant interval change in bibasilar atelectasis.",
            F("atelectasis", 1, True, False, (RB, LB), "atelectasis"),
        ),
        # resolved = absent
        (
            "The previously seen left pleural effusion has resolved.",
            F("pleural effusion", 1, False, False, ("left lung",), "effusion"),
        ),
        (
            "Interval resolution of the right upper lobe pneumonia.",
            F("pneumonia", 1, False, False, ("right upper lobe",), "pneumonia"),
        ),
        ("Right basilar atelectasis is no longer seen.", F("atelectasis", 1, False, False, (RB,), "atelectasis")),
        (
            "Partially resolved right lower lobe consolidation.",
            F("consolidation", 1, True, False, ("right lower lobe",), "consolidation"),
        ),
        # tentative
        (
            "Possible early right lower lobe pneumonia.",
            F("pneumonia", 1, True, True, ("right lower lobe",), "pneumonia"),
        ),
        (
            "A small left pleural effusion cannot be excluded.",
            F("pleural effusion", 1, True, True, ("left lung",), "effusion"),
        ),
        ("Findings suggest mild interstitial edema.", F("interstitial edema", 1, True, True, (), "edema")),
        ("Mild pulmonary edema is likely.", F("pulmonary edema", 1, True, True, (), "edema")),
        # bibasilar / retrocardiac / lobes / zones
        ("Bibasilar atelectasis.", F("atelectasis", 1, True, False, (RB, LB), "atelectasis")),
        ("Retrocardiac opacity.", F("opacity", 1, True, False, (LB,), "opacity")),
        (
            "Opacities in the right upper and left lower lobes.",
            F("Opacities", 1, True, False, ("right upper lobe", "left lower lobe"), "opacity"),
        ),
        (
            "Patchy opacity in the left mid and lower lung zones.",
            F("opacity", 1, True, False, ("left mid zone lung", LB), "opacity"),
        ),
        ("At the right base, there is plate-like atelectasis.", F("atelectasis", 1, True, False, (RB,), "atelectasis")),
        ("Consolidation in the lingula.", F("Consolidation", 1, True, False, ("left upper lobe",), "consolidation")),
        ("Large right pleural effusion.", F("pleural effusion", 1, True, False, ("right lung",), "effusion")),
        (
            "Small bilateral pleural effusions.",
            F("pleural effusions", 1, True, False, ("right lung", "left lung"), "effusion"),
        ),
        # predicted type ("opacity reflects pneumonia" -> pneumonia)
        (
            "Right lower lobe opacity likely reflects pneumonia.",
            F("opacity", 1, True, True, ("right lower lobe",), "pneumonia"),
        ),
        (
            "Bibasilar opacities most consistent with atelectasis.",
            F("opacities", 1, True, False, (RB, LB), "atelectasis"),
        ),
        ("Left basilar consolidation concerning for pneumonia.", F("consolidation", 1, True, True, (LB,), "pneumonia")),
        ("Hazy perihilar opacities, possibly mild edema.", F("opacities", 1, True, True, ("lung",), "edema")),
        ("No new focal consolidation to suggest pneumonia.", F("consolidation", 1, False, False, (), "pneumonia")),
        (
            "Increased right perihilar and basilar opacities.",
            F("opacities", 1, True, False, ("right lung", RB), "opacity"),
        ),
        (
            "Trace bilateral pleural effusions are also suspected.",
            F("pleural effusions", 1, True, True, ("right lung", "left lung"), "effusion"),
        ),
        # anatomy words moved out of the entity
        ("Hilar adenopathy.", F("adenopathy", 1, True, False, ("lung",), None)),
        ("The heart is moderately enlarged.", F("enlarged", 1, True, False, ("heart",), "cardiomegaly")),
        ("Pulmonary vascular congestion.", F("congestion", 1, True, False, ("vessels",), None)),
        (
            "Mild degenerative changes of the thoracic spine.",
            F("degenerative changes", 1, True, False, ("thoracic spine",), None),
        ),
        ("Healed left rib fractures.", F("fractures", 1, True, False, ("rib",), None)),
    ],
)
def test_rule(text, want):
    assert _one(text) == want


def test_devices_ignored_and_keep_their_locations():
    text = (
        "Endotracheal tube terminates 4 cm above the carina. Right PICC line tip in the SVC. "
        "Left chest tube in place with small left apical pneumothorax."
    )
    found = structure_section(text)
    assert found == [F("pneumothorax", 3, True, False, ("left apical zone lung",), None)]
    assert structure_section("Left-sided pacemaker with leads in the right ventricle.") == []


def test_normal_statements_not_extracted():
    assert (
        structure_section(
            "The lungs are clear. Heart size is normal. The cardiomediastinal silhouette "
            "is within normal limits. No acute cardiopulmonary process."
        )
        == []
    )


def test_a_negated_list_and_mixed_sentence():
    found = structure_section(
        "No focal consolidation, pleural effusion, or pneumothorax. Small right effusion, but no pneumothorax."
    )
    assert [(f.sentence, f.finding, f.present) for f in found] == [
        (1, "consolidation", False),
        (1, "effusion", False),
        (1, None, False),
        (2, "effusion", True),
        (2, None, False),
    ]
    assert found[3].locations == ("right lung",)


def test_coordinated_findings_share_location():
    found = structure_section("Low lung volumes with bibasilar atelectasis and small effusions.")
    assert [(f.finding, f.locations) for f in found] == [("atelectasis", (RB, LB)), ("effusion", (RB, LB))]


def test_hypothetical_dropped():
    assert structure_section("Recommend follow-up to evaluate for pneumonia.") == []


def test_handwritten_reports_committed_with_the_report():
    """The hand-written set behind reports/ils/structuring.md still scores as reported."""
    from pathlib import Path

    from monailabel_xflow.ils.report_eval import evaluate_handwritten

    path = Path(__file__).resolve().parents[1] / "reports" / "ils" / "structuring_handwritten.json"
    result = evaluate_handwritten(path)
    assert result["studies"] >= 30
    for field, s in result["scores"].items():
        assert s["precision"] >= 0.97 and s["recall"] >= 0.97, (field, s, result["errors"][:3])


# --- mapping -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "phrase, want",
    [
        ("bibasilar", (RB, LB)),
        ("retrocardiac", (LB,)),
        ("left", ("left lung",)),
        ("right", ("right lung",)),
        ("bilateral", ("right lung", "left lung")),
        ("right lower lobe", ("right lower lobe",)),
        ("left upper and lower lobes", ("left upper lobe", "left lower lobe")),
        ("right middle lobe", ("right middle lobe",)),
        ("lingula", ("left upper lobe",)),
        ("right apex", ("right apical zone lung",)),
        ("left mid lung", ("left mid zone lung",)),
        ("right upper zone", ("right upper zone lung",)),
        ("base of the left lung", (LB,)),
        ("both lungs", ("right lung", "left lung")),
        ("lung", ("lung",)),
        ("left hemidiaphragm", ("diaphragm",)),
        ("mediastinal", ("mediastinum",)),
        ("cervical spine", ("cervical spine",)),
        ("mid thoracic spine", ("thoracic spine",)),
        ("upper abdomen", ("abdomen",)),
        ("posterior costophrenic sulcus", ("lateral view location",)),
        ("left costophrenic angle", (LB,)),
        ("aortic knob", ("vessels",)),
        ("right breast", ("breast",)),
        ("the", ()),
        ("somewhere", ()),
    ],
)
def test_map_location(phrase, want):
    assert map_location(phrase) == want


def test_map_location_labels_are_known():
    known = set(LOCATION_CATEGORIES) | set(LUNG_LOBES) | set(ALL_ZONES) | set(LUNGS)
    for phrase in (
        "bibasilar",
        "right upper and left lower lobes",
        "retrocardiac",
        "left",
        "sternal",
        "tracheal",
        "scapular",
        "clavicle",
        "pleural",
        "cardiac",
        "lumbar spine",
        "right hemithorax",
    ):
        labels = map_location(phrase)
        assert labels and set(labels) <= known, (phrase, labels)


@pytest.mark.parametrize(
    "entity, want",
    [
        ("pleural effusions", "effusion"),
        ("fluid", "effusion"),
        ("fluid overload", "edema"),
        ("pulmonary edema", "edema"),
        ("airspace disease", "opacity"),
        ("infiltrate", "opacity"),
        ("enlarged heart", "cardiomegaly"),
        ("enlarged", "cardiomegaly"),
        ("collapse", "atelectasis"),
        ("vascular congestion", None),
        ("pneumothorax", None),
        ("hydropneumothorax", None),
        ("small left pleural effusion", "effusion"),
    ],
)
def test_finding_of(entity, want):
    assert finding_of(entity) == want


# --- reports.csv ---------------------------------------------------------------------------


def test_reports_csv_roundtrip_and_errors(tmp_path):
    rows = [
        {"study_id": "s1", "image_path": "a.png", "report": 'FINDINGS:\n\nSmall left effusion, "stable".'},
        {"study_id": "s2", "image_path": "b.dcm", "report": ""},
    ]
    write_reports_csv(tmp_path / "reports.csv", rows)
    back = read_reports_csv(tmp_path / "reports.csv")
    assert [(r["study_id"], r["image_path"], r["report"]) for r in back] == [
        (r["study_id"], r["image_path"], r["report"]) for r in rows
    ]
    (tmp_path / "bad.csv").write_text("study,image_path,report\ns1,a.png,x\n")
    with pytest.raises(ReportsCsvError, match="study_id"):
        read_reports_csv(tmp_path / "bad.csv")
    (tmp_path / "empty_id.csv").write_text("study_id,image_path,report\n,a.png,x\n")
    with pytest.raises(ReportsCsvError, match="line 2"):
        read_reports_csv(tmp_path / "empty_id.csv")
    with pytest.raises(ReportsCsvError, match="does not exist"):
        read_reports_csv(tmp_path / "missing.csv")


# --- error classes seen on real reports (issue 27), pinned by real sentences ---------------------
# Sentences marked CMC are verbatim impressions of the CMC 2007 Medical NLP Challenge set
# (pediatric chest radiograph reports; report id given), taken from its unlabelled test file or
# the dev part of the external evaluation, never from its held-out part. Sentences marked
# "ours" follow a phrasing quoted in the issue that the public set does not contain.


def _facts(text: str) -> list[tuple]:
    return [(f.finding or f.entity.lower(), f.present, f.tentative) for f in structure_section(text)]


@pytest.mark.parametrize(
    "text, want",
    [
        # alternatives: neither is definite (CMC 97646126, 97653276, 97656682, 97655262)
        ("Left lower lobe atelectasis vs pneumonia.", [("atelectasis", True, True), ("pneumonia", True, True)]),
        ("Right lower lobe atelectasis or infiltrate.", [("atelectasis", True, True), ("opacity", True, True)]),
        (
            "Right lower lobe opacity may represent either atelectasis or pneumonia.",
            [("atelectasis", True, True), ("pneumonia", True, True)],
        ),
        (
            "These findings are consistent with atelectasis versus pneumonia.",
            [("atelectasis", True, True), ("pneumonia", True, True)],
        ),
        # ... but a negated list stays definite (CMC 97644541)
        ("There is no focal infiltrate or pleural effusion.", [("opacity", False, False), ("effusion", False, False)]),
        # differentials and questions (CMC 99601120, 97682386, 97683473); favored (CMC 97740836, dev)
        # (an opacity offered as one of two: the other is its tentative predicted type)
        ("Differential includes early infiltrate vs atelectasis.", [("atelectasis", True, True)]),
        ("Streaky opacity right middle lobe, questionable for atelectasis.", [("atelectasis", True, True)]),
        ("Questionable nodule on lateral view.", [("nodule", True, True)]),
        (
            "With greater consolidation than volume loss, pneumonia is favored over atelectasis.",
            [
                ("consolidation", True, True),
                ("volume loss", True, True),
                ("pneumonia", True, True),
                ("atelectasis", True, True),
            ],
        ),
        ("With history of cough and fever this would be most consistent with pneumonia.", [("pneumonia", True, True)]),
        # "correlate clinically for" (ours)
        (
            "Patchy left basilar opacity; correlate clinically for pneumonia.",
            [("opacity", True, False), ("pneumonia", True, True)],
        ),
    ],
)
def test_hedges_and_alternatives_are_tentative(text, want):
    assert _facts(text) == want


@pytest.mark.parametrize(
    "text, not_found",
    [
        # over-broad synonyms no longer name a finding (CMC 97680398, 97668350 is kept: lung-ish)
        ("The overall bone density appears normal.", "opacity"),
        ("Increased interstitial markings in the perihilar regions with peribronchial thickening.", "opacity"),
        ("Perihilar interstitial markings probably representing viral illness.", "opacity"),
        ("Old granulomatous disease.", "pneumonia"),
        ("This could be community - acquired, but cannot exclude early granulomatous infection as well.", "pneumonia"),
        ("Mild free fluid in the dependent portion of the pelvis, nonspecific.", "effusion"),
        ("Stomach is greatly dilated with gas and fluid.", "effusion"),
        ("Small pericardial effusion.", "effusion"),  # ours
        ("Calcified granulomas consistent with prior granulomatous infection.", "pneumonia"),  # ours
        ("Borderline normal heart size.", "cardiomegaly"),  # CMC 97649358: normal, not enlarged
    ],
)
def test_over_broad_synonyms_gone(text, not_found):
    assert not_found not in {f.finding for f in structure_section(text)}


@pytest.mark.parametrize(
    "text, want",
    [
        # qualified densities are still opacities (CMC 97687245)
        (
            "There is minimal perihilar streaky density, particularly in the right middle lobe.",
            ("opacity", True, False),
        ),
        # cardiomegaly phrasings (CMC 99591839, 99595284; the rest ours)
        ("Borderline enlargement of the heart.", ("cardiomegaly", True, True)),
        ("Again, the cardiac size is borderline enlarged on the lateral view only.", ("cardiomegaly", True, True)),
        ("Borderline heart size.", ("cardiomegaly", True, True)),
        ("Heart size mildly enlarged.", ("cardiomegaly", True, False)),
        ("Enlarged cardiomediastinal silhouette.", ("cardiomegaly", True, False)),
        ("The cardiomediastinal silhouette is enlarged.", ("cardiomegaly", True, False)),
    ],
)
def test_missed_phrasings_found(text, want):
    assert _facts(text) == [want]


def test_laterality_compared_sides_and_sideless_zones():
    # CMC 97668250: "right greater than left" names both sides
    found = structure_section(
        "Two views of the chest show opacity in both upper lobes, right - sided greater than left."
    )
    assert [f.locations for f in found] == [("right upper lobe", "left upper lobe")]
    assert _one("Bilateral opacities, right greater than left.").locations == ("right lung", "left lung")  # ours
    assert map_location("left much greater than right basilar") == (RB, LB)
    # a side-less zone takes the one side its sentence names (ours), else both
    found = structure_section("Left pleural effusion with basilar atelectasis.")
    assert [(f.finding, f.locations) for f in found] == [("effusion", ("left lung",)), ("atelectasis", (LB,))]
    assert _one("Basilar atelectasis.").locations == (RB, LB)
    assert _one("Medial right basilar atelectasis.").locations == (RB,)


def test_section_option_findings_and_impression():
    report = (
        "INDICATION: Cough.\n\nFINDINGS: The lungs are clear. No pleural effusion.\n\n"
        "IMPRESSION: Early right lower lobe pneumonia."
    )
    assert choose_section(report).name == "findings"
    both = choose_section(report, "findings+impression")
    assert both.name == "findings+impression"
    assert both.text == "The lungs are clear. No pleural effusion.\n\nEarly right lower lobe pneumonia."
    assert "pneumonia" not in {f.finding for f in structure_report(report)}
    found = structure_report(report, section_rule="findings+impression")
    assert [(f.sentence, f.finding, f.present) for f in found] == [(2, "effusion", False), (3, "pneumonia", True)]
    # one of the two: the same section as the default rule
    only = "IMPRESSION: Small left effusion."
    assert choose_section(only, "findings+impression") == choose_section(only)
    with pytest.raises(ValueError, match="findings, findings\\+impression"):
        choose_section(report, "everything")


def test_xflow_ils_section_option_reaches_the_reader(tmp_path):
    """`xflow ils build --section findings+impression` structures both sections of each report."""
    import argparse

    from monailabel_xflow.commands.ils import _inputs, register

    (tmp_path / "a.png").write_bytes(b"not read here")
    write_reports_csv(
        tmp_path / "reports.csv",
        [
            {
                "study_id": "s1",
                "image_path": "a.png",
                "report": "FINDINGS: The lungs are clear.\n\nIMPRESSION: Early right lower lobe pneumonia.",
            }
        ],
    )
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    base = [
        "ils",
        "build",
        "--images",
        str(tmp_path),
        "--reports",
        str(tmp_path / "reports.csv"),
        "--out",
        str(tmp_path / "o"),
    ]
    (study,), _ = _inputs(parser.parse_args(base))
    assert study.section_name == "findings" and study.findings == ()
    (study,), _ = _inputs(parser.parse_args(base + ["--section", "findings+impression"]))
    assert study.section_name == "findings+impression"
    assert [(f.finding, f.present) for f in study.findings] == [("pneumonia", True)]


# --- hedge grades (issue 38): how a tentative mention is hedged, from real sentences -------------
# CMC sentences are from the dev half of the external evaluation (report id given); "CheXpert"
# marks the example report of the CheXpert paper (Irvin et al., AAAI 2019, Figure 1) and the
# labeled_reports.csv of stanfordmlgroup/chexpert-labeler (MIT).


def _grades(text: str) -> list[tuple]:
    return [(f.finding or f.entity.lower(), f.present, f.tentative, f.hedge) for f in structure_section(text)]


@pytest.mark.parametrize(
    "text, want",
    [
        # probable: "likely", "probable", "favor", "worrisome for", "suggestive of"
        (
            "Air space disease at the right base which likely represents pneumonia.",  # CMC 99573144
            [("pneumonia", True, True, "probable")],
        ),
        (
            "Probable band of atelectasis seen on lateral view only.",
            [("atelectasis", True, True, "probable")],
        ),  # 97667049
        ("Findings worrisome for right lower lobe infection.", [("pneumonia", True, True, "probable")]),  # CMC dev
        (
            "Patchy left lower lobe infiltrate suggestive of pneumonia.",
            [("pneumonia", True, True, "probable")],
        ),  # 99582121
        # possible: "could represent", "possible", "cannot be completely excluded", "can be seen with"
        (
            "Subtle ill defined opacity in the left lower lobe could represent pneumonia in the appropriate "
            "clinical setting.",  # CMC 99601765
            [("pneumonia", True, True, "possible")],
        ),
        (
            "Possible early pneumonia involving the lingula and possibly the right middle lobe.",  # CMC 97640513
            [("pneumonia", True, True, "possible")],
        ),
        (
            "Diffuse reticular pattern, which can be seen with an atypical infection or chronic fibrotic change.",
            [("pneumonia", True, True, "possible")],  # CheXpert paper, Figure 1
        ),
        # alternatives: "versus", "or", "with or without", "unsure whether", the disfavored of "favored over"
        (
            "Right middle lobe atelectasis versus pneumonia.",  # CMC 97641496
            [("atelectasis", True, True, "alternative"), ("pneumonia", True, True, "alternative")],
        ),
        (
            "Findings suggest volume loss in the lingula, with or without superimposed infection.",  # CMC 97707576
            [("volume loss", True, True, "probable"), ("pneumonia", True, True, "alternative")],
        ),
        (
            "It is unsure whether this represents superimposed pneumonia or atelectasis.",  # CMC 97686282
            [("pneumonia", True, True, "alternative"), ("atelectasis", True, True, "alternative")],
        ),
        (
            "With greater consolidation than volume loss, pneumonia is favored over atelectasis.",  # CMC 99598032
            [
                ("consolidation", True, True, "probable"),
                ("volume loss", True, True, "probable"),
                ("pneumonia", True, True, "probable"),
                ("atelectasis", True, True, "alternative"),
            ],
        ),
        # definite: no grade
        ("Findings consistent with right lower lobe pneumonia.", [("pneumonia", True, False, None)]),  # 98571285
    ],
)
def test_hedge_grades_of_real_sentences(text, want):
    assert _grades(text) == want


def test_unless_conditions_only_its_clause():
    # CMC 97726428 (dev): the pneumonia is a condition, the atelectasis the reader's choice
    assert _grades(
        "Unless there is clinical information supporting pneumonia such as fever and cough, I favor atelectasis."
    ) == [("atelectasis", True, True, "probable")]


def test_hedge_is_not_part_of_the_tuple_identity():
    from dataclasses import replace

    from monailabel_xflow.data.mimic_ils import tuple_to_dict

    (t,) = structure_section("Probable band of atelectasis seen on lateral view only.")
    assert t == replace(t, hedge=None) and "hedge" not in repr(t)
    assert tuple_to_dict(t)["hedge"] == "probable" and "hedge" not in tuple_to_dict(replace(t, hedge=None))


# --- edema and pneumonia as radiologists write them (issue 38) -----------------------------------
# Phrases from the public labelers' mention lists (CheXpert labeler: "heart failure", "chf",
# "indistinctness", "infectious process") and the Fleischner Society glossary (Hansell et al.,
# Radiology 2008: interstitial / alveolar edema, Kerley B lines); the sentences are ours unless
# marked (no edema sentence exists in the CMC dev half). "Vascular congestion" stays apart from
# edema on purpose (see ils/report_rules.py).


@pytest.mark.parametrize(
    "text, want",
    [
        ("Findings consistent with mild congestive heart failure.", [("edema", True, False)]),
        ("Mild CHF.", [("edema", True, False)]),
        ("Kerley B lines at both bases.", [("edema", True, False)]),
        ("Findings likely represent mild interstitial edema.", [("edema", True, True)]),
        ("Indistinct pulmonary vasculature.", [("edema", True, False)]),
        ("Moderate pulmonary oedema.", [("edema", True, False)]),
        ("Findings compatible with volume overload.", [("edema", True, False)]),
        ("Cardiomegaly without overt edema.", [("cardiomegaly", True, False), ("edema", False, False)]),  # CheXpert
        ("No edema or pneumonia.", [("edema", False, False), ("pneumonia", False, False)]),  # CheXpert
        (
            "Pulmonary vascular congestion without frank edema.",
            [("congestion", True, False), ("edema", False, False)],
        ),
    ],
)
def test_edema_phrasings(text, want):
    assert _facts(text) == want


@pytest.mark.parametrize(
    "text",
    [
        "Soft tissue edema of the right chest wall.",
        "Diffuse subcutaneous edema.",
        "Anasarca.",
        "Mild bowel wall edema in the upper abdomen.",
    ],
)
def test_edema_that_is_not_pulmonary_edema(text):
    assert "edema" not in {f.finding for f in structure_section(text)}


@pytest.mark.parametrize(
    "text, want",
    [
        ("Findings worrisome for right lower lobe infection.", [("pneumonia", True, True)]),  # CMC dev
        ("Right lower lobe pneumonic infiltrate.", [("pneumonia", True, False)]),
        ("Multifocal pneumonia.", [("pneumonia", True, False)]),
        ("Findings may represent aspiration pneumonitis.", [("pneumonia", True, True)]),
        ("Bibasilar opacities concerning for superimposed infection.", [("pneumonia", True, True)]),
    ],
)
def test_pneumonia_phrasings(text, want):
    assert _facts(text) == want


@pytest.mark.parametrize(
    "text",
    [
        # CMC 97668880, 99587362, 97668880 (dev)
        "Findings most likely represent reactive airways disease or viral infection.",
        "Peribronchial cuffing which could be due to reactive airways disease or viral infection.",
        "No evidence of an aspirated foreign body.",
        "Post-radiation changes, possibly radiation pneumonitis.",  # ours
        "History of urinary tract infection.",  # ours
    ],
)
def test_infection_that_is_not_pneumonia(text):
    assert "pneumonia" not in {f.finding for f in structure_section(text) if f.present}
