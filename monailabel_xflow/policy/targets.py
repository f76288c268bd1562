"""What the policies are taught to say: the Stage 1 target of one question (from its ground-truth
mask and lung boxes) and the Stage 2 text of one oracle action. SFT data, GRPO references and the
offline tokenizer's corpus all come from here, in the protocol of :mod:`.protocol`."""

from __future__ import annotations

import numpy as np

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Box, lesion_boxes
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.protocol import BoxRef, Stage1Output, Stage2Action, format_stage1, format_stage2
from monailabel_xflow.vocabulary import join_regions


class BuildError(InputError):
    """A build that cannot start: unknown kind, bad shard, missing lung boxes or segmenter."""


def init_target(instruction: Instruction, mask: np.ndarray | None, lungs: dict[str, Box]) -> str:
    """The Stage 1 protocol text π_init is taught for one question.

    Raises:
        BuildError: a lung the question grounds has no box.
    """
    missing = [lung for lung in instruction.lungs if lung not in lungs]
    if missing:
        raise BuildError(f"no box for {', '.join(missing)}")
    boxes = lesion_boxes(mask)
    where = f"the {instruction.location}" if instruction.regions else "the chest"
    grounded = join_regions(instruction.lungs)
    if boxes:
        think = f"I locate the {grounded}, then look for {instruction.finding} in {where}: {len(boxes)} region(s)."
    else:
        think = f"I locate the {grounded}, then look for {instruction.finding} in {where}: none."
    out = Stage1Output(
        lungs=[BoxRef(lung, lungs[lung]) for lung in instruction.lungs],
        present=bool(boxes),
        lesions=[BoxRef(instruction.finding, b) for b in boxes],
        think=think,
    )
    return format_stage1(out)


def revision_target(click, over: bool | None = None) -> str:
    """The Stage 2 protocol text of one oracle action (``click`` None: stop)."""
    if click is None:
        return format_stage2(Stage2Action(None, "The mask fits the lesion."))
    why = "The mask misses part of the lesion." if click.positive else "The mask spills beyond the lesion."
    return format_stage2(Stage2Action(click, why))
