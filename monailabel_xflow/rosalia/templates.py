"""ROSALIA's text: the ``llava_v1`` prompt and the answer templates.

Prompt (LLaVA's ``llava_v1`` conversation, as LISA/ROSALIA build it with ``mm_use_im_start_end``)::

    <s>A chat between ... questions. USER: <im_start><image>...<image><im_end>
    {instruction} ASSISTANT:

Answers always start with ``[SEG]``, negatives too (a negative is trained to decode an empty
mask). The sentence after it is the canonical MIMIC-ILS answer, which
:class:`~monailabel_xflow.instructions.Instruction` renders (the same sentences XFlow answers with):

========================  ==============================================
basic, positive           ``[SEG]``
basic, negative           ``[SEG] There is no T in the L.``
global, positive          ``[SEG] It is located in the L.``
global, negative          ``[SEG] There is no T.``
lesion inference          ``[SEG] It is highly suggestive of X.`` / ``[SEG] It possibly reflects X.``
========================  ==============================================

Users never see ``[SEG]``: :func:`read_answer` strips it and checks the sentence against the
templates of the instruction asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from monailabel_xflow.instructions import Instruction, InstructionError
from monailabel_xflow.vocabulary import LESION_INFERENCE_TARGETS, REGION_JOINER, REGIONS

SYSTEM = (
    "A chat between a curious human and an artificial intelligence assistant. "
    "The assistant gives helpful, detailed, and polite answers to the human's questions."
)
"""System line of LLaVA's ``llava_v1`` conversation template."""

SEG = "[SEG]"
SEG_TOKEN = SEG
IM_START = "<im_start>"
IM_END = "<im_end>"
IMAGE_TOKEN = "<image>"


def prompt_text(
    instruction_text: str,
    image_tokens: int,
    image_token: str = "<image>",
    im_start: str = "<im_start>",
    im_end: str = "<im_end>",
) -> str:
    """The ``llava_v1`` prompt for one instruction, up to and including ``ASSISTANT:``.

    Args:
        instruction_text: what the user asked (free text or canonical).
        image_tokens: how many ``<image>`` placeholders (the vision tower's patch count:
            256 for CLIP ViT-L/14 at 224 px).
    """
    image = im_start + image_token * image_tokens + im_end
    return f"{SYSTEM} USER: {image}\n{instruction_text.strip()} ASSISTANT:"


TOKENISATIONS = ("reference", "whole-prompt")
"""How a model's text is turned into ids: ``"reference"`` as the public ROSALIA / LISA code does
(:func:`reference_ids`), ``"whole-prompt"`` the text tokenised at once (how models saved before
this option existed were trained; their ``rosalia.json`` has no ``tokenisation`` key)."""

LISA_ADDED_TOKENS = (SEG, IM_START, IM_END)
"""Tokens LISA adds to Llama's tokenizer as plain strings (``add_tokens``); its slow tokenizer
(transformers 4.31) strips the whitespace on both sides of them."""


def _reference_pieces(tokenizer, text: str) -> list[int]:
    """Ids of ``text`` (no ``<image>``) the way LISA's slow Llama tokenizer makes them: split at
    LISA's added tokens, whitespace next to them stripped, every other piece tokenised on its own
    (a SentencePiece tokenizer gives each its dummy-prefix ``▁``)."""
    parts = re.split("(" + "|".join(map(re.escape, LISA_ADDED_TOKENS)) + ")", text)
    for k, part in enumerate(parts):
        if part in LISA_ADDED_TOKENS:
            if k > 0:
                parts[k - 1] = parts[k - 1].rstrip()
            if k + 1 < len(parts):
                parts[k + 1] = parts[k + 1].lstrip()
    ids: list[int] = []
    for part in parts:
        if part in LISA_ADDED_TOKENS:
            ids.append(tokenizer.convert_tokens_to_ids(part))
        elif part:
            ids += tokenizer(part, add_special_tokens=False)["input_ids"]
    return ids


def reference_ids(
    tokenizer, instruction_text: str, image_tokens: int, answer_sentence: str | None = None
) -> tuple[list[int], list[int]]:
    """Prompt (and answer) ids built as the public ROSALIA / LISA code builds them.

    LISA's ``tokenizer_image_token`` splits the ``llava_v1`` text (one ``<image>`` placeholder)
    around ``<image>`` and tokenises each chunk on its own with its slow Llama tokenizer, keeping
    ``<s>`` once at the start and putting the image between the chunks; that tokenizer strips the
    whitespace around LISA's added tokens (``USER: <im_start>`` becomes ``USER:<im_start>``, the
    newline after ``<im_end>`` goes) and SentencePiece gives each text piece its own prefix ``▁``.
    Here the image is ``image_tokens`` ``<image>`` ids (transformers' LLaVA expands them in the
    ids; LISA inserts one index that the model expands). Training text (``ASSISTANT: [SEG]
    sentence</s>``) is the same conversation with the answer: ``[SEG]``, the sentence, ``</s>``.

    Args:
        tokenizer: holds ``<image>`` and LISA's added tokens as single tokens, and ``bos_token_id``.
        instruction_text: what the user asked.
        image_tokens: how many ``<image>`` ids (the vision tower's patch count).
        answer_sentence: the answer's sentence for training (``""`` for ``[SEG]`` alone), or None.

    Returns:
        ``(prompt_ids, answer_ids)`` (``answer_ids`` empty without an answer).
    """
    image_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    ids = [tokenizer.bos_token_id]
    for k, chunk in enumerate(prompt_text(instruction_text, 1, IMAGE_TOKEN, IM_START, IM_END).split(IMAGE_TOKEN)):
        if k:
            ids += [image_id] * int(image_tokens)
        ids += _reference_pieces(tokenizer, chunk)
    if answer_sentence is None:
        return ids, []
    return ids, _reference_pieces(tokenizer, rosalia_answer(answer_sentence)) + [tokenizer.eos_token_id]


