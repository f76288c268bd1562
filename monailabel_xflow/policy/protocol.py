"""The text protocol of the two policies: one grammar, formatter and parser.

Inference, SFT target building and the RL format reward all use this module, so what a model
is trained to write is exactly what the workflow reads.

Stage 1 (π_init)::

    <think>…</think>
    <ref>left lung</ref><|box_start|>(x1,y1),(x2,y2)<|box_end|>      one per grounded lung
    <answer>present</answer>                                           or <answer>absent</answer>
    <ref>effusion</ref><|box_start|>(x1,y1),(x2,y2)<|box_end|>       zero or more lesion boxes

Stage 2 (π_rev), one action per turn::

    <think>…</think><click>positive (x,y)</click>      or      <think>…</think><stop/>

Coordinates in text are integers 0–1000, x first; in code they are normalised (geometry.py).
A model's output is untrusted: the parsers never raise anything but :class:`ProtocolError`
(and only for a non-string input); everything malformed is reported in ``Parsed.problems``,
and duplicate boxes are dropped and counted (the RL repetition penalty reads the count).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Box, Click, box_from_text, box_to_text, from_text, to_text
from monailabel_xflow.vocabulary import ABSENT, FINDINGS, HEART, LUNGS, PRESENT

T = TypeVar("T")

BOX_START, BOX_END = "<|box_start|>", "<|box_end|>"
STOP = "<stop/>"
TAGS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<ref>",
    "</ref>",
    BOX_START,
    BOX_END,
    "<answer>",
    "</answer>",
    "<click>",
    "</click>",
    STOP,
)
"""Every marker of the grammar (tokenizers add them as single tokens)."""


class ProtocolError(InputError):
    """Raised only for a value that cannot be formatted or a parse input that is not text."""


@dataclass(frozen=True)
class BoxRef:
    """A labelled box: ``label`` is a lung, a finding, or ``heart``; ``box`` normalised xyxy."""

    label: str
    box: Box


@dataclass
class Stage1Output:
    """What π_init decides: grounded lungs, presence, lesion boxes.

    ``present`` is None when the text states no (readable) answer.
    """

    lungs: list[BoxRef] = field(default_factory=list)
    present: bool | None = None
    lesions: list[BoxRef] = field(default_factory=list)
    think: str = ""


@dataclass
class Stage2Action:
    """One π_rev action: a click, or ``click=None`` for stop."""

    click: Click | None = None
    think: str = ""

    @property
    def stop(self) -> bool:
        return self.click is None


@dataclass
class Parsed(Generic[T]):
    """A parse result: the best value that could be read, and what was wrong with the text."""

    value: T
    problems: list[str] = field(default_factory=list)
    duplicates: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems


# --- formatting -----------------------------------------------------------------------------


def _check_box(box: Box) -> None:
    if len(box) != 4 or not (0 <= box[0] <= box[2] <= 1 and 0 <= box[1] <= box[3] <= 1):
        raise ProtocolError(f"box {box} is not a normalised xyxy box inside [0, 1]")


def box_text(box: Box) -> str:
    """A box's coordinates in the grammar: ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>`` (0-1000)."""
    x1, y1, x2, y2 = box_to_text(box)
    return f"{BOX_START}({x1},{y1}),({x2},{y2}){BOX_END}"


def format_box(ref: BoxRef) -> str:
    _check_box(ref.box)
    return f"<ref>{ref.label}</ref>{box_text(ref.box)}"


def format_stage1(out: Stage1Output) -> str:
    """Render π_init's output in the protocol (one element per line)."""
    if out.present is None:
        raise ProtocolError("a Stage 1 output to format must state presence")
    if not out.present and out.lesions:
        raise ProtocolError("an absent finding has no lesion boxes")
    lines = [f"<think>{out.think}</think>"]
    lines += [format_box(r) for r in out.lungs]
    lines.append(f"<answer>{PRESENT if out.present else ABSENT}</answer>")
    lines += [format_box(r) for r in out.lesions]
    return "\n".join(lines)


def format_stage2(action: Stage2Action) -> str:
    """Render one π_rev action in the protocol."""
    think = f"<think>{action.think}</think>"
    if action.click is None:
        return think + STOP
    c = action.click
    if not (0 <= c.x <= 1 and 0 <= c.y <= 1):
        raise ProtocolError(f"click {c} lies outside the image")
    return f"{think}<click>{'positive' if c.positive else 'negative'} ({to_text(c.x)},{to_text(c.y)})</click>"


# --- parsing --------------------------------------------------------------------------------

_INT = r"\s*(-?\d{1,6})\s*"
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_REF_BOX = re.compile(r"<ref>(.*?)</ref>\s*" + re.escape(BOX_START) + r"(.*?)" + re.escape(BOX_END), re.S)
_BOX_BODY = re.compile(rf"^\s*\({_INT},{_INT}\)\s*,\s*\({_INT},{_INT}\)\s*$")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
_CLICK = re.compile(r"<click>(.*?)</click>", re.S)
_CLICK_BODY = re.compile(rf"^\s*(positive|negative)\s*\({_INT},{_INT}\)\s*$", re.I)
_LESION_LABELS = set(FINDINGS) | {HEART, "pleural effusion"}


def _require_text(text: object) -> str:
    if not isinstance(text, str):
        raise ProtocolError(f"policy output must be text, got {type(text).__name__}")
    return text


def _leftover(text: str, patterns: list[re.Pattern[str]]) -> str:
    for p in patterns:
        text = p.sub(" ", text)
    return text.strip()


