"""The contract between the workflow and its policies: what a revision policy sees each turn, and
the protocols π_init and π_rev implement (VLM, oracle, test doubles alike). A policy turns
pictures and an instruction into *raw protocol text*; the workflow parses that text with
:mod:`monailabel_xflow.policy.protocol` (a model's output is untrusted input, and the trace
keeps the raw text)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Box, Click
from monailabel_xflow.instructions import Instruction


class PolicyError(InputError):
    """Bad input to a policy (wrong image shape/dtype, out-of-order step, missing model file)."""


@dataclass
class RevisionState:
    """What a revision policy sees at step ``t``.

    Attributes:
        image: ``(H, W)`` float32 radiograph in ``[0, 1]``.
        instruction: the question being answered.
        box: current (grown) box, normalised xyxy (geometry.py).
        mask: ``(H, W)`` bool current mask M_t.
        clicks: clicks issued so far, normalised.
        observation: ``(H, W, 3)`` uint8, ``rendering.render_observation(image, mask, clicks)``.
        step: 0-based index of the turn about to be taken.
    """

    image: np.ndarray
    instruction: Instruction
    box: Box
    mask: np.ndarray
    clicks: list[Click]
    observation: np.ndarray
    step: int


@runtime_checkable
class Stage1Policy(Protocol):
    """π_init: grounds the lungs, decides presence and boxes the lesions, as protocol text."""

    def stage1(self, image: np.ndarray, instruction: Instruction) -> str: ...

    def stage1_many(self, image: np.ndarray, instructions: Sequence[Instruction]) -> list[str]: ...


@runtime_checkable
class RevisionSession(Protocol):
    """One Stage 2 conversation about one lesion mask; ``step`` returns one turn's raw text."""

    def step(self, state: RevisionState) -> str: ...


@runtime_checkable
class RevisionPolicy(Protocol):
    """π_rev: opens one :class:`RevisionSession` per initial mask."""

    def start(self, image: np.ndarray, instruction: Instruction, box: Box) -> RevisionSession: ...