def whole_prompt_ids(
    tokenizer, instruction_text: str, image_tokens: int, answer_sentence: str | None = None
) -> tuple[list[int], list[int]]:
    """Prompt (and answer) ids with the text tokenised at once (the ``"whole-prompt"``
    tokenisation of models trained before :func:`reference_ids`; same return as it)."""
    prompt = tokenizer.bos_token + prompt_text(instruction_text, image_tokens, IMAGE_TOKEN, IM_START, IM_END)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if answer_sentence is None:
        return ids, []
    return ids, tokenizer(rosalia_answer(answer_sentence), add_special_tokens=False)["input_ids"] + [
        tokenizer.eos_token_id
    ]


def canonical_sentence(
    instruction: Instruction, present: bool, located: tuple[str, ...] = (), lesion: tuple[str, bool] | None = None
) -> str:
    """The canonical answer sentence ("" for a present basic instruction).

    Args:
        present: whether the finding is there.
        located: regions of a present global answer.
        lesion: ``(type, confident)`` of a present lesion-inference answer.
    """
    if not present:
        return instruction.absent_answer()
    if instruction.kind == "global":
        return Instruction.located_answer(located) if located else ""
    if instruction.kind == "lesion_inference":
        return Instruction.lesion_answer(*lesion) if lesion else ""
    return ""


def rosalia_answer(sentence: str) -> str:
    """The target ROSALIA is trained on: ``[SEG]`` then the sentence, if any."""
    return f"{SEG} {sentence}" if sentence else SEG


_LOCATED = re.compile(r"^It is located in the (.+)\.$")
_LESION = re.compile(r"^It (is highly suggestive of|possibly reflects) (\w+)\.$")


@dataclass
class ReadAnswer:
    """What ROSALIA said, read against the instruction asked.

    Attributes:
        has_seg: the text holds ``[SEG]`` (the mask is decoded from it).
        says_present: the sentence is a positive template (None when unreadable).
        sentence: the user-facing sentence, ``[SEG]`` removed, canonical when readable.
        located: regions named by a global positive.
        lesion: ``(type, confident)`` of a lesion-inference positive.
        problems: why the text did not fit the templates (empty when it did).
    """

    has_seg: bool
    says_present: bool | None
    sentence: str
    located: tuple[str, ...] = ()
    lesion: tuple[str, bool] | None = None
    problems: list[str] = field(default_factory=list)


def read_answer(text: str, instruction: Instruction) -> ReadAnswer:
    """Read generated text (special tokens kept except ``<s>``/``</s>``) against ``instruction``."""
    has_seg = SEG in text
    sentence = " ".join(text.replace(SEG, " ").replace("</s>", " ").split())
    problems: list[str] = [] if has_seg else ["no [SEG] token in the answer"]
    if sentence == instruction.absent_answer():
        return ReadAnswer(has_seg, False, sentence, problems=problems)
    if instruction.kind == "basic":
        if sentence:
            problems.append(f"answer {sentence!r} fits no template of a basic instruction")
            return ReadAnswer(has_seg, None, "", problems=problems)
        return ReadAnswer(has_seg, True, "", problems=problems)
    if instruction.kind == "global":
        m = _LOCATED.match(sentence)
        if m:
            regions = tuple(m.group(1).split(REGION_JOINER))
            if all(r in REGIONS for r in regions):
                return ReadAnswer(
                    has_seg, True, Instruction.located_answer(regions), located=regions, problems=problems
                )
    else:  # lesion inference
        m = _LESION.match(sentence)
        if m and m.group(2) in LESION_INFERENCE_TARGETS:
            lesion = (m.group(2), m.group(1).startswith("is highly"))
            try:
                return ReadAnswer(has_seg, True, Instruction.lesion_answer(*lesion), lesion=lesion, problems=problems)
            except InstructionError:  # pragma: no cover - the regex admits only valid targets
                pass
    problems.append(f"answer {sentence!r} fits no template of a {instruction.kind} instruction")
    return ReadAnswer(has_seg, None, "", problems=problems)
