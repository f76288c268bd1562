"""Instructions as careless or hostile users type them (issue 15, item 4): several findings keep
their own locations, an unsupported finding anywhere refuses the request, negations and
questions stay questions. The hypothesis strategy composes real finding and location words."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from monailabel_xflow.instructions import _FINDING_SYNONYMS, InstructionError, parse_instructions
from monailabel_xflow.vocabulary import FINDINGS, ZONES

L, R = "left lung", "right lung"
LB, RB, RA, RU, LM = ZONES[L][3], ZONES[R][3], ZONES[R][0], ZONES[R][1], ZONES[L][2]


def asked(text):
    return [(i.finding, i.regions, i.kind) for i in parse_instructions(text)]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("left effusion, right edema", [("effusion", (L,), "basic"), ("edema", (R,), "basic")]),
        (
            "edema in the right lung; effusion at the left base",
            [("edema", (R,), "basic"), ("effusion", (LB,), "basic")],
        ),
        (
            "effusion on the left and pneumonia in the right upper zone",
            [("effusion", (L,), "basic"), ("pneumonia", (RU,), "basic")],
        ),
        ("edema and effusion in the left lung", [("edema", (L,), "basic"), ("effusion", (L,), "basic")]),
        ("in the left lung, edema and effusion", [("edema", (L,), "basic"), ("effusion", (L,), "basic")]),
        ("cardiomegaly and effusion on the left", [("cardiomegaly", (), "global"), ("effusion", (L,), "basic")]),
        ("effusion on the left and effusion on the right", [("effusion", (L, R), "basic")]),
        (
            "atelectasis in the left mid and lower zones, edema",
            [("atelectasis", (LM, LB), "basic"), ("edema", (LM, LB), "basic")],
        ),
        ("consolidation, opacity at the right apex", [("consolidation", (RA,), "basic"), ("opacity", (RA,), "basic")]),
    ],
)
def test_each_finding_keeps_its_own_location(text, expected):
    assert asked(text) == expected


@pytest.mark.parametrize(
    "text,named",
    [
        ("pleural effusion or pneumothorax?", "pneumothorax"),
        ("edema, nodules in the right lung", "nodule"),
        ("segment the effusion and the mass", "mass"),
        ("left effusion; right rib fracture", "fracture"),
    ],
)
def test_an_unsupported_finding_anywhere_refuses_the_request(text, named):
    with pytest.raises(InstructionError) as err:
        parse_instructions(text)
    message = str(err.value)
    assert named in message and all(f in message for f in FINDINGS)  # names it, lists what is supported


@pytest.mark.parametrize(
    "text,plain",
    [
        ("no effusion on the left?", "Segment the effusion in the left lung."),
        ("is there no edema?", "Segment the edema."),
        ("rule out effusion in the right base", "Segment the effusion in the right lung base."),
        ("Is there any consolidation in the left lung?", "Segment the consolidation in the left lung."),
        ("no pneumonia, right lung", "Segment the pneumonia in the right lung."),
    ],
)
def test_negations_and_questions_stay_questions(text, plain):
    assert parse_instructions(text) == parse_instructions(plain)


LOCATIONS = [  # (phrase, regions)
    ("in the left lung", (L,)),
    ("on the right", (R,)),
    ("in the left lung base", (LB,)),
    ("at the right apex", (RA,)),
    ("in both lungs", (R, L)),
    ("in the right upper zone", (RU,)),
    ("at the right base", (RB,)),
    ("in the left mid zone", (LM,)),
]
LUNG_FINDINGS = [f for f in FINDINGS if f != "cardiomegaly"]


@st.composite
def multi_finding_requests(draw):
    """Text naming 1..3 different findings (any synonym), each with its own location, joined
    with the separators people use, optionally as a question or a negation."""
    findings = draw(st.lists(st.sampled_from(LUNG_FINDINGS), min_size=1, max_size=3, unique=True))
    parts, expected = [], []
    for finding in findings:
        synonym = draw(st.sampled_from(_FINDING_SYNONYMS[finding]))
        phrase, regions = draw(st.sampled_from(LOCATIONS))
        lead = draw(st.sampled_from(["", "segment the ", "is there ", "no ", "any "]))
        parts.append(f"{lead}{synonym} {phrase}")
        expected.append((finding, regions))
    separator = draw(st.sampled_from([", ", "; ", " and ", ", and ", " or "]))
    end = draw(st.sampled_from(["", ".", "?"]))
    return separator.join(parts) + end, expected


@settings(max_examples=150, deadline=None)
@given(multi_finding_requests())
def test_composed_requests_keep_every_finding_with_its_location(case):
    text, expected = case
    got = [(i.finding, i.regions) for i in parse_instructions(text)]
    assert got == expected, text
    assert all(i.kind == "basic" for i in parse_instructions(text))


@settings(max_examples=60, deadline=None)
@given(
    multi_finding_requests(), st.sampled_from(["pneumothorax", "nodule", "fracture", "emphysema"]), st.integers(0, 3)
)
def test_composed_requests_with_an_unsupported_finding_are_refused(case, bad, where):
    text, _ = case
    parts = text.split(" ")
    parts.insert(min(where, len(parts)), f"{bad},")
    with pytest.raises(InstructionError, match=bad):
        parse_instructions(" ".join(parts))


@pytest.mark.parametrize(
    "text,negated",
    [
        ("effusion, not on the left", "not on the left"),
        ("Segment the effusion not in the left lung.", "not in the left lung"),
        ("edema except the right lung", "except the right lung"),
        ("opacity excluding the left upper zone", "excluding the left upper zone"),
        ("effusion other than the left", "other than the left"),
        ("pneumonia without the right lung", "without the right lung"),
        ("effusion in the left lung, not the right", "not the right"),
        ("effusion that isn't on the left", "isn't on the left"),
        ("segment all findings except the heart", "except the heart"),
    ],
)
def test_a_negated_location_is_refused_not_flipped(text, negated):
    with pytest.raises(InstructionError) as err:
        parse_instructions(text)
    message = str(err.value)
    assert "negated locations" in message and repr(negated) in message and "name the region" in message


@pytest.mark.parametrize(
    "text,plain",
    [
        ("note effusion on the left", "Segment the effusion in the left lung."),
        ("another effusion on the left", "Segment the effusion in the left lung."),
        ("is there effusion or not? left lung", "Segment the effusion in the left lung."),
        ("not effusion", "Segment the effusion."),
        ("is there not an effusion on the left?", "Segment the effusion in the left lung."),
    ],
)
def test_negation_not_on_a_location_is_not_refused(text, plain):
    assert parse_instructions(text) == parse_instructions(plain)


@pytest.mark.parametrize(
    "text,excluded",
    [
        ("all findings except effusion", "except effusion"),
        ("Segment all findings but the effusion.", "but the effusion"),
        ("everything except pleural effusion", "except pleural effusion"),
        ("any finding other than cardiomegaly", "other than cardiomegaly"),
        ("Segment every abnormality excluding the edema.", "excluding the edema"),
        ("effusion, not pneumonia", "not pneumonia"),
        ("Segment the opacity, not the effusion.", "not the effusion"),
        ("consolidation without effusion in the left lung", "without effusion"),
        ("edema rather than effusion", "rather than effusion"),
        ("edema but not effusion, right lung", "not effusion"),
        ("all findings in the left lung apart from the atelectasis", "apart from the atelectasis"),
    ],
)
def test_an_excluded_finding_is_refused_not_asked(text, excluded):
    """Read word by word, these ask about the very finding the user excluded (all seven findings,
    or both named ones); refused in one line instead, naming the exclusion."""
    with pytest.raises(InstructionError) as err:
        parse_instructions(text)
    message = str(err.value)
    assert "excluding a finding" in message and repr(excluded) in message and "name the findings" in message


@pytest.mark.parametrize(
    "text,plain",
    [
        ("not effusion", "Segment the effusion."),  # one finding: a question, as before
        ("is there not an effusion on the left?", "Segment the effusion in the left lung."),
        ("Is there effusion or not?", "Segment the effusion."),
        ("effusion but also edema", "Segment the effusion and the edema."),
        ("all findings, but only in the left lung", "Segment all findings in the left lung."),
        ("no effusion and no edema on the left?", "Segment the effusion and the edema in the left lung."),
    ],
)
def test_a_negation_that_excludes_no_finding_is_not_refused(text, plain):
    assert parse_instructions(text) == parse_instructions(plain)


@settings(max_examples=60, deadline=None)
@given(multi_finding_requests(), st.sampled_from(["except", "excluding", "other than", "but not", "rather than"]))
def test_composed_requests_excluding_a_finding_are_refused(case, exclusion):
    text, expected = case
    excluded = next(f for f in FINDINGS if f not in {f for f, _ in expected})
    with pytest.raises(InstructionError, match="excluding a finding"):
        parse_instructions(f"{text.rstrip('.?')} {exclusion} the {excluded}")


@settings(max_examples=60, deadline=None)
@given(
    multi_finding_requests(),
    st.sampled_from(["not", "except", "excluding", "other than", "without"]),
    st.sampled_from([p for p, _ in LOCATIONS] + ["the left lung", "the right upper zone"]),
)
def test_composed_requests_with_a_negated_location_are_refused(case, negation, phrase):
    text, _ = case
    with pytest.raises(InstructionError, match="negated locations"):
        parse_instructions(f"{text.rstrip('.?')} {negation} {phrase}")


@settings(max_examples=60, deadline=None)
@given(multi_finding_requests(), st.sampled_from(["in the liver", "of the spine", "in the abdomen", "near the kidney"]))
def test_composed_requests_with_an_unknown_location_are_refused(case, where):
    text, _ = case
    with pytest.raises(InstructionError, match="is not a location XFlow knows"):
        parse_instructions(f"{text.rstrip('.?')} {where}")