def _read_box(body: str, label: str, problems: list[str]) -> Box | None:
    m = _BOX_BODY.match(body)
    if not m:
        problems.append(f"malformed box for {label!r}: {body.strip()[:40]!r}")
        return None
    v = [int(g) for g in m.groups()]
    if any(not 0 <= c <= 1000 for c in v):
        problems.append(f"box for {label!r} out of range 0-1000: {v}; clipped")
        v = [min(1000, max(0, c)) for c in v]
    if v[0] > v[2] or v[1] > v[3]:
        problems.append(f"inverted box for {label!r}: {v}; corners reordered")
        v = [min(v[0], v[2]), min(v[1], v[3]), max(v[0], v[2]), max(v[1], v[3])]
    if v[0] == v[2] or v[1] == v[3]:
        problems.append(f"empty box for {label!r}: {v}; dropped")
        return None
    return box_from_text(v)


def parse_stage1(text: str) -> Parsed[Stage1Output]:
    """Read π_init's output. Never raises on bad text; see ``problems``.

    Rules: lung boxes are refs labelled with a lung; lesion boxes are refs labelled with a
    finding (``pleural effusion`` read as ``effusion``) or ``heart``; an unreadable or missing
    answer leaves ``present=None``; lesion boxes after ``absent`` are dropped; identical boxes
    with the same label are dropped and counted in ``duplicates``.
    """
    text = _require_text(text)
    problems: list[str] = []
    out = Stage1Output()
    duplicates = 0

    thinks = _THINK.findall(text)
    if not thinks:
        problems.append("missing <think>…</think>")
    else:
        out.think = thinks[0].strip()
        if len(thinks) > 1:
            problems.append(f"{len(thinks)} <think> blocks; the first is kept")

    answers = [(m.start(), m.group(1).strip().lower()) for m in _ANSWER.finditer(text)]
    readable = [(pos, a) for pos, a in answers if a in (PRESENT, ABSENT)]
    answer_pos = readable[0][0] if readable else None
    if not answers:
        problems.append("missing <answer>present|absent</answer>")
    elif not readable:
        problems.append(f"unreadable answer {answers[0][1][:30]!r}")
    else:
        out.present = readable[0][1] == PRESENT
        if len({a for _, a in readable}) > 1 or len(answers) > 1:
            problems.append("more than one answer; the first is kept")

    seen: set[tuple[str, Box]] = set()
    for m in _REF_BOX.finditer(text):
        label = " ".join(m.group(1).lower().split())
        box = _read_box(m.group(2), label, problems)
        if box is None:
            continue
        if (label, box) in seen:
            duplicates += 1
            continue
        seen.add((label, box))
        if label in LUNGS:
            if answer_pos is not None and m.start() > answer_pos:
                problems.append(f"lung box {label!r} after the answer")
            out.lungs.append(BoxRef(label, box))
        elif label in _LESION_LABELS:
            if answer_pos is not None and m.start() < answer_pos:
                problems.append(f"lesion box {label!r} before the answer")
            out.lesions.append(BoxRef("effusion" if label == "pleural effusion" else label, box))
        else:
            problems.append(f"unknown box label {label[:30]!r}; dropped")
    if duplicates:
        problems.append(f"{duplicates} duplicate box(es) dropped")
    if out.present is False and out.lesions:
        problems.append(f"{len(out.lesions)} lesion box(es) after 'absent'; dropped")
        out.lesions = []
    if out.present and not out.lesions:
        problems.append("'present' without a lesion box")

    rest = _leftover(text, [_THINK, _REF_BOX, _ANSWER])
    if rest:
        problems.append(f"unexpected text: {rest[:40]!r}")
    return Parsed(out, problems, duplicates)


def parse_stage2(text: str) -> Parsed[Stage2Action]:
    """Read one π_rev action. Never raises on bad text; see ``problems``.

    Rules: the first well-formed ``<click>`` or ``<stop/>`` (whichever comes first) is the
    action; a click outside 0–1000 is clipped and reported; text with no readable action is
    read as stop, with a problem saying so.
    """
    text = _require_text(text)
    problems: list[str] = []
    thinks = _THINK.findall(text)
    think = thinks[0].strip() if thinks else ""
    if not thinks:
        problems.append("missing <think>…</think>")

    actions: list[tuple[int, Click | None]] = []
    for m in _CLICK.finditer(text):
        body = _CLICK_BODY.match(m.group(1))
        if not body:
            problems.append(f"malformed click {m.group(1).strip()[:40]!r}")
            continue
        x, y = int(body.group(2)), int(body.group(3))
        if not (0 <= x <= 1000 and 0 <= y <= 1000):
            problems.append(f"click ({x},{y}) out of range 0-1000; clipped")
            x, y = min(1000, max(0, x)), min(1000, max(0, y))
        actions.append((m.start(), Click(body.group(1).lower() == "positive", from_text(x), from_text(y))))
    actions += [(m.start(), None) for m in re.finditer(re.escape(STOP), text)]
    actions.sort(key=lambda a: a[0])
    if not actions:
        problems.append("no readable action; read as stop")
        click = None
    else:
        click = actions[0][1]
        if len(actions) > 1:
            problems.append(f"{len(actions)} actions in one turn; the first is kept")
    rest = _leftover(text, [_THINK, _CLICK, re.compile(re.escape(STOP))])
    if rest:
        problems.append(f"unexpected text: {rest[:40]!r}")
    return Parsed(Stage2Action(click, think), problems)
