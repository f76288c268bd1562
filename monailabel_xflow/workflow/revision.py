"""Stage 2, the one loop: observe the mask -> the policy clicks or stops -> grow the box ->
re-segment (XFlow §4.2, Eq. 4.4: ``M_t = F_seg(I, b_t, {(s_i, p_i)}_{i<=t}, M_{t-1})``).

Every Stage 2 in the package runs through :func:`revise_mask`, each with its own policy:

* inference (:class:`~monailabel_xflow.workflow.xflow.XFlow`): π_rev, a VLM session
  (:class:`~monailabel_xflow.policy.vlm.VLMRevisionSession`) or the oracle
  (:class:`~monailabel_xflow.policy.oracle.OracleRevisionPolicy`, the benchmark's upper bound);
* Algorithm 1's trajectories (:func:`oracle_trajectory`, :func:`simulate_trajectories`), which
  the rev-sft builder turns into training conversations: the oracle's clicks;
* GRPO rollouts of π_rev (:mod:`monailabel_xflow.training.grpo`): the VLM being trained;
* tests: scripted sessions (:mod:`monailabel_xflow.testing`).

A person's clicks in the app take another road: clients resend all clicks of a session with
every request, so :meth:`XFlow.revise` answers them with one segmenter call.

Every policy speaks the text protocol (:mod:`monailabel_xflow.policy.protocol`): a session's
``step`` returns raw text, which is parsed here; any readable click is executed, anything else
ends the loop ("stop" for a readable stop, "malformed" when no action can be read).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.geometry import (
    FULL_VIEW,
    Box,
    Click,
    click_from_view,
    components_touching,
    connected_components,
    grow_box,
    mask_to_box,
    point_to_pixel,
    zoom_view,
)
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.base import RevisionSession, RevisionState, Stage2Answer
from monailabel_xflow.policy.oracle import (
    OracleClicker,
    OracleError,
    OracleRevisionPolicy,
    OracleStep,
    Trajectory,
    perturb_box,
)
from monailabel_xflow.policy.protocol import ProtocolError, Stage2Action, parse_stage2
from monailabel_xflow.segmenter.base import PromptableSegmenter

End = Literal["stop", "malformed", "max_clicks"]


@dataclass
class Turn:
    """One Stage 2 turn as the loop ran it.

    Attributes:
        step: 1-based turn number.
        raw: what the policy answered (protocol text; kept verbatim for the trace).
        action: ``"click"``, ``"stop"`` or ``"malformed"`` (no readable action).
        click: the executed click (normalised), None unless ``action == "click"``.
        problems: what the protocol parser noted about ``raw``.
        box: the box after the turn, normalised xyxy.
        box_grown: whether the click lay outside the box and grew it.
        mask: ``(H, W)`` bool mask after the turn (the input mask on a stop).
        iou: F_seg's predicted IoU of ``mask``, None on a stop or when not finite.
        seconds: wall time of the turn (policy and segmenter).
    """

    step: int
    raw: Stage2Answer
    action: str
    click: Click | None
    problems: list[str]
    box: Box
    box_grown: bool
    mask: NDArray[np.bool_]
    iou: float | None
    seconds: float


@dataclass
class Revision:
    """The outcome of :func:`revise_mask`.

    Attributes:
        box, mask, iou: the final box, ``(H, W)`` bool mask and F_seg's predicted IoU.
        low_res: ``(1, h, w)`` logits of the final mask (the next call's ``previous``).
        clicks: every executed click, in order.
        turns: every turn taken, clicks and the final stop alike.
        end: ``"stop"``, ``"malformed"`` or ``"max_clicks"`` (the budget ran out).
    """

    box: Box
    mask: NDArray[np.bool_]
    iou: float | None
    low_res: NDArray[np.float32] | None
    clicks: list[Click] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    end: End = "max_clicks"


def read_action(raw: Stage2Answer, view: Box = FULL_VIEW) -> tuple[Click | None, str, list[str]]:
    """A policy's answer -> ``(click, action, problems)``; ``action`` is ``"click"``,
    ``"stop"`` or ``"malformed"``. Never raises: a model's output is untrusted input.

    ``raw`` is protocol text, whose click is read in ``view``'s coordinates (what the policy
    looked at) and returned in the image's, or a
    :class:`~monailabel_xflow.policy.protocol.Stage2Action` in image coordinates from a policy
    that decides without words (the exact oracle of Algorithm 1)."""
    if isinstance(raw, Stage2Action):
        return raw.click, ("click" if raw.click is not None else "stop"), []
    try:
        parsed = parse_stage2(raw)
    except ProtocolError as err:  # not a string at all
        return None, "malformed", [str(err)]
    problems = list(parsed.problems)
    click = parsed.value.click
    if click is not None:
        return click_from_view(click, view), "click", problems
    return None, ("malformed" if any("no readable action" in p for p in problems) else "stop"), problems


def revise_mask(
    segmenter: PromptableSegmenter,
    session: RevisionSession,
    image: NDArray[np.float32] | None,
    instruction: Instruction | None,
    box: Box,
    mask: NDArray[np.bool_],
    low_res: NDArray[np.float32] | None,
    *,
    budget: int,
    iou: float | None = None,
    prune: bool = True,
    observe: bool = True,
    clicks: Sequence[Click] = (),
) -> Revision:
    """Run Stage 2 on one lesion mask: at most ``budget`` clicks, each re-running F_seg.

    Args:
        segmenter: F_seg, already holding ``image`` (``set_image``).
        session: the policy's conversation about this mask (``step(state) -> text``).
        image: ``(H, W)`` float in ``[0, 1]``; None only without ``observe`` for a policy that
            reads the mask itself (the oracle of :func:`oracle_trajectory`).
        instruction: the question being answered (None as for ``image``).
        box: the normalised box that prompted ``mask``.
        mask: ``(H, W)`` bool initial mask M_0.
        low_res: ``(1, h, w)`` logits of ``mask`` from the segmenter, or None.
        budget: the click budget T (0: no turn is taken).
        iou: F_seg's predicted IoU of ``mask``.
        prune: after each click keep only the components that touch the previous mask or the
            positive click (:func:`keep_connected_to`); inference and GRPO prune, Algorithm 1
            (the paper's oracle) does not.
        observe: render the observation for the policy (a VLM looks at it; the oracle reads
            the mask itself, so its trajectories skip the rendering).
        clicks: clicks already made on ``mask`` (they prompted it; default none): each later
            call passes them first, and they do not count against ``budget`` (the click
            benchmark's clicks-only prompt starts from a mask its first click made).

    Returns:
        The :class:`Revision`.
    """
    from monailabel_xflow.rendering import render_observation

    out = Revision(
        box=(box[0], box[1], box[2], box[3]),
        mask=np.asarray(mask, dtype=bool),
        iou=iou,
        low_res=low_res,
        clicks=list(clicks),
    )
    # A zooming session sees one window, fixed by the box that prompted the mask, for all turns
    view = zoom_view(box, out.mask.shape) if getattr(session, "zoom", False) else FULL_VIEW
    for t in range(1, budget + 1):
        tick = time.perf_counter()
        observation = (
            render_observation(image, out.mask, list(out.clicks), view) if observe and image is not None else None
        )
        state = RevisionState(image, instruction, out.box, out.mask, list(out.clicks), observation, t - 1, view)
        raw = session.step(state)
        click, action, problems = read_action(raw, view)
        if click is None:
            out.turns.append(
                Turn(t, raw, action, None, problems, out.box, False, out.mask, None, time.perf_counter() - tick)
            )
            out.end = action  # type: ignore[assignment]
            return out
        grown = grow_box(out.box, click)
        out.clicks.append(click)
        res = segmenter.predict([grown], clicks=[list(out.clicks)], previous=out.low_res)
        revised = np.asarray(res.masks[0], dtype=bool)
        if prune:
            revised = keep_connected_to(revised, out.mask, click)
        box_grown = tuple(grown) != tuple(out.box)
        out.box, out.mask, out.low_res, out.iou = grown, revised, res.low_res_logits[0:1], finite_or_none(res.iou[0])
        out.turns.append(
            Turn(t, raw, "click", click, problems, grown, box_grown, revised, out.iou, time.perf_counter() - tick)
        )
    out.end = "max_clicks"
    return out


def oracle_session(
    segmenter: PromptableSegmenter,
    gt: NDArray[np.bool_],
    clicker: OracleClicker,
    box: Box,
    clicks: Sequence[Click] = (),
    *,
    prune: bool = True,
) -> tuple[list[float], list[Click]]:
    """A simulated user's session on one component through the Stage 2 loop (:func:`revise_mask`).

    F_seg answers ``box`` (and ``clicks``, when the session starts from clicks already made), then
    the user (:meth:`OracleClicker.next_click <monailabel_xflow.policy.oracle.OracleClicker.next_click>`
    on the current mask, ``exact``) clicks until ``clicker.max_clicks`` clicks in all, a perfect
    mask or no admissible click; each call passes the box, every click so far and the previous
    ``low_res_logits``. The click benchmark and the train task's promotion check measure F_seg with it.

    Args:
        segmenter: F_seg, already holding the image.
        gt: ``(H, W)`` bool ground-truth component.
        clicker: the simulated user; its ``max_clicks`` bounds the session's clicks.
        box: normalised xyxy box of the first call.
        clicks: clicks already made (they count against ``max_clicks``).
        prune: prune as Stage 2 does (:func:`keep_connected_to`).

    Returns:
        ``(ious, clicks)``: the IoU of the first answer and after each later click, and every click.
    """
    gt = np.asarray(gt, bool)
    start = list(clicks)
    res = segmenter.predict([box], clicks=[start] if start else None)
    mask0 = np.asarray(res.masks[0], bool)
    run = revise_mask(
        segmenter,
        OracleRevisionPolicy(gt, clicker, exact=True).start(None, None, box),
        None,
        None,
        box,
        mask0,
        res.low_res_logits[0:1],
        budget=max(0, clicker.max_clicks - len(start)),
        prune=prune,
        observe=False,
        clicks=start,
    )
    ious = [mask_iou(mask0, gt)] + [mask_iou(t.mask, gt) for t in run.turns if t.click is not None]
    return ious, list(run.clicks)


def keep_connected_to(revised: NDArray[np.bool_], previous: NDArray[np.bool_], click: Click) -> NDArray[np.bool_]:
    """A click revises the lesion it was made on: the components of the revised mask that touch
    neither the previous mask nor a positive click's pixel are dropped (Stage 2 rule).

    F_seg answers a click with the whole mask again, and on the phantom demo those re-predictions
    sprouted small disconnected blobs far from the click. A positive click on a missed, separate
    part of the lesion keeps the component under it; a negative click can only remove.

    Args:
        revised: ``(H, W)`` bool mask F_seg returned for the click.
        previous: ``(H, W)`` bool mask before the click.
        click: the click (normalised point).

    Returns:
        ``(H, W)`` bool: ``revised`` without the components (8-connectivity) that overlap
        neither ``previous`` nor the positive click's pixel; ``revised`` unchanged when nothing
        would remain (a mask that moved entirely is F_seg's answer, not noise).
    """
    anchor = np.asarray(previous, bool) & revised
    if click.positive:
        r, c = point_to_pixel(click.x, click.y, revised.shape)
        anchor[min(r, revised.shape[0] - 1), min(c, revised.shape[1] - 1)] = True
    kept = components_touching(revised, anchor)
    return kept if kept.any() else revised


def finite_or_none(v: Any) -> float | None:
    """A segmenter's score as a float, or None when it is missing or not finite."""
    try:
        f = float(np.asarray(v).reshape(-1)[0])
    except (TypeError, ValueError, IndexError):
        return None
    return f if math.isfinite(f) else None


# --- Algorithm 1: the oracle's trajectories -------------------------------------------------------


def oracle_trajectory(
    segmenter: PromptableSegmenter,
    gt: NDArray[Any],
    clicker: OracleClicker | None = None,
    rng: np.random.Generator | int | None = None,
    component_id: int = 0,
) -> Trajectory:
    """Algorithm 1 for one ground-truth component, with both guards, through :func:`revise_mask`.

    The segmenter must already hold the image: the box around ``gt`` is perturbed
    (:func:`~monailabel_xflow.policy.oracle.perturb_box`), F_seg segments it, then the oracle
    clicks until ``IoU(M, G) >= τ``, ``T`` clicks, or no admissible click (no pruning: the
    paper's loop).

    Args:
        segmenter: a ``PromptableSegmenter`` whose image is set.
        gt: ``(H, W)`` ground-truth component G (non-empty), same size as the image.
        clicker: the oracle (default parameters if None).
        rng: generator or seed for the box perturbation.
        component_id: stored in the trajectory.

    Returns:
        The trajectory, with ``discarded=True`` if the discard guard rejected it.

    Raises:
        OracleError: ``gt`` not 2-D or empty, or the segmenter's mask of another shape.
    """
    clicker = clicker or OracleClicker()
    gt = np.asarray(gt)
    if gt.ndim != 2:
        raise OracleError(f"gt must be a 2-D (H, W) mask, got shape {gt.shape}")
    gt = gt.astype(bool)
    gt_box = mask_to_box(gt)
    if gt_box is None:
        raise OracleError("gt is empty: a trajectory needs a non-empty ground-truth component")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    box = perturb_box(gt_box, gt.shape, rng, clicker.box_noise, clicker.box_shift)
    result = segmenter.predict([box], None, None, False)
    mask = np.asarray(result.masks[0], dtype=bool)
    if mask.shape != gt.shape:
        raise OracleError(f"mask shape {mask.shape} differs from ground-truth shape {gt.shape}")
    traj = Trajectory(component_id, gt_box, box, mask, mask_iou(mask, gt))
    session = OracleRevisionPolicy(gt, clicker, exact=True).start(None, None, box)
    run = revise_mask(
        segmenter,
        session,
        None,
        None,
        box,
        mask,
        result.low_res_logits[0:1],
        budget=clicker.max_clicks,
        prune=False,
        observe=False,
    )
    traj.steps = [OracleStep(t.click, t.box, t.mask, mask_iou(t.mask, gt)) for t in run.turns if t.click is not None]
    # the stop reason Algorithm 1 checks first: τ, then the budget T, then "no admissible click"
    traj.stop_reason = session.stop_reason or ("tau" if mask_iou(run.mask, gt) >= clicker.tau else "T")
    traj.discard_reason = clicker.discard_reason(traj)
    traj.discarded = bool(traj.discard_reason)
    return traj


def simulate_trajectories(
    segmenter: PromptableSegmenter,
    image: NDArray[np.float32],
    gt_mask: NDArray[Any],
    oracle: OracleClicker | None = None,
    seed: int | None = 0,
    min_area_px: int = 1,
    keep_discarded: bool = False,
) -> list[Trajectory]:
    """One trajectory per connected component of a finding's mask (components revised independently).

    Sets the image on the segmenter once, then runs :func:`oracle_trajectory` per component.
    Component ``i`` draws its perturbation from ``SeedSequence(seed).spawn(n)[i]``, so a
    component's trajectory does not depend on what the other components drew.

    Args:
        segmenter: a ``PromptableSegmenter``.
        image: ``(H, W)`` float image in ``[0, 1]`` for ``segmenter.set_image``.
        gt_mask: ``(H, W)`` ground-truth mask of one finding (any number of components).
        oracle: the clicker (default parameters if None).
        seed: seed of the box perturbations (None = fresh entropy).
        min_area_px: components smaller than this are skipped.
        keep_discarded: also return trajectories the discard guard rejected.

    Returns:
        Trajectories in component order; ``component_id`` indexes
        ``connected_components(gt_mask, min_area_px)``.

    Raises:
        OracleError: ``gt_mask`` not 2-D or of another size than ``image``.
    """
    oracle = oracle or OracleClicker()
    gt_mask = np.asarray(gt_mask)
    if gt_mask.ndim != 2:
        raise OracleError(f"gt_mask must be a 2-D (H, W) mask, got shape {gt_mask.shape}")
    if tuple(np.shape(image)[:2]) != gt_mask.shape:
        raise OracleError(f"image shape {np.shape(image)} differs from gt_mask shape {gt_mask.shape}")
    components = connected_components(gt_mask.astype(bool), min_area_px)
    if not components:
        return []
    segmenter.set_image(image)
    seeds = np.random.SeedSequence(seed).spawn(len(components))
    out = []
    for i, (component, ss) in enumerate(zip(components, seeds, strict=False)):
        traj = oracle_trajectory(segmenter, component, oracle, np.random.default_rng(ss), component_id=i)
        if keep_discarded or not traj.discarded:
            out.append(traj)
    return out
