"""The words of both policies' prompts, fixed here once: inference and training build their
conversations from these functions (through :mod:`.conversation`).

* **Stage 1**, one user turn: the radiograph, then :data:`STAGE1_PREAMBLE`, then the
  instruction-specific request, e.g. for "Segment the effusion in the left lung."::

      <image>You are a radiologist reading a chest X-ray. Write every box as (x1,y1),(x2,y2)
      with integers from 0 to 1000, x first.
      First ground the left lung with a box, then decide whether the finding asked for is
      present, then draw a box around each lesion. Segment the effusion in the left lung.

  A chest-level question asks to ground "the right lung and the left lung" (both lungs), a
  one-sided question only that lung (:attr:`Instruction.lungs`). The instruction-specific part
  comes last so that "all findings" can prefill everything up to it once.
* **Stage 2**, one growing conversation per lesion mask. The first user turn holds the
  observation o_0 (the radiograph with the current mask and clicks drawn on it,
  :func:`monailabel_xflow.rendering.render_observation`), :data:`STAGE2_PREAMBLE`, the
  instruction, the box that prompted the mask and the request for one action; each later user
  turn holds the new observation o_t and :data:`STAGE2_FOLLOWUP`. The model answers every turn
  with one ``<click>…</click>`` or ``<stop/>`` (:mod:`.protocol`).
"""

from __future__ import annotations

from typing import Any

from monailabel_xflow.geometry import Box
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.protocol import box_text

COORDINATES_NOTE = "with integers from 0 to 1000, x first"


STAGE1_PREAMBLE = f"You are a radiologist reading a chest X-ray. Write every box as (x1,y1),(x2,y2) {COORDINATES_NOTE}."
"""Text right after the image in Stage 1; identical for every instruction (shared prefix).
Everything that does not depend on the instruction belongs here: "all findings" prefills it once
and then runs only the short requests, one per finding."""


STAGE2_PREAMBLE = (
    "You are a radiologist revising a lesion mask on a chest X-ray. The image shows the X-ray "
    "with the current mask overlaid and the clicks so far marked."
)
"""Text right after the first observation in Stage 2."""


STAGE2_FOLLOWUP = "This is the mask after your click. Answer with one click, or stop if the mask follows the lesion."
"""Text of every later Stage 2 user turn, after the new observation."""


def _lungs_phrase(instruction: Instruction) -> str:
    lungs = instruction.lungs
    if len(lungs) == 1:
        return f"the {lungs[0]} with a box"
    return "the " + " and the ".join(lungs) + " with a box each"


def stage1_request(instruction: Instruction) -> str:
    """The instruction-specific part of the Stage 1 prompt (after :data:`STAGE1_PREAMBLE`).

    The instruction itself comes last: the seven "all findings" questions then differ only in
    their final few tokens, and everything before those is prefilled once.
    """
    return (
        f"First ground {_lungs_phrase(instruction)}, then decide whether the finding asked for is "
        f"present, then draw a box around each lesion. {instruction.text}"
    )


def _image_turn(text: str) -> list[dict[str, Any]]:
    """Chat messages of one user turn: an image, then ``text``."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def stage1_messages(instruction: Instruction) -> list[dict[str, Any]]:
    """Chat messages of the Stage 1 prompt (one user turn: image, preamble, request)."""
    return _image_turn(f"{STAGE1_PREAMBLE}\n{stage1_request(instruction)}")


def stage2_request(instruction: Instruction, box: Box) -> str:
    """The first Stage 2 request: instruction, the box that prompted the mask, one action."""
    return (
        f"{instruction.text} The mask was prompted by the box "
        f"{box_text(box)}. Answer with one click, positive to "
        f"grow the mask or negative to shrink it, written as <click>positive (x,y)</click> "
        f"{COORDINATES_NOTE}, or with <stop/> if the mask follows the lesion."
    )


def stage2_messages(instruction: Instruction, box: Box) -> list[dict[str, Any]]:
    """Chat messages of the first Stage 2 user turn (observation o_0, preamble, request)."""
    return _image_turn(f"{STAGE2_PREAMBLE}\n{stage2_request(instruction, box)}")


def stage2_followup_text(image_token: str, closes_model_turn: bool) -> str:
    """Token text appended after the model's answer to start the next Stage 2 turn.

    Gemma3's chat template renders a model turn as ``<start_of_turn>model\\n…<end_of_turn>\\n``
    and a user turn as ``<start_of_turn>user\\n…<end_of_turn>\\n``; this is the text that follows
    the model's generated tokens in that rendering.

    Args:
        image_token: the processor's image placeholder (``<start_of_image>`` for Gemma3).
        closes_model_turn: True if the generated tokens did not already end with
            ``<end_of_turn>`` (an ``<eos>`` or a ``max_new_tokens`` cut), so it must be added.
    """
    close = "<end_of_turn>" if closes_model_turn else ""
    return f"{close}\n<start_of_turn>user\n{image_token}{STAGE2_FOLLOWUP}<end_of_turn>\n<start_of_turn>model\n"
