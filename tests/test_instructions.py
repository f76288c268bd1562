"""Instructions: canonical rendering, free-text parsing (a table of phrasings), round trips."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monailabel_xflow.instructions import (
    MAX_INSTRUCTION_CHARS,
    Instruction,
    InstructionError,
    all_findings,
    parse_instruction,
    parse_instructions,
)
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS, ZONES

L, R = "left lung", "right lung"
LB, LM, LU, LA = ZONES[L][3], ZONES[L][2], ZONES[L][1], ZONES[L][0]
RB, RM, RU, RA = ZONES[R][3], ZONES[R][2], ZONES[R][1], ZONES[R][0]

# (free text, expected (finding, regions, kind))
PHRASINGS = [
    ("Segment the effusion in the left lung.", ("effusion", (L,), "basic")),
    ("Segment the effusion.", ("effusion", (), "global")),
    ("is there fluid on the left?", ("effusion", (L,), "basic")),
    ("pleural effusion, left base", ("effusion", (LB,), "basic")),
    ("Pleural effusions at the base of the right lung", ("effusion", (RB,), "basic")),
    ("any effusion in the right lung base?", ("effusion", (RB,), "basic")),
    ("left-sided pleural fluid", ("effusion", (L,), "basic")),
    ("Segment the cardiomegaly.", ("cardiomegaly", (), "global")),
    ("Segment the cardiomegaly in the heart.", ("cardiomegaly", ("heart",), "basic")),
    ("enlarged heart?", ("cardiomegaly", (), "global")),
    ("Is the heart enlarged", ("cardiomegaly", (), "global")),
    ("show the cardiac enlargement", ("cardiomegaly", (), "global")),
    ("Segment the pneumonia in the right lung.", ("pneumonia", (R,), "basic")),
    ("pneumonia right upper zone", ("pneumonia", (RU,), "basic")),
    ("Where is the pneumonia?", ("pneumonia", (), "global")),
    ("Segment the atelectasis in the left lung base.", ("atelectasis", (LB,), "basic")),
    ("left basal atelectasis", ("atelectasis", (LB,), "basic")),
    ("collapse of the right lower zone", ("atelectasis", (RB,), "basic")),
    ("left mid and lower zone atelectasis", ("atelectasis", (LM, LB), "basic")),
    ("Segment the opacity in the right mid zone lung.", ("opacity", (RM,), "basic")),
    ("opacities in the upper zones", ("opacity", (RU, LU), "basic")),
    ("airspace opacity right apex", ("opacity", (RA,), "basic")),
    ("haziness at the left apex", ("opacity", (LA,), "basic")),
    ("Segment the opacity in the left lung and predict its type.", ("opacity", (L,), "lesion_inference")),
    ("Segment the opacity in the right upper zone lung and predict its type.", ("opacity", (RU,), "lesion_inference")),
    ("what type is the opacity in the right lung", ("opacity", (R,), "lesion_inference")),
    ("Segment the opacity and predict its type.", ("opacity", (), "lesion_inference")),
    ("Segment the consolidation in the left upper zone lung.", ("consolidation", (LU,), "basic")),
    ("consolidated right middle zone", ("consolidation", (RM,), "basic")),
    ("consolidation", ("consolidation", (), "global")),
    ("Segment the edema.", ("edema", (), "global")),
    ("pulmonary oedema in both lungs", ("edema", (R, L), "basic")),
    ("bilateral edema", ("edema", (R, L), "basic")),
    ("fluid overload", ("edema", (), "global")),
    ("Segment the effusion in the left lung base and left mid zone lung.", ("effusion", (LB, LM), "basic")),
    ("Segment the effusion in the right lung and left lung.", ("effusion", (R, L), "basic")),
    ("effusion in both bases", ("effusion", (RB, LB), "basic")),
    ("SEGMENT THE EFFUSION IN THE LEFT LUNG", ("effusion", (L,), "basic")),
    ("  segment   the   effusion   in the  left   lung  ", ("effusion", (L,), "basic")),
    ("opacity in the right apical zone lung", ("opacity", (RA,), "basic")),
    ("right lung consolidation", ("consolidation", (R,), "basic")),
    ("Is there any atelectasis in the left upper zone?", ("atelectasis", (LU,), "basic")),
]


@pytest.mark.parametrize("text,expected", PHRASINGS, ids=[p[0][:40] for p in PHRASINGS])
def test_phrasings(text, expected):
    got = parse_instruction(text)
    assert (got.finding, got.regions, got.kind) == expected


def test_table_is_large_enough():
    assert len(PHRASINGS) >= 40


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("", "empty"),
        ("   ?  ", "empty"),
        ("x" * (MAX_INSTRUCTION_CHARS + 1), "at most"),
        ("pneumothorax on the right", "pneumothorax"),
        ("segment the nodule", "nodule"),
        ("hello there", "no supported finding"),
        ("cardiomegaly in the left lung", "chest level"),
    ],
)
def test_refusals_say_why_and_list_what_is_supported(text, fragment):
    with pytest.raises(InstructionError) as err:
        parse_instructions(text)
    assert fragment in str(err.value)


def test_unmappable_error_lists_supported_findings():
    with pytest.raises(InstructionError) as err:
        parse_instructions("segment the weird thing")
    assert all(f in str(err.value) for f in FINDINGS)


def test_non_text_is_refused():
    with pytest.raises(InstructionError):
        parse_instructions(None)  # type: ignore[arg-type]


def test_all_findings_expands_to_one_per_finding():
    found = parse_instructions("segment all findings")
    assert [i.finding for i in found] == list(FINDINGS)
    assert {i.level for i in found} == {"chest"}
    left = all_findings(("left lung",))
    assert "cardiomegaly" not in [i.finding for i in left]
    assert {i.regions for i in left} == {("left lung",)}


def test_several_findings_in_one_sentence():
    found = parse_instructions("effusion and atelectasis in the left base")
    assert [(i.finding, i.regions) for i in found] == [("effusion", (LB,)), ("atelectasis", (LB,))]
    with pytest.raises(InstructionError, match="asks about 2 findings"):
        parse_instruction("effusion and atelectasis in the left base")


def test_longest_synonym_wins():
    assert parse_instruction("fluid overload").finding == "edema"
    assert parse_instruction("fluid").finding == "effusion"


def test_canonical_strings_and_answers():
    i = Instruction("effusion", (L,))
    assert i.text == "Segment the effusion in the left lung."
    assert i.level == "lung"
    assert i.absent_answer() == "There is no effusion in the left lung."
    g = Instruction("effusion", (), "global")
    assert g.text == "Segment the effusion."
    assert g.absent_answer() == "There is no effusion."
    assert g.located_answer([LB, LM]) == "It is located in the left lung base and left mid zone lung."
    li = Instruction("opacity", (RU,), "lesion_inference")
    assert li.text == "Segment the opacity in the right upper zone lung and predict its type."
    assert li.absent_answer() == "There is no opacity in the right upper zone lung."
    assert li.lesion_answer("pneumonia", True) == "It is highly suggestive of pneumonia."
    assert li.lesion_answer("edema", False) == "It possibly reflects edema."
    with pytest.raises(InstructionError):
        li.lesion_answer("effusion", True)


def test_levels_and_grounded_lungs():
    assert Instruction("edema", (), "global").lungs == (R, L)
    assert Instruction("edema", (LB,)).lungs == (L,)
    assert Instruction("edema", (RB, L)).lungs == (R, L)
    assert Instruction("edema", (RB,)).level == "zone"
    assert Instruction("cardiomegaly", ("heart",)).level == "chest"


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(finding="pneumothorax"),
        dict(finding="effusion", regions=("left lobe",)),
        dict(finding="effusion", regions=("heart",)),
        dict(finding="cardiomegaly", regions=(L,)),
        dict(finding="effusion", regions=(L,), kind="global"),
        dict(finding="effusion", regions=(), kind="basic"),
        dict(finding="effusion", regions=(L,), kind="lesion_inference"),
        dict(finding="effusion", regions=(L,), kind="other"),
    ],
)
def test_invalid_instructions_are_refused(kwargs):
    with pytest.raises(InstructionError):
        Instruction(**kwargs)


def _instructions():
    lung_region_sets = st.lists(st.sampled_from(LUNGS + ALL_ZONES), min_size=1, max_size=3, unique=True)
    lung_findings = st.sampled_from([f for f in FINDINGS if f != "cardiomegaly"])
    return st.one_of(
        st.builds(lambda f, r: Instruction(f, tuple(r), "basic"), lung_findings, lung_region_sets),
        st.builds(lambda f: Instruction(f, (), "global"), st.sampled_from(FINDINGS)),
        st.builds(
            lambda r: Instruction("opacity", tuple(r), "lesion_inference"),
            st.lists(st.sampled_from(LUNGS + ALL_ZONES), max_size=2, unique=True),
        ),
        st.just(Instruction("cardiomegaly", ("heart",), "basic")),
    )


@given(_instructions())
def test_render_then_parse_is_identity(instruction):
    assert parse_instruction(instruction.text) == instruction


@given(st.text(max_size=MAX_INSTRUCTION_CHARS))
def test_arbitrary_text_parses_or_raises_instruction_error(text):
    try:
        found = parse_instructions(text)
    except InstructionError:
        return
    assert found and all(isinstance(i, Instruction) for i in found)


def test_picker_choices_build_what_the_same_words_parse_to():
    """The app's pickers build instructions directly; typed as text, the same choices parse to
    the same instructions (every finding and "all findings" x every ordered pair of locations)."""
    import itertools

    from monailabel_xflow.instructions import ALL_FINDINGS, InstructionError, from_choices, parse_instructions
    from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS

    def outcome(build):
        try:
            return build()
        except InstructionError:
            return "refused"

    compared = refused = 0
    for finding in [*FINDINGS, ALL_FINDINGS]:
        for k in (0, 1, 2):
            for locations in itertools.permutations([*LUNGS, *ALL_ZONES], k):
                where = f" in the {' and '.join(locations)}" if locations else ""
                typed = outcome(lambda: list(dict.fromkeys(parse_instructions(f"segment {finding}{where}"))))  # noqa: B023 -- called here
                assert outcome(lambda: from_choices([finding], locations)) == typed, (finding, locations)  # noqa: B023 -- called here
                compared += 1
                refused += typed == "refused"
    assert compared == 808 and 0 < refused < compared


# --- locations are refused, never dropped or flipped (audit: "effusion in the heart" was asked at
# chest level, "effusion in the liver" likewise, "effusion, not on the left" as the left lung) ---


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("Segment the effusion in the heart.", "'heart' is the region of cardiomegaly only, not of effusion"),
        ("pneumonia around the heart", "'heart' is the region of cardiomegaly only, not of pneumonia"),
        ("edema in the cardiac region", "'heart' is the region of cardiomegaly only, not of edema"),
        ("cardiomegaly and effusion in the heart", "not of effusion"),
        ("what type is the opacity in the heart", "not of opacity"),
        ("Segment the effusion in the liver.", "'in the liver' is not a location XFlow knows"),
        ("effusion in the abdomen", "'in the abdomen' is not a location"),
        ("atelectasis of the spine", "'of the spine' is not a location"),
        ("edema in the patient's liver", "is not a location"),
        ("Is there effusion in the liver? Segment it.", "'in the liver' is not a location"),
        ("effusion on the other side", "'on the other side' is not a location"),
    ],
)
def test_heart_and_unknown_locations_are_refused(text, fragment):
    with pytest.raises(InstructionError) as err:
        parse_instructions(text)
    message = str(err.value)
    assert fragment in message and all(lung in message for lung in LUNGS)  # says what is supported
    assert "\n" not in message


@pytest.mark.parametrize(
    "text,canonical",
    [
        ("Segment the effusion in the left lung.", ["Segment the effusion in the left lung."]),
        ("Segment the effusion in the image.", ["Segment the effusion."]),
        ("effusion in this radiograph", ["Segment the effusion."]),
        ("effusion in this chest x-ray", ["Segment the effusion."]),
        ("Segment the edema on this film.", ["Segment the edema."]),
        ("effusion in the chest", ["Segment the effusion."]),
        ("edema in the lungs", ["Segment the edema."]),
        ("edema in both lungs", ["Segment the edema in the right lung and left lung."]),
        ("is there effusion in the patient?", ["Segment the effusion."]),
        ("Is there effusion in the image? Segment it.", ["Segment the effusion."]),
        ("effusion in the patient's left lung", ["Segment the effusion in the left lung."]),
        ("the extent of the effusion on the left", ["Segment the effusion in the left lung."]),
        ("edema in a butterfly pattern", ["Segment the edema."]),  # "a" describes, it does not locate
        ("cardiomegaly in the heart", ["Segment the cardiomegaly in the heart."]),
        ("cardiomegaly around the heart", ["Segment the cardiomegaly."]),
        ("effusion and cardiomegaly in the heart", ["Segment the effusion.", "Segment the cardiomegaly in the heart."]),
        ("segment all findings in the heart", ["Segment the cardiomegaly in the heart."]),
        # a part of a known place is read as that place
        ("effusion in the periphery of the left lung", ["Segment the effusion in the left lung."]),
    ],
)
def test_phrasings_without_a_location_still_parse(text, canonical):
    assert [i.text for i in parse_instructions(text)] == canonical


def test_every_rendered_phrasing_parses_back():
    """What the ILS builders and trainers ask (:func:`phrasings` of every instruction they make)
    is never refused by the location checks."""
    import itertools

    from monailabel_xflow.instructions import phrasings

    regions = LUNGS + ALL_ZONES
    asked = [Instruction(f, (), "global") for f in FINDINGS] + [Instruction("cardiomegaly", ("heart",))]
    asked += [Instruction("opacity", (), "lesion_inference")]
    for k in (1, 2):
        for where in itertools.permutations(regions, k):
            asked += [Instruction(f, where) for f in FINDINGS if f != "cardiomegaly"]
            asked.append(Instruction("opacity", where, "lesion_inference"))
    for instruction in asked:
        for text in phrasings(instruction):
            assert parse_instruction(text) == instruction, text
