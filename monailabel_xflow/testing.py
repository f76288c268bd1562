"""TEST DOUBLES shared by the test suite and the benchmarks. Not for production use.

Nothing here is a model, and no production module imports this one (tests/test_architecture.py
checks it). :class:`ScriptedSegmenter` answers prompts by a fixed, documented rule so that tests
of the oracle clicker, the workflow and the SFT builders can predict every mask, and benchmarks
can time the code around the segmenter without paying for one. :class:`SequenceSegmenter` replays
a fixed list of masks, to script exact IoU sequences. :class:`RecordingSegmenter` wraps a real
segmenter and records what it was asked, so the same assertions can run against the tiny random
SAM3. All three implement the ``PromptableSegmenter`` interface of
:mod:`monailabel_xflow.segmenter.base` (``set_image`` once, then ``predict``; ``fork``) and return
its ``SegmentationResult``; a fork records into its parent's call log, so a test reads one log
whichever copy the workflow used.

:class:`ScriptedPolicy` replays protocol text as π_init and π_rev; :class:`StubRuntime` hands a
scripted :class:`~monailabel_xflow.workflow.xflow.XFlow` to the MONAI Label tasks in place of the
app's model runtime. Helpers draw simple synthetic ground truths.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from monailabel_xflow.geometry import Box, Click, box_to_mask, check_image, point_to_pixel
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.base import MAX_CLICKS, PolicyError, RevisionState
from monailabel_xflow.policy.protocol import Stage2Action, format_stage2
from monailabel_xflow.segmenter.base import (
    PromptableSegmenter,
    SegmentationResult,
    SegmenterInputError,
    build_prompts,
    check_model_image,
)

__all__ = [
    "PredictCall",
    "ScriptedSegmenter",
    "SequenceSegmenter",
    "RecordingSegmenter",
    "ScriptedPolicy",
    "ScriptExhausted",
    "STOP_TEXT",
    "StubRuntime",
    "disk",
    "ellipse",
    "result_from_masks",
]


@dataclass
class PredictCall:
    """One recorded ``predict`` call and its answer."""

    boxes: list[Box]
    clicks: list[list[Click]] | None
    previous: np.ndarray | None
    multimask: bool
    result: Any = field(repr=False, default=None)


# --- synthetic shapes -----------------------------------------------------------------------


def disk(shape: Sequence[int], row: float, col: float, radius: float) -> np.ndarray:
    """Bool ``(H, W)`` mask of the pixels whose centre lies within ``radius`` px of ``(row, col)``."""
    return ellipse(shape, row, col, radius, radius)


def ellipse(shape: Sequence[int], row: float, col: float, radius_rows: float, radius_cols: float) -> np.ndarray:
    """Bool ``(H, W)`` axis-aligned ellipse centred on pixel ``(row, col)`` (radii in pixels)."""
    rr, cc = np.ogrid[: int(shape[0]), : int(shape[1])]
    return ((rr - row) / radius_rows) ** 2 + ((cc - col) / radius_cols) ** 2 <= 1.0


# --- doubles --------------------------------------------------------------------------------


@dataclass
class CallLog:
    """What a test double and its forks were asked."""

    set_image_calls: int = 0
    calls: list[PredictCall] = field(default_factory=list)


class _CallLog:
    """What every test double records: ``set_image_calls`` and one :class:`PredictCall` per
    ``predict`` in ``calls`` (``predict_calls`` counts them), shared with its forks."""

    def __init__(self) -> None:
        self.log = CallLog()

    @property
    def set_image_calls(self) -> int:
        return self.log.set_image_calls

    @set_image_calls.setter
    def set_image_calls(self, value: int) -> None:
        self.log.set_image_calls = value

    @property
    def calls(self) -> list[PredictCall]:
        return self.log.calls

    @property
    def predict_calls(self) -> int:
        return len(self.calls)

    def _twin(self):
        """A shallow copy: same log and settings (subclasses forget their image)."""
        return copy.copy(self)


class ScriptedSegmenter(_CallLog):
    """TEST DOUBLE: a deterministic promptable segmenter with a hidden object.

    For a box ``b`` and the clicks of that box, the mask is::

        ((box_to_mask(b) & object) | disks(positive clicks, positive_radius_px))
            & ~disks(negative clicks, negative_radius_px)

    i.e. the hidden ``object`` seen through the box, grown by a disc around every positive click
    and carved by a disc around every negative click (negatives win). ``previous`` is recorded but
    does not change the answer. Logits are ``+logit_scale`` inside the mask and ``-logit_scale``
    outside; ``low_res_logits`` are the logits sampled (nearest) on a ``low_res x low_res`` grid;
    ``iou`` is the mask's IoU with the hidden object. ``multimask`` is recorded and ignored (one
    mask per box).

    Args:
        target: ``(H, W)`` hidden object; the image given to ``set_image`` must have this size.
        positive_radius_px: radius of the disc a positive click adds.
        negative_radius_px: radius of the disc a negative click removes.
        low_res: side of the low-resolution logits.
        logit_scale: magnitude of the logits.

    Attributes:
        set_image_calls: number of ``set_image`` calls.
        calls: one :class:`PredictCall` per ``predict`` call, in order.
    """

    def __init__(
        self,
        target: np.ndarray,
        positive_radius_px: float = 20.0,
        negative_radius_px: float = 20.0,
        low_res: int = 64,
        logit_scale: float = 8.0,
    ) -> None:
        target = np.asarray(target)
        if target.ndim != 2:
            raise ValueError(f"target must be a 2-D (H, W) mask, got shape {target.shape}")
        self.target = target.astype(bool)
        self.positive_radius_px = float(positive_radius_px)
        self.negative_radius_px = float(negative_radius_px)
        self.low_res = int(low_res)
        self.logit_scale = float(logit_scale)
        super().__init__()
        self._image_set = False

    def fork(self) -> ScriptedSegmenter:
        """The same hidden object and call log, no current image."""
        twin = self._twin()
        twin._image_set = False
        return twin

    def set_image(self, image: np.ndarray) -> None:
        """Accept any image the real backends accept (:func:`~monailabel_xflow.segmenter.base.check_model_image`)
        of the target's size.

        Raises:
            SegmenterInputError: what the backends refuse, or another size than the target's.
        """
        image = check_model_image(image)
        if tuple(image.shape[:2]) != self.target.shape:
            raise SegmenterInputError(f"image shape {image.shape} differs from the double's target {self.target.shape}")
        self.set_image_calls += 1
        self._image_set = True

    def predict(
        self,
        boxes: Sequence[Box],
        clicks: Sequence[Sequence[Click]] | None = None,
        previous: np.ndarray | None = None,
        multimask: bool = False,
    ) -> SegmentationResult:
        """Masks for ``N`` boxes by the rule in the class docstring.

        Raises:
            RuntimeError: before ``set_image``.
            GeometryError, SegmenterInputError: prompts the backends refuse
                (:func:`~monailabel_xflow.segmenter.base.build_prompts`).
        """
        if not self._image_set:
            raise RuntimeError("predict called before set_image")
        build_prompts(boxes, clicks, previous)
        shape = self.target.shape
        masks = np.zeros((len(boxes),) + shape, dtype=bool)
        for n, box in enumerate(boxes):
            box_clicks = list(clicks[n]) if clicks is not None else []
            m = box_to_mask(box, shape) & self.target
            for c in box_clicks:
                if c.positive:
                    m |= disk(shape, *point_to_pixel(c.x, c.y, shape), self.positive_radius_px)
            for c in box_clicks:
                if not c.positive:
                    m &= ~disk(shape, *point_to_pixel(c.x, c.y, shape), self.negative_radius_px)
            masks[n] = m
        result = result_from_masks(masks, self.target, self.low_res, self.logit_scale)
        self.calls.append(_record(boxes, clicks, previous, multimask, result))
        return result


class SequenceSegmenter(_CallLog):
    """TEST DOUBLE: answers the k-th ``predict`` call with the k-th of a fixed list of masks.

    Use it to script exact IoU sequences. Results come from :func:`result_from_masks` (one mask,
    ``N = 1``, whatever the number of boxes); a call past the end of the list raises IndexError.

    Args:
        masks: the ``(H, W)`` masks to return, in order.
        reference: ``(H, W)`` mask the ``iou`` field is measured against (default: first mask).

    Attributes:
        set_image_calls: number of ``set_image`` calls.
        calls: one :class:`PredictCall` per ``predict`` call, in order.
    """

    def __init__(self, masks: Sequence[np.ndarray], reference: np.ndarray | None = None) -> None:
        self.masks = [np.asarray(m, dtype=bool) for m in masks]
        self.reference = self.masks[0] if reference is None else np.asarray(reference, dtype=bool)
        super().__init__()

    def fork(self) -> SequenceSegmenter:
        """The same masks and call log: the sequence goes on across forks."""
        return self._twin()

    def set_image(self, image: np.ndarray) -> None:
        self.set_image_calls += 1

    def predict(self, boxes, clicks=None, previous=None, multimask=False):
        k = len(self.calls)
        if k >= len(self.masks):
            raise IndexError(f"SequenceSegmenter holds {len(self.masks)} masks; predict call {k + 1} has none")
        result = result_from_masks(self.masks[k][None], self.reference)
        self.calls.append(_record(boxes, clicks, previous, multimask, result))
        return result


class RecordingSegmenter(_CallLog):
    """TEST DOUBLE: wraps any ``PromptableSegmenter`` and records its calls.

    Attributes:
        inner: the wrapped segmenter.
        set_image_calls: number of ``set_image`` calls.
        calls: one :class:`PredictCall` per ``predict`` call, in order.
    """

    def __init__(self, inner: PromptableSegmenter) -> None:
        self.inner = inner
        super().__init__()

    def fork(self) -> RecordingSegmenter:
        """A fork of the wrapped segmenter, recorded into the same log."""
        twin = self._twin()
        twin.inner = self.inner.fork()
        return twin

    def set_image(self, image: np.ndarray) -> None:
        self.set_image_calls += 1
        self.inner.set_image(image)

    def predict(self, boxes, clicks=None, previous=None, multimask=False):
        result = self.inner.predict(boxes, clicks, previous, multimask)
        self.calls.append(_record(boxes, clicks, previous, multimask, result))
        return result


def result_from_masks(
    masks: np.ndarray, reference: np.ndarray, low_res: int = 64, logit_scale: float = 8.0
) -> SegmentationResult:
    """A ``SegmentationResult`` for given ``(N, H, W)`` masks.

    Logits are ``+-logit_scale``; ``low_res_logits`` the logits sampled (nearest) on a
    ``low_res x low_res`` grid; ``iou`` each mask's IoU with ``reference`` (1.0 if both empty).
    """
    masks = np.asarray(masks, dtype=bool)
    n, h, w = masks.shape
    logits = np.where(masks, logit_scale, -logit_scale).astype(np.float32)
    rows = ((np.arange(low_res) + 0.5) * h / low_res).astype(int)
    cols = ((np.arange(low_res) + 0.5) * w / low_res).astype(int)
    low = logits[:, rows][:, :, cols][:, None]
    inter = (masks & reference).reshape(n, h * w).sum(1)
    union = (masks | reference).reshape(n, h * w).sum(1)
    return SegmentationResult(
        logits=logits,
        masks=masks,
        iou=np.where(union > 0, inter / np.maximum(union, 1), 1.0).astype(np.float32),
        low_res_logits=np.ascontiguousarray(low, dtype=np.float32),
    )


def _record(boxes, clicks, previous, multimask, result) -> PredictCall:
    return PredictCall(
        boxes=[(float(b[0]), float(b[1]), float(b[2]), float(b[3])) for b in boxes],
        clicks=None if clicks is None else [list(cs) for cs in clicks],
        previous=None if previous is None else np.array(previous, copy=True),
        multimask=bool(multimask),
        result=result,
    )


class ScriptExhausted(PolicyError):
    """A :class:`ScriptedPolicy` was asked for more Stage 1 answers than it was given."""


class ScriptedPolicy:
    """Replays given protocol text, as π_init and π_rev (both protocols).

    Args:
        stage1_texts: Stage 1 answers, returned in order, one per instruction asked (across
            :meth:`stage1` and :meth:`stage1_many` calls).
        revision_texts: one list of turn texts per revision session, in the order sessions
            are started; session ``k`` returns ``revision_texts[k][t]`` at step ``t``.

    When the script runs out: a revision session with no text left (or a session beyond the
    given lists) returns a stop action (``format_stage2(Stage2Action(None))``), so a replayed
    trace always terminates; Stage 1 raises :class:`ScriptExhausted`, because there is no
    neutral Stage 1 answer to invent.
    """

    def __init__(self, stage1_texts: Sequence[str] = (), revision_texts: Sequence[Sequence[str]] = ()) -> None:
        self._stage1 = list(stage1_texts)
        self._revisions = [list(t) for t in revision_texts]
        self._stage1_used = 0
        self._sessions = 0
        self.calls: list[tuple[str, Any]] = []  # ("stage1", instruction) / ("start", (instruction, box))

    def stage1(self, image: np.ndarray, instruction: Instruction) -> str:
        check_image(image)  # refuses what the VLM policy refuses
        self.calls.append(("stage1", instruction))
        if self._stage1_used >= len(self._stage1):
            raise ScriptExhausted(f"script holds {len(self._stage1)} Stage 1 answer(s), all used")
        text = self._stage1[self._stage1_used]
        self._stage1_used += 1
        return text

    def stage1_many(self, image: np.ndarray, instructions: Sequence[Instruction]) -> list[str]:
        return [self.stage1(image, i) for i in instructions]

    def start(self, image: np.ndarray, instruction: Instruction, box: Box) -> _ScriptedSession:
        check_image(image)
        self.calls.append(("start", (instruction, tuple(box))))
        k = self._sessions
        self._sessions += 1
        return _ScriptedSession(self._revisions[k] if k < len(self._revisions) else [])


STOP_TEXT = format_stage2(Stage2Action(None))
"""What a revision session returns when it has nothing scripted: a plain stop."""


@dataclass
class _ScriptedSession:
    texts: list[str]
    steps: list[int] = field(default_factory=list)
    zoom: bool = False

    def step(self, state: RevisionState) -> str:
        self.steps.append(state.step)
        t = len(self.steps) - 1
        return self.texts[t] if t < len(self.texts) else STOP_TEXT


class StubRuntime:
    """What the MONAI Label tasks need of the app's model runtime, around a given ``XFlow``
    (usually built from :class:`ScriptedPolicy` and :class:`ScriptedSegmenter`).

    Args:
        xflow: what :meth:`get` returns.
        max_clicks: the configured click budget (``config.max_clicks``).
    """

    def __init__(self, xflow: Any, max_clicks: int = MAX_CLICKS) -> None:
        self.xflow = xflow
        self.config = SimpleNamespace(max_clicks=max_clicks, segmenter=None)

    def get(self) -> Any:
        return self.xflow

    def describe(self) -> str:
        return "scripted"

    def status(self) -> dict:
        return {"configured": True}
