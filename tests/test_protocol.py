"""The policies' text protocol: round trips, malformed text, never crashing (hypothesis)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from monailabel_xflow.geometry import Click
from monailabel_xflow.policy.protocol import (
    TAGS,
    BoxRef,
    ProtocolError,
    Stage1Output,
    Stage2Action,
    format_stage1,
    format_stage2,
    parse_stage1,
    parse_stage2,
)
from monailabel_xflow.vocabulary import FINDINGS, LUNGS

GOOD = (
    "<think>fluid at the left base</think>\n"
    "<ref>left lung</ref><|box_start|>(520,180),(900,820)<|box_end|>\n"
    "<answer>present</answer>\n"
    "<ref>effusion</ref><|box_start|>(600,640),(880,810)<|box_end|>"
)


def test_reads_the_documented_example():
    p = parse_stage1(GOOD)
    assert p.ok, p.problems
    assert p.value.present is True
    assert p.value.lungs == [BoxRef("left lung", (0.52, 0.18, 0.9, 0.82))]
    assert p.value.lesions == [BoxRef("effusion", (0.6, 0.64, 0.88, 0.81))]
    assert p.value.think == "fluid at the left base"


def test_absent_reads_as_absent_and_drops_lesion_boxes():
    p = parse_stage1("<think></think><answer>absent</answer><ref>effusion</ref><|box_start|>(1,1),(5,5)<|box_end|>")
    assert p.value.present is False and p.value.lesions == []
    assert any("after 'absent'" in s for s in p.problems)


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("<answer>present</answer><ref>effusion</ref><|box_start|>(1,1),(5,5)<|box_end|>", "missing <think>"),
        ("<think></think>", "missing <answer>"),
        ("<think></think><answer>maybe</answer>", "unreadable answer"),
        (
            "<think></think><answer>present</answer><ref>effusion</ref><|box_start|>(1,1)(5,5)<|box_end|>",
            "malformed box",
        ),
        (
            "<think></think><answer>present</answer><ref>effusion</ref><|box_start|>(1,1),(5000,5)<|box_end|>",
            "out of range",
        ),
        ("<think></think><answer>present</answer><ref>effusion</ref><|box_start|>(9,9),(5,5)<|box_end|>", "inverted"),
        ("<think></think><answer>present</answer><ref>effusion</ref><|box_start|>(5,1),(5,9)<|box_end|>", "empty box"),
        (
            "<think></think><answer>present</answer><ref>tumour</ref><|box_start|>(1,1),(5,5)<|box_end|>",
            "unknown box label",
        ),
        ("<think></think><answer>present</answer>", "without a lesion box"),
        ("<think></think><answer>absent</answer> and some chatter", "unexpected text"),
        ("<think></think><answer>absent</answer><answer>present</answer>", "more than one answer"),
    ],
)
def test_malformed_stage1_is_reported(text, fragment):
    p = parse_stage1(text)
    assert any(fragment in s for s in p.problems), p.problems


def test_out_of_range_and_inverted_boxes_are_repaired():
    p = parse_stage1(
        "<think></think><answer>present</answer><ref>effusion</ref><|box_start|>(900,100),(-5,1200)<|box_end|>"
    )
    assert p.value.lesions == [BoxRef("effusion", (0.0, 0.1, 0.9, 1.0))]


def test_duplicates_are_dropped_and_counted():
    box = "<ref>opacity</ref><|box_start|>(100,100),(200,200)<|box_end|>"
    p = parse_stage1("<think></think><answer>present</answer>" + box * 3)
    assert len(p.value.lesions) == 1
    assert p.duplicates == 2


def test_pleural_effusion_label_is_a_synonym():
    p = parse_stage1(
        "<think></think><answer>present</answer><ref>pleural effusion</ref><|box_start|>(1,1),(5,5)<|box_end|>"
    )
    assert p.value.lesions[0].label == "effusion"


def test_stage2_click_and_stop():
    p = parse_stage2("<think>missed the lower edge</think><click>positive (250,750)</click>")
    assert p.ok and p.value.click == Click(True, 0.25, 0.75)
    p = parse_stage2("<think>done</think><stop/>")
    assert p.ok and p.value.stop


@pytest.mark.parametrize(
    "text,fragment,stop",
    [
        ("<think></think>", "no readable action", True),
        ("<think></think><click>sideways (1,2)</click>", "malformed click", True),
        ("<think></think><click>negative (1200,5)</click>", "out of range", False),
        ("<think></think><stop/><click>positive (1,2)</click>", "2 actions", True),
        ("<click>positive (1,2)</click>", "missing <think>", False),
    ],
)
def test_malformed_stage2_is_reported(text, fragment, stop):
    p = parse_stage2(text)
    assert any(fragment in s for s in p.problems), p.problems
    assert p.value.stop is stop


def test_formatting_refuses_impossible_values():
    with pytest.raises(ProtocolError):
        format_stage1(Stage1Output(present=None))
    with pytest.raises(ProtocolError):
        format_stage1(Stage1Output(present=False, lesions=[BoxRef("edema", (0, 0, 0.5, 0.5))]))
    with pytest.raises(ProtocolError):
        format_stage1(Stage1Output(present=True, lesions=[BoxRef("edema", (0.6, 0, 0.5, 0.5))]))
    with pytest.raises(ProtocolError):
        format_stage2(Stage2Action(Click(True, 1.5, 0.2)))


def test_non_text_input_raises_protocol_error_only():
    with pytest.raises(ProtocolError):
        parse_stage1(None)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError):
        parse_stage2(b"<stop/>")  # type: ignore[arg-type]


# --- property tests ----------------------------------------------------------------------

_coord = st.integers(0, 1000)


@st.composite
def _boxes(draw, labels):
    x1, x2 = sorted(draw(st.lists(_coord, min_size=2, max_size=2, unique=True)))
    y1, y2 = sorted(draw(st.lists(_coord, min_size=2, max_size=2, unique=True)))
    return BoxRef(draw(st.sampled_from(labels)), (x1 / 1000, y1 / 1000, x2 / 1000, y2 / 1000))


@st.composite
def _stage1(draw):
    present = draw(st.booleans())
    lungs = draw(st.lists(_boxes(LUNGS), max_size=2, unique=True))
    lesions = draw(st.lists(_boxes(FINDINGS), min_size=1, max_size=4, unique=True)) if present else []
    think = draw(st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=30)).strip()
    return Stage1Output(lungs, present, lesions, think)


@given(_stage1())
def test_stage1_round_trip(out):
    p = parse_stage1(format_stage1(out))
    assert p.ok, p.problems
    assert p.value == out


@given(
    st.one_of(
        st.none(), st.builds(Click, st.booleans(), _coord.map(lambda v: v / 1000), _coord.map(lambda v: v / 1000))
    )
)
def test_stage2_round_trip(click):
    action = Stage2Action(click, "why")
    p = parse_stage2(format_stage2(action))
    assert p.ok and p.value == action


_noise = st.text(alphabet=st.sampled_from(list("()<>,/|-0123456789 abcdefghijklmnopqrstuvwxyz_")), max_size=80)


@given(
    st.lists(
        st.one_of(st.sampled_from(TAGS + ("left lung", "effusion", "present", "(1,2),(3,4)")), _noise), max_size=25
    ).map("".join)
)
def test_arbitrary_text_never_crashes(text):
    for parse in (parse_stage1, parse_stage2):
        p = parse(text)
        assert isinstance(p.problems, list)
