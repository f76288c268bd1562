"""The contract between the workflow and its policies: what a revision policy sees each turn, and
the protocols π_init and π_rev implement (VLM, oracle, test doubles alike). A policy turns
pictures and an instruction into *raw protocol text* (or, in Stage 2, a parsed action:
:data:`Stage2Answer`); the workflow parses that text with
:mod:`monailabel_xflow.policy.protocol` (a model's output is untrusted input, and the trace
keeps the raw text)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import FULL_VIEW, Box, Click
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.protocol import Stage2Action

Stage2Answer = str | Stage2Action
"""One Stage 2 turn's answer: protocol text (a VLM, scripted text), or the
:class:`~monailabel_xflow.policy.protocol.Stage2Action` itself from a policy that decides
without words (the exact oracle of Algorithm 1). The workflow reads either
(:func:`~monailabel_xflow.workflow.revision.read_action`)."""


class PolicyError(InputError):
    """Bad input to a policy (wrong image shape/dtype, out-of-order step, missing model file)."""


# --- the click budget T: the one owner ---------------------------------------------------------

MAX_CLICKS = 4
"""The Stage 2 click budget T of the paper (§4.2, App. A.3): the default of the workflow, the
models file, the oracle, the trainers and the app."""

MAX_CLICKS_LIMIT = 16
"""The largest budget anything may ask for (a request, a models file, the oracle, a run)."""

MAX_STOP_BIAS = 20.0
"""Largest ``|stop_bias|`` (logits) of π_rev's stop choice, and of ``|presence_bias|`` on π_init's
absent choice (``policy.vlm.VLMPolicy``); beyond it the decision is fixed whatever the model says."""


class BudgetError(InputError):
    """A click budget that is not an integer in ``0..MAX_CLICKS_LIMIT``."""


def check_budget(max_clicks: Any) -> int:
    """The click budget T as an int (the one budget rule of the package): an integer, or its
    decimal text (a models file, ``XFLOW_MAX_CLICKS``), in ``0..MAX_CLICKS_LIMIT``.

    Raises:
        BudgetError: not an integer (``1.5``, ``"many"``), negative, or over :data:`MAX_CLICKS_LIMIT`.
    """
    try:
        value = int(max_clicks.strip()) if isinstance(max_clicks, str) else int(max_clicks)
    except (TypeError, ValueError) as err:
        raise BudgetError(f"max_clicks must be an integer, got {max_clicks!r}") from err
    if not isinstance(max_clicks, str) and value != max_clicks:
        raise BudgetError(f"max_clicks must be an integer, got {max_clicks!r}")
    if not 0 <= value <= MAX_CLICKS_LIMIT:
        raise BudgetError(f"max_clicks must be an integer in 0..{MAX_CLICKS_LIMIT}, got {max_clicks!r}")
    return value


def check_stop_bias(value: Any, name: str = "stop_bias") -> float:
    """A decision bias in logits as a float: π_rev's stop bias (``VLMPolicy(stop_bias=)``, the models
    file's ``stage2_stop_bias``) or π_init's presence bias (``presence_bias``,
    ``stage1_presence_bias``). A number, or its decimal text, with ``|value| <= MAX_STOP_BIAS``.

    Raises:
        PolicyError: not a number, NaN, or out of bounds (the message names ``name``).
    """
    try:
        bias = float(value)
    except (TypeError, ValueError) as err:
        raise PolicyError(f"{name} must be a number, got {value!r}") from err
    if not abs(bias) <= MAX_STOP_BIAS:  # also rejects NaN
        raise PolicyError(f"{name} must lie in [-{MAX_STOP_BIAS:g}, {MAX_STOP_BIAS:g}], got {value!r}")
    return bias


@dataclass
class RevisionState:
    """What a revision policy sees at step ``t``.

    Attributes:
        image: ``(H, W)`` float32 radiograph in ``[0, 1]``; None only for a policy that reads the
            mask itself (the oracle's exact trajectories, Algorithm 1).
        instruction: the question being answered (None as for ``image``).
        box: current (grown) box, normalised xyxy (geometry.py).
        mask: ``(H, W)`` bool current mask M_t.
        clicks: clicks issued so far, normalised.
        observation: ``(h, w, 3)`` uint8, ``rendering.render_observation(image, mask, clicks,
            view)``; None when the loop does not render (``revise_mask(observe=False)``).
        step: 0-based index of the turn about to be taken.
        view: the window the observation shows, normalised xyxy (``geometry.FULL_VIEW`` unless
            the session asked for a zoomed one); a text answer's click is read in it.
    """

    image: NDArray[np.float32] | None
    instruction: Instruction | None
    box: Box
    mask: NDArray[np.bool_]
    clicks: list[Click]
    observation: NDArray[np.uint8] | None
    step: int
    view: Box = FULL_VIEW


@runtime_checkable
class Stage1Policy(Protocol):
    """π_init: grounds the lungs, decides presence and boxes the lesions, as protocol text."""

    def stage1(self, image: NDArray[np.float32], instruction: Instruction) -> str: ...

    def stage1_many(self, image: NDArray[np.float32], instructions: Sequence[Instruction]) -> list[str]: ...


@runtime_checkable
class RevisionSession(Protocol):
    """One Stage 2 conversation about one lesion mask; ``step`` returns one turn's answer.

    Attributes:
        zoom: the session looks at a zoomed view around the box that prompted the mask
            (``geometry.zoom_view``, fixed for the session) rather than the whole image; its text
            answers are then read in the view's coordinates.
    """

    zoom: bool

    def step(self, state: RevisionState) -> Stage2Answer: ...


@runtime_checkable
class RevisionPolicy(Protocol):
    """π_rev: opens one :class:`RevisionSession` per initial mask."""

    def start(self, image: NDArray[np.float32], instruction: Instruction, box: Box) -> RevisionSession: ...
