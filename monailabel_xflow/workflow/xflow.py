"""The XFlow workflow: Stage 1 grounding and boxes, Stage 2 click revision, union (paper §4).

:class:`XFlow` ties the two policies and the segmenter together::

    image, instruction
      │  F_seg.set_image(image)                        encode once per run (per run_all)
      │  π_init → text → protocol.parse_stage1          lung boxes, presence, lesion boxes B
      ├─ absent → empty mask, instruction.absent_answer()
      │  F_seg.predict(B)                               one batched decoder call: M_0 per box
      │  for each box b_0 (independently):              Stage 2 (revision.revise_mask), at most T steps
      │      o_t = rendering.render_observation(image, M_t, clicks)
      │      π_rev → text → protocol.parse_stage2       click or stop
      │      b_t = geometry.grow_box(b_{t-1}, click)    positive click outside the box grows it
      │      M_t = F_seg(b_t, all clicks so far, previous low-res logits of M_{t-1})
      │      M_t = keep_connected_to(M_t, M_{t-1}, click)  components away from both dropped
      └─ union of the revised masks, the canonical answer, the :class:`~.trace.Trace`

Malformed policy output never crashes a run; the workflow decides as follows and records the
parser's problems and its own decision (``trace.warnings``):

* Stage 1 text that is not a string, or states no readable ``present``/``absent`` → treated
  as **absent** (empty mask, absent answer).
* ``present`` with no usable lesion box → treated as **absent**.
* ``absent`` with lesion boxes → the boxes are ignored (the parser drops them).
* Lesion boxes whose label is not the asked finding (e.g. ``pneumonia`` for an opacity, which
  is how lesion inference names the type) are segmented all the same.
* Every mask the segmenter returned is empty → treated as **absent**: a returned mask is the
  presence call, so a "present" answer with an empty mask would contradict it.
* Stage 2 text that holds no readable action (or a malformed click) → that lesion's revision
  **stops** with ``end="malformed"``; the mask stays the last good one. A click whose
  coordinates the parser had to clip is executed, with the problem recorded.

Answers (exact strings from :mod:`.instructions`):

* absent: ``instruction.absent_answer()``;
* basic, present: ``""`` (MIMIC-ILS answers a basic instruction with the mask alone;
  :attr:`XFlowResult.message` gives a readable sentence for people);
* global, present: ``Instruction.located_answer(regions)``, regions from :func:`locate_regions`;
* lesion inference, present: ``Instruction.lesion_answer(type, confident)``, see
  :func:`infer_lesion_type`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow import rle
from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import (
    Box,
    Click,
    GeometryError,
    check_click,
    check_image,
    clicks_box,
    grow_box,
    make_box,
    mask_to_box,
)
from monailabel_xflow.instructions import Instruction, all_findings, parse_instruction
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.base import MAX_CLICKS, RevisionPolicy, Stage1Policy, check_budget
from monailabel_xflow.policy.oracle import OracleClicker
from monailabel_xflow.policy.protocol import BoxRef, ProtocolError, parse_stage1
from monailabel_xflow.segmenter.base import PromptableSegmenter
from monailabel_xflow.segmenter.refine import ClickRefinement, refined_fork, refinement_for
from monailabel_xflow.vocabulary import HEART, LEFT_LUNG, LESION_INFERENCE_TARGETS, LUNGS, RIGHT_LUNG, ZONES
from monailabel_xflow.workflow.answers import AnswerKeys, wipe_replaced
from monailabel_xflow.workflow.revision import finite_or_none, revise_mask
from monailabel_xflow.workflow.trace import LesionRecord, RevisionStep, Stage1Record, Trace

if TYPE_CHECKING:  # pragma: no cover
    from monailabel_xflow.workflow.model_config import ModelConfig

logger = logging.getLogger(__name__)

MIN_REGION_SHARE = 0.10
"""A lung or zone is named in a located answer when it holds at least this share of the mask."""

MAX_ZONES_PER_LUNG = 2
"""A lung with more zones than this involved is named as the whole lung."""


class WorkflowError(InputError):
    """Bad input to the workflow: an image that is not ``(H, W)`` in ``[0, 1]``, bad clicks."""


@dataclass
class XFlowResult:
    """The answer to one instruction.

    Attributes:
        instruction: the canonical instruction answered.
        present: whether a (non-empty) mask was returned.
        mask: ``(H, W)`` bool, the union of the revised lesion masks (all False when absent).
        answer: the canonical answer sentence ("" for a present basic instruction).
        trace: every decision of the run.
    """

    instruction: Instruction
    present: bool
    mask: NDArray[np.bool_]
    answer: str
    trace: Trace

    @property
    def message(self) -> str:
        """A sentence for people (:meth:`~monailabel_xflow.instructions.Instruction.message`)."""
        return self.instruction.message(self.answer, len(self.trace.lesions), int(self.mask.sum()))


@dataclass
class RevisionResult:
    """The result of :meth:`XFlow.revise` (human clicks).

    Attributes:
        mask: ``(H, W)`` bool.
        box: the box prompt used (after growth by the positive clicks), normalised xyxy.
        iou: the segmenter's IoU estimate.
    """

    mask: NDArray[np.bool_]
    box: Box
    iou: float


def revise_with_clicks(
    segmenter: PromptableSegmenter,
    image: NDArray[np.float32],
    clicks: Sequence[Click],
    *,
    previous_mask: NDArray[np.bool_] | None = None,
    box: Box | None = None,
) -> RevisionResult:
    """Revise a mask with a person's clicks (the click-revision tool of the clients).

    One call of ``segmenter`` (given the image here) with a box and all the clicks. The box is
    ``box`` if given, else the tight box of ``previous_mask`` if it is non-empty, else the clicks' box
    (:func:`~.geometry.clicks_box`: the bounds of the positive clicks); then each positive
    click outside it grows it (:func:`~.geometry.grow_box`, as in Stage 2). The segmenter
    receives no previous logits (a person's mask has none); the previous mask acts through
    its box.

    Args:
        segmenter: F_seg (its current image is replaced).
        image: ``(H, W)`` float in ``[0, 1]``.
        clicks: normalised clicks in ``[0, 1]`` (``geometry.client_index_to_point``
            converts MONAI Label client indices).
        previous_mask: ``(H, W)`` mask being revised, or None.
        box: normalised xyxy box, or None.

    Raises:
        WorkflowError: bad image, mask of another size, a click outside the image, or nothing
            to start from (no box, no mask and no click).
    """
    image = check_image(image)
    clicks = [check_click(c) for c in clicks]
    if box is not None:
        try:
            b = make_box(*box)
        except (GeometryError, TypeError) as err:
            raise WorkflowError(f"bad box {box!r}: {err}") from err
    elif previous_mask is not None and np.asarray(previous_mask).any():
        previous_mask = np.asarray(previous_mask)
        if previous_mask.shape != image.shape:
            raise WorkflowError(f"previous_mask is {previous_mask.shape}, the image {image.shape}")
        b = mask_to_box(previous_mask)  # type: ignore[assignment]
    elif clicks:
        b = clicks_box(clicks)
    else:
        raise WorkflowError("nothing to revise: give clicks, a previous mask or a box")
    for c in clicks:
        b = grow_box(b, c)
    segmenter.set_image(image)
    res = segmenter.predict([b], clicks=[clicks] if clicks else None)
    return RevisionResult(mask=np.asarray(res.masks[0], dtype=bool), box=b, iou=float(res.iou[0]))


def client_session(
    segmenter: PromptableSegmenter, image: NDArray[np.float32], gt: NDArray[np.bool_], clicker: OracleClicker
) -> tuple[list[float], list[Click]]:
    """A simulated annotator's clicks as 3D Slicer and OHIF send them: each click a new request
    with every click so far and no mask, answered by :func:`revise_with_clicks`.

    Args:
        segmenter: F_seg.
        image: ``(H, W)`` float in ``[0, 1]``.
        gt: ``(H, W)`` bool ground-truth component.
        clicker: the simulated user (:meth:`OracleClicker.next_click` on the current mask); its
            ``max_clicks`` bounds the clicks.

    Returns:
        ``(ious, clicks)``: the IoU after each click (fewer than ``max_clicks`` when the user has
        no admissible click left), and the clicks.
    """
    gt = np.asarray(gt, bool)
    mask = np.zeros_like(gt)
    clicks: list[Click] = []
    ious: list[float] = []
    for _ in range(clicker.max_clicks):
        click = clicker.next_click(mask, gt, clicks)
        if click is None:
            break
        clicks.append(click)
        mask = revise_with_clicks(segmenter, image, clicks).mask
        ious.append(mask_iou(mask, gt))
    return ious, clicks


class XFlow:
    """Instruction-guided lesion segmentation of a chest radiograph (the XFlow workflow).

    Args:
        stage1: π_init (``Stage1Policy``: ``stage1(image, instruction)``, ``stage1_many``).
        reviser: π_rev (``RevisionPolicy``: ``start(image, instruction, box)`` returning a
            session with ``step(state)``), or None for Stage 1 only.
        segmenter: F_seg (``PromptableSegmenter``). The workflow calls ``set_image`` once per
            :meth:`run` / :meth:`run_all` / :meth:`revise`; caching embeddings across calls is
            the segmenter's business (it keys them by image content).
        max_clicks: Stage 2 budget T (``policy.base.check_budget``; default the paper's 4).
        models: model identities recorded in every trace.
        prune_revisions: after each Stage 2 click keep only the components of F_seg's mask that
            touch the previous mask or the positive click (:func:`~.revision.keep_connected_to`); the
            trace records the pruned masks.
        click_refinement: refine a person's clicks in :meth:`revise`
            (:mod:`monailabel_xflow.segmenter.refine`), whatever the segmenter does with π_rev's
            clicks in Stage 2 (``ModelConfig.stage2_click_refinement``).

    Images are ``(H, W)`` float arrays in ``[0, 1]`` (``transforms.load_cxr`` output); masks
    come back at the same size.

    Thread safety: the segmenter holds its current image and the policies their adapter state,
    so :meth:`run` and :meth:`run_all` of one instance run one at a time (a lock). :meth:`revise`
    uses its own ``segmenter.fork()`` (sharing model and embedding cache; every
    ``PromptableSegmenter`` forks), so a person's click is not queued behind a long run.
    """

    def __init__(
        self,
        stage1: Stage1Policy,
        reviser: RevisionPolicy | None,
        segmenter: PromptableSegmenter,
        *,
        max_clicks: int = MAX_CLICKS,
        models: dict[str, str] | None = None,
        prune_revisions: bool = True,
        click_refinement: ClickRefinement | None = None,
    ) -> None:
        self.click_refinement = click_refinement
        self.prune_revisions = bool(prune_revisions)
        self.stage1 = stage1
        self.reviser = reviser
        self.segmenter = segmenter
        self.max_clicks = check_budget(max_clicks)
        self.models = {str(k): str(v) for k, v in (models or {}).items()}
        self._lock = threading.RLock()

    @classmethod
    def from_config(cls, config: ModelConfig | dict[str, Any] | str | os.PathLike[str] | None) -> XFlow:
        """Load the models a :class:`~.models.ModelConfig` (or dict, or YAML/JSON file) names.

        Only local files and the local Hugging Face cache are read (``xflow weights pull``
        downloads). None reads the ``XFLOW_*`` environment variables.

        Raises:
            ModelConfigError: incomplete configuration or weights not available locally.
        """
        from monailabel_xflow.workflow.model_config import ModelConfig, load_models

        cfg = ModelConfig.load(config)
        loaded = load_models(cfg)
        return cls(
            loaded.stage1,
            loaded.reviser,
            loaded.segmenter,
            max_clicks=cfg.max_clicks,
            models=loaded.identities,
            click_refinement=refinement_for(cfg.click_refinement),
        )

    def replace_segmenter(self, segmenter: PromptableSegmenter) -> None:
        """Use another F_seg from the next run on (e.g. a fine-tuned one); waits for a run in progress.

        The workspace store's entries of the replaced weights (embeddings and answers) are wiped
        (:func:`~.answers.wipe_replaced`)."""
        with self._lock:
            old, self.segmenter = self.segmenter, segmenter
            wipe_replaced(old, segmenter)

    # --- public API -----------------------------------------------------------------------

    def run(
        self,
        image: NDArray[np.float32],
        instruction: Instruction | str,
        *,
        max_clicks: int | None = None,
        revise: bool = True,
        reviser: RevisionPolicy | None = None,
    ) -> XFlowResult:
        """Answer one instruction about one image.

        Args:
            image: ``(H, W)`` float in ``[0, 1]``.
            instruction: an :class:`Instruction`, or free text naming exactly one finding.
            max_clicks: Stage 2 budget for this run (default: the workflow's).
            revise: False skips Stage 2 (masks are the Stage 1 masks).
            reviser: a revision policy for this run only (e.g. the oracle clicker).

        Returns:
            The :class:`XFlowResult`. ``trace.timings`` holds seconds per phase:
            ``segmenter_encode``, ``stage1`` (policy), ``segmenter_decode`` (Stage 1 masks),
            ``stage2`` (all revision turns), ``total``.

        Raises:
            WorkflowError: bad image. InstructionError: text that is not one instruction.
        """
        instr = _as_instruction(instruction)
        image = check_image(image)
        budget = self.max_clicks if max_clicks is None else check_budget(max_clicks)
        with self._lock:
            # a run with its own reviser (the oracle) is never stored: its answers are not the models'
            keys = self._keys(image, [instr], "run", revise, budget) if reviser is None else None
            stored = self._stored(keys, [instr], budget)
            if stored is not None:
                return stored[0]
            timings: dict[str, float] = {}
            start = time.perf_counter()
            with _timed(timings, "segmenter_encode"):
                self.segmenter.set_image(image)
            with _timed(timings, "stage1"):
                text = self.stage1.stage1(image, instr)
            result = self._complete(image, instr, text, timings, start, budget, revise, reviser or self.reviser, None)
            if keys is not None:
                keys.save([result.trace])
                self._keep_stage1_only(image, [instr], [text], "run", budget, revise, timings)
            return result

    def run_all(
        self,
        image: NDArray[np.float32],
        *,
        max_clicks: int | None = None,
        revise: bool = True,
        instructions: Sequence[Instruction] | None = None,
    ) -> list[XFlowResult]:
        """Answer several instructions on one image, sharing the expensive parts.

        The segmenter encodes the image once and π_init reads the image prefix once
        (``stage1_many``). By default the instructions are "all findings": the seven findings
        at chest level (:func:`~.instructions.all_findings`).

        ``trace.timings["segmenter_encode"]`` and ``["stage1"]`` are the shared wall times of
        the whole batch (the same in every trace; ``trace.batch`` says so); the other phases,
        and ``total``, are this instruction's own work after them.
        """
        instrs = list(instructions) if instructions is not None else all_findings()
        if not instrs:
            return []
        image = check_image(image)
        budget = self.max_clicks if max_clicks is None else check_budget(max_clicks)
        with self._lock:
            keys = self._keys(image, instrs, "batch", revise, budget)
            stored = self._stored(keys, instrs, budget)
            if stored is not None:
                return stored
            shared: dict[str, float] = {}
            with _timed(shared, "segmenter_encode"):
                self.segmenter.set_image(image)
            with _timed(shared, "stage1"):
                texts = list(self.stage1.stage1_many(image, instrs))
            if len(texts) != len(instrs):
                logger.warning("stage1_many returned %d texts for %d instructions", len(texts), len(instrs))
            results = []
            for k, instr in enumerate(instrs):
                text = texts[k] if k < len(texts) else ""  # a missing text reads as malformed: absent
                start = time.perf_counter()
                results.append(
                    self._complete(
                        image,
                        instr,
                        text,
                        dict(shared),
                        start,
                        budget,
                        revise,
                        self.reviser,
                        {"index": k, "size": len(instrs)},
                    )
                )
            if keys is not None:
                keys.save([r.trace for r in results])
                padded = [texts[k] if k < len(texts) else "" for k in range(len(instrs))]
                self._keep_stage1_only(image, instrs, padded, "batch", budget, revise, shared)
            return results

    def has_answer(
        self,
        image: NDArray[np.float32],
        *,
        instructions: Sequence[Instruction] | None = None,
        revise: bool = True,
        max_clicks: int | None = None,
    ) -> bool:
        """Whether :meth:`run_all` with these arguments would be answered from the workspace store."""
        budget = self.max_clicks if max_clicks is None else check_budget(max_clicks)
        instrs = list(instructions) if instructions is not None else all_findings()
        keys = self._keys(check_image(image), instrs, "batch", revise, budget)
        return keys is not None and keys.has()

    def encode(self, image: NDArray[np.float32]) -> None:
        """Compute (or fetch) the image's embedding without waiting for a run in progress (a fork
        of the segmenter, as :meth:`revise` uses): afterwards a click on the image needs no encode."""
        self.segmenter.fork().set_image(check_image(image))

    def prepare(self, image: NDArray[np.float32], *, instructions: Sequence[Instruction] | None = None) -> bool:
        """Make 3D Slicer's Next Sample auto-run on ``image`` instant: the embedding and the
        Stage 1 only answers to ``instructions`` (default all findings, as the auto-run asks) are
        computed unless the workspace store holds them. Without a store only the encode is done
        (an answer kept nowhere would be wasted work). Returns whether the answers are stored."""
        image = check_image(image)
        instrs = list(instructions) if instructions is not None else all_findings()
        self.encode(image)
        keys = self._keys(image, instrs, "batch", False, self.max_clicks)
        if keys is None:
            return False
        if not keys.has():
            self.run_all(image, revise=False, instructions=instrs)
        return keys.has()

    # --- the workspace store ----------------------------------------------------------------

    def _keys(
        self, image: NDArray[np.float32], instrs: Sequence[Instruction], mode: str, revise: bool, budget: int
    ) -> AnswerKeys | None:
        """The stored answers' names of a request (:mod:`.answers`), or None when not stored."""
        return AnswerKeys.of(
            segmenter=self.segmenter,
            stage1=self.stage1,
            reviser=self.reviser,
            image=image,
            instructions=instrs,
            mode=mode,
            revise=bool(revise and self.reviser is not None),
            budget=budget,
            prune=self.prune_revisions,
        )

    def _stored(self, keys: AnswerKeys | None, instrs: Sequence[Instruction], budget: int) -> list[XFlowResult] | None:
        """The stored answers of a request, as results (the trace's ``stored`` says so)."""
        traces = keys.load(len(instrs)) if keys is not None else None
        if traces is None:
            return None
        results = []
        for instr, trace in zip(instrs, traces, strict=True):
            trace.settings["max_clicks"] = budget
            mask = trace.final_mask()
            results.append(
                XFlowResult(instruction=instr, present=trace.present, mask=mask, answer=trace.answer, trace=trace)
            )
        logger.info("%d answer(s) from the workspace store (%s)", len(results), keys.key if keys else "")
        return results

    def _keep_stage1_only(
        self,
        image: NDArray[np.float32],
        instrs: Sequence[Instruction],
        texts: Sequence[str],
        mode: str,
        budget: int,
        revise: bool,
        shared: dict[str, float],
    ) -> None:
        """After a run with Stage 2, also store the Stage 1 only answers of the same request (3D
        Slicer's Next Sample auto-run asks those): the same texts, the decoder only."""
        if not (revise and self.reviser is not None):
            return
        keys = self._keys(image, instrs, mode, False, budget)
        if keys is None or keys.has():
            return
        batch = mode == "batch"
        traces = []
        for k, (instr, text) in enumerate(zip(instrs, texts, strict=True)):
            start = time.perf_counter()
            info = {"index": k, "size": len(instrs)} if batch else None
            traces.append(self._complete(image, instr, text, dict(shared), start, budget, False, None, info).trace)
        keys.save(traces)

    def revise(
        self,
        image: NDArray[np.float32],
        clicks: Sequence[Click],
        *,
        previous_mask: NDArray[np.bool_] | None = None,
        box: Box | None = None,
    ) -> RevisionResult:
        """Revise a mask with a person's clicks (the click-revision tool of the clients):
        :func:`revise_with_clicks` on a fork of the segmenter (its own current image: no lock,
        no wait behind a run), refining the clicks when the models file says so
        (``click_refinement``, :func:`~monailabel_xflow.segmenter.refine.refined_fork`).

        Raises:
            WorkflowError: see :func:`revise_with_clicks`.
        """
        seg = refined_fork(self.segmenter, self.click_refinement)
        return revise_with_clicks(seg, image, clicks, previous_mask=previous_mask, box=box)

    # --- stages ---------------------------------------------------------------------------

    def _complete(
        self,
        image: NDArray[np.float32],
        instr: Instruction,
        text: str,
        timings: dict[str, float],
        start: float,
        budget: int,
        revise: bool,
        reviser: RevisionPolicy | None,
        batch: dict[str, int] | None,
    ) -> XFlowResult:
        """Everything after the Stage 1 text: parse, segment, revise, union, answer, trace."""
        warnings: list[str] = []
        stage1, present = _read_stage1(text, instr, warnings)
        union = np.zeros(image.shape, dtype=bool)
        lesions: list[LesionRecord] = []
        if present:
            boxes = [b.box for b in stage1.lesions]
            with _timed(timings, "segmenter_decode"):
                seg = self.segmenter.predict(boxes)
            policy = reviser if (revise and budget > 0) else None
            with _timed(timings, "stage2"):
                for i, ref in enumerate(stage1.lesions):
                    record, mask = self._revise_lesion(
                        image,
                        instr,
                        i,
                        ref,
                        seg.masks[i],
                        float(seg.iou[i]),
                        seg.low_res_logits[i : i + 1],
                        budget,
                        policy,
                    )
                    lesions.append(record)
                    union |= mask
            if not union.any():
                warnings.append("the segmenter returned an empty mask for every lesion box: answered as absent")
                present = False
        answer = _answer(instr, present, union, stage1, warnings)
        timings["total"] = time.perf_counter() - start
        for w in warnings:
            logger.warning("%s: %s", instr.text, w)
        trace = Trace(
            instruction=instr.to_dict(),
            image_size=(int(image.shape[0]), int(image.shape[1])),
            models=dict(self.models),
            settings={"max_clicks": budget, "revise": bool(revise and reviser is not None)},
            stage1=stage1,
            present=present,
            lesions=lesions,
            mask=rle.LazyRLE(union),
            answer=answer,
            warnings=warnings,
            timings=timings,
            batch=batch,
        )
        logger.info(
            "%s -> %s (%d lesion box(es), %.2f s)", instr.text, answer or "present", len(lesions), timings["total"]
        )
        return XFlowResult(instruction=instr, present=present, mask=union, answer=answer, trace=trace)

    def _revise_lesion(
        self,
        image: NDArray[np.float32],
        instr: Instruction,
        index: int,
        ref: BoxRef,
        mask0: NDArray[np.bool_],
        iou0: float,
        low_res0: NDArray[np.float32],
        budget: int,
        policy: RevisionPolicy | None,
    ) -> tuple[LesionRecord, NDArray[np.bool_]]:
        """Stage 2 for one lesion box (:func:`~.revision.revise_mask`), recorded for the trace."""
        mask = np.asarray(mask0, dtype=bool)
        iou = finite_or_none(iou0)
        record = LesionRecord(
            index=index, label=ref.label, box=ref.box, initial_mask=rle.LazyRLE(mask), initial_iou=iou
        )
        if policy is None:
            record.end, record.box_final, record.mask, record.iou = "not_revised", ref.box, record.initial_mask, iou
            return record, mask
        run = revise_mask(
            self.segmenter,
            policy.start(image, instr, ref.box),
            image,
            instr,
            ref.box,
            mask,
            low_res0,
            budget=budget,
            iou=iou,
            prune=self.prune_revisions,
        )
        for turn in run.turns:
            clicked = turn.action == "click"
            record.steps.append(
                RevisionStep(
                    step=turn.step,
                    raw=_text(turn.raw),
                    action=turn.action,
                    click=turn.click,
                    box=turn.box,
                    box_grown=turn.box_grown,
                    mask=rle.LazyRLE(turn.mask) if clicked else None,
                    iou=turn.iou,
                    problems=turn.problems,
                    seconds=turn.seconds,
                )
            )
        record.end = run.end
        record.box_final = run.box
        record.mask = rle.LazyRLE(run.mask)
        record.iou = run.iou
        return record, run.mask


# --- reading the policies ---------------------------------------------------------------------


def _read_stage1(text: str, instr: Instruction, warnings: list[str]) -> tuple[Stage1Record, bool]:
    """Parse π_init's text into a trace record and the presence decision (module docstring)."""
    try:
        parsed = parse_stage1(text)
    except ProtocolError as err:  # not a string at all
        warnings.append(f"Stage 1 output unreadable ({err}): answered as absent")
        return Stage1Record(raw=_text(text), present=None, problems=[str(err)]), False
    out = parsed.value
    record = Stage1Record(
        raw=text,
        think=out.think,
        lungs=list(out.lungs),
        present=out.present,
        lesions=list(out.lesions),
        problems=list(parsed.problems),
    )
    if out.present is None:
        warnings.append("Stage 1 states no readable presence: answered as absent")
        return record, False
    if out.present and not out.lesions:
        warnings.append("Stage 1 says present but gives no usable lesion box: answered as absent")
        return record, False
    expected = {instr.finding, HEART} if instr.finding == "cardiomegaly" else {instr.finding}
    off_target = sorted({r.label for r in out.lesions if r.label not in expected})
    if off_target and instr.kind != "lesion_inference":
        warnings.append(f"lesion box label(s) {off_target} differ from the asked {instr.finding!r}; segmented anyway")
    return record, bool(out.present)


# --- answers --------------------------------------------------------------------------------


def _answer(
    instr: Instruction, present: bool, mask: NDArray[np.bool_], stage1: Stage1Record, warnings: list[str]
) -> str:
    if not present:
        return instr.absent_answer()
    if instr.kind == "global":
        return instr.located_answer(locate_regions(mask, stage1.lungs, instr.finding))
    if instr.kind == "lesion_inference":
        inferred = infer_lesion_type(stage1)
        if inferred is None:
            warnings.append(
                f"Stage 1 names no lesion type ({', '.join(LESION_INFERENCE_TARGETS)}): answered with the mask only"
            )
            return ""
        return instr.lesion_answer(*inferred)
    return ""


def infer_lesion_type(stage1: Stage1Record) -> tuple[str, bool] | None:
    """The lesion type and confidence of a lesion-inference answer, from Stage 1.

    The protocol has no confidence marker, so the rule is: the type is the most frequent
    lesion-inference target (pneumonia, atelectasis, edema) among the lesion box labels; it
    is *confident* ("highly suggestive of") when every lesion box carries that label, else
    "possibly reflects". If no box names a type, the first type mentioned in the ``<think>``
    text is taken, not confident. None when neither names one.
    """
    labels = [b.label for b in stage1.lesions]
    typed = [label for label in labels if label in LESION_INFERENCE_TARGETS]
    if typed:
        counts = Counter(typed)
        best = max(counts, key=lambda label: (counts[label], -typed.index(label)))
        return best, all(label == best for label in labels)
    think = stage1.think.lower()
    found = [(think.find(t), t) for t in LESION_INFERENCE_TARGETS if t in think]
    if found:
        return min(found)[1], False
    return None


def locate_regions(mask: NDArray[np.bool_], lungs: Sequence[BoxRef], finding: str) -> tuple[str, ...]:
    """The regions a located (global) answer names, from where the mask lies.

    Rule: cardiomegaly is located in the ``heart``. Otherwise every mask pixel is given a side:
    the grounded lung box that contains it (both or none: the nearer box centre,
    horizontally); without lung boxes, the image half (the patient's right lung is on the
    image's left). Each lung holding at least :data:`MIN_REGION_SHARE` of the mask is named
    (the lung with the largest share always is). Within a named lung with a grounded box, the
    box is split into four equal horizontal bands (apical, upper, mid zone, base, top to
    bottom, a simple stand-in for the radiological zones); bands holding at least
    ``MIN_REGION_SHARE`` of that lung's part are the zones. More than
    :data:`MAX_ZONES_PER_LUNG` zones, or no grounded box, name the whole lung. Regions are
    ordered by their share of the mask, largest first.

    Args:
        mask: ``(H, W)`` bool, non-empty.
        lungs: Stage 1's grounded lung boxes (normalised).
        finding: the finding asked about.

    Returns:
        Non-empty tuple of region strings.
    """
    if finding == "cardiomegaly":
        return (HEART,)
    rows, cols = np.nonzero(mask)
    if rows.size == 0:
        raise WorkflowError("cannot locate an empty mask")
    h, w = mask.shape
    xs, ys = (cols + 0.5) / w, (rows + 0.5) / h
    boxes: dict[str, Box] = {}
    for ref in lungs:
        boxes.setdefault(ref.label, ref.box)

    side = np.where(xs < 0.5, 0, 1)  # 0: right lung (image left), 1: left lung
    if boxes:
        inside = {lung: _inside(boxes[lung], xs, ys) if lung in boxes else np.zeros_like(xs, bool) for lung in LUNGS}
        centre = {lung: (boxes[lung][0] + boxes[lung][2]) / 2 for lung in boxes}
        only_right = inside[RIGHT_LUNG] & ~inside[LEFT_LUNG]
        only_left = inside[LEFT_LUNG] & ~inside[RIGHT_LUNG]
        side = np.where(only_right, 0, np.where(only_left, 1, side))
        if len(centre) == 2:
            ambiguous = ~(only_right | only_left)
            nearer_left = np.abs(xs - centre[LEFT_LUNG]) < np.abs(xs - centre[RIGHT_LUNG])
            side = np.where(ambiguous, nearer_left.astype(int), side)

    named: list[tuple[float, str]] = []
    total = float(rows.size)
    shares = [(side == k).sum() / total for k in (0, 1)]
    for k, lung in enumerate(LUNGS):
        if shares[k] < MIN_REGION_SHARE and shares[k] < max(shares):
            continue
        part = side == k
        box = boxes.get(lung)
        if box is None or box[3] <= box[1]:
            named.append((shares[k], lung))
            continue
        band = np.clip(np.floor((ys[part] - box[1]) / (box[3] - box[1]) * 4), 0, 3).astype(int)
        zone_share = np.bincount(band, minlength=4) / max(1, part.sum())
        zones = [z for z in range(4) if zone_share[z] >= MIN_REGION_SHARE]
        if not zones or len(zones) > MAX_ZONES_PER_LUNG:
            named.append((shares[k], lung))
        else:
            named += [(shares[k] * zone_share[z], ZONES[lung][z]) for z in zones]
    named.sort(key=lambda t: -t[0])
    return tuple(region for _, region in named)


def _inside(box: Box, xs: NDArray[Any], ys: NDArray[Any]) -> NDArray[np.bool_]:
    return (xs >= box[0]) & (xs <= box[2]) & (ys >= box[1]) & (ys <= box[3])


# --- small helpers --------------------------------------------------------------------------


@contextlib.contextmanager
def _timed(timings: dict[str, float], key: str) -> Iterator[None]:
    tick = time.perf_counter()
    try:
        yield
    finally:
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - tick


def _as_instruction(instruction: Instruction | str) -> Instruction:
    if isinstance(instruction, Instruction):
        return instruction
    return parse_instruction(instruction)


def _text(raw: object) -> str:
    return raw if isinstance(raw, str) else repr(raw)


__all__ = [
    "XFlow",
    "XFlowResult",
    "RevisionResult",
    "revise_with_clicks",
    "client_session",
    "WorkflowError",
    "locate_regions",
    "infer_lesion_type",
]
