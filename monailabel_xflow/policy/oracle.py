"""The simulated user of XFlow (paper Appendix A.3, Algorithm 1).

The oracle clicker builds the revision trajectories π_rev is fine-tuned on, evaluates revision,
and drives active learning from saved labels. For one ground-truth component ``G``:

1. ``b = perturb(box(G))`` stands in for a first-stage box; ``M = F_seg(I, b)``.
2. For ``t = 0 … T``: stop if ``IoU(M, G) >= τ`` (reason ``"tau"``) or ``t = T`` (reason ``"T"``).
   Otherwise take the Euclidean distance transforms of the missed region ``G∖M`` and of the
   over-segmented region ``M∖G``; click **positive** at the deepest missed pixel if its depth is
   ``>=`` the deepest over-segmented pixel's, else **negative** there; grow ``b`` to contain the
   positive clicks (:func:`monailabel_xflow.geometry.grow_box`); ``M = F_seg(I, b, clicks, M)``,
   the previous mask entering as the segmenter's previous low-resolution logits.

Choices where the paper is silent (all configurable on :class:`OracleClicker`):

* **Box perturbation** (:func:`perturb_box`): the paper gives no magnitude. Each edge of the tight
  box moves independently by ``u * side``, ``u ~ U[-p, p]`` with ``p = 0.1`` by default (the 10 %
  of side length SAM uses as box noise), then the whole box optionally shifts by
  ``U[-s, s] * side`` per axis (``s = 0`` by default); the result is clipped to the image and kept
  at least one pixel wide and high. Randomness comes only from the ``numpy.random.Generator``
  passed in, so a seed fixes a trajectory.
* **Distance transform**: each region is zero-padded by one pixel before
  ``scipy.ndimage.distance_transform_edt``, so the image border counts as region boundary and
  clicks keep away from it, as in the reference oracle of Sofiiuk et al. (RITM,
  ``isegm/inference/clicker.py``). Depth is in pixels of the mask grid. Ties go to the first
  pixel in row-major order (smallest row, then smallest column), which makes the oracle
  deterministic. The transform runs on the region's bounding box plus that one-pixel ring, which
  gives exactly the full-image result at a fraction of the cost.
* **25-px guard**: pixels whose centre lies at Euclidean distance ``< min_click_distance_px``
  (25, in pixels of the mask grid) from an earlier click of the same polarity are removed from
  that polarity's candidates *before* the two maxima are compared, so the oracle takes the
  next-best admissible location, possibly of the other polarity (RITM likewise masks clicked
  pixels before comparing). When neither region has an admissible pixel the trajectory stops
  with reason ``"no-click"``.
* **Discard guard**: a trajectory that clicked at least once and whose final IoU is not strictly
  above its initial IoU is *returned* with ``discarded=True`` (and ``discard_reason``), never
  silently dropped; :func:`~monailabel_xflow.workflow.revision.simulate_trajectories` leaves such
  trajectories out unless
  ``keep_discarded=True``. ``discard_rule="every-click"`` is a stricter option that also
  discards a trajectory in which any single click failed to raise the IoU. A trajectory that
  stops before its first click (initial IoU already ``>= τ``) is kept: it demonstrates ``<stop/>``.
* **Components**: :func:`connected_components` uses 8-connectivity (pixels touching at a corner
  belong to one lesion), the 2-D default of ``skimage.measure.label``.
* **Serialisation**: :meth:`Trajectory.to_dict` stores masks as COCO compressed RLE
  (:mod:`monailabel_xflow.rle`), boxes and clicks as normalised floats.

The segmenter is any object with the ``PromptableSegmenter`` interface of
:mod:`monailabel_xflow.segmenter.sam3` (``set_image(image)`` once, then ``predict(boxes, clicks,
previous, multimask)`` returning a result with ``masks (N, H, W)`` and ``low_res_logits
(N, 1, h, w)``). This module never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage

from monailabel_xflow import rle
from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Box, Click, pixel_to_point, point_to_pixel
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.base import MAX_CLICKS, BudgetError, RevisionState, Stage2Answer, check_budget
from monailabel_xflow.policy.protocol import Stage2Action, format_stage2

if TYPE_CHECKING:  # pragma: no cover
    pass

__all__ = [
    "OracleError",
    "StopReason",
    "OracleStep",
    "Trajectory",
    "OracleClicker",
    "perturb_box",
    "OracleRevisionPolicy",
    "GroundTruthReviser",
    "PAYS",
    "simulated_user",
]

StopReason = Literal["tau", "T", "no-click"]
"""Why a trajectory ended: IoU reached τ, the click budget T was spent, or no admissible click."""

DiscardRule = Literal["net", "every-click"]

TAU = 0.70
"""Stop threshold τ of Algorithm 1."""

PAYS = 0.01
"""IoU gain of the oracle's revision of a Stage 1 lesion from which clicking counts as paying
(ours): what on-policy π_rev data teaches to click on, and what the benchmark scores π_rev by."""

MIN_CLICK_DISTANCE_PX = 25.0
"""Same-polarity exclusion radius of the paper's first guard, in mask pixels."""

BOX_NOISE = 0.1
"""Default edge jitter p of :func:`perturb_box`, as a fraction of box width/height."""


class OracleError(InputError):
    """Bad input to the oracle: a mask that is not a 2-D array, an empty ground-truth component,
    shapes that disagree, an out-of-range parameter, or a malformed trajectory dict."""


# --- masks ----------------------------------------------------------------------------------


def _as_mask(mask: NDArray[Any], name: str) -> NDArray[Any]:
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise OracleError(f"{name} must be a 2-D (H, W) mask, got shape {mask.shape}")
    return mask.astype(bool, copy=False)


# --- the oracle's geometry ------------------------------------------------------------------


def perturb_box(
    box: Sequence[float],
    shape: Sequence[int],
    rng: np.random.Generator,
    noise: float = BOX_NOISE,
    shift: float = 0.0,
) -> Box:
    """Randomly perturb a normalised box, standing in for a first-stage box.

    Each edge moves by ``u * side`` with ``u ~ U[-noise, noise]`` drawn independently per edge
    (``side`` = box width for x1/x2, height for y1/y2); then the box shifts by
    ``U[-shift, shift] * side`` per axis. The result is clipped to ``[0, 1]`` and widened around
    its centre to at least one pixel of the ``(H, W)`` grid if clipping made it thinner.

    Args:
        box: normalised ``(x1, y1, x2, y2)``.
        shape: ``(H, W)`` of the image the box lives on (for the one-pixel minimum).
        rng: the only source of randomness.
        noise: edge jitter ``p`` in ``[0, 0.5)`` (below 0.5 the edges cannot cross).
        shift: whole-box shift ``s`` in ``[0, 1]``.

    Returns:
        The perturbed normalised box.

    Raises:
        OracleError: ``noise`` or ``shift`` out of range.
    """
    _check_perturbation(noise, shift)
    x1, y1, x2, y2 = (float(v) for v in box)
    w, h = x2 - x1, y2 - y1
    dx1, dy1, dx2, dy2 = rng.uniform(-noise, noise, size=4)
    sx, sy = rng.uniform(-shift, shift, size=2)
    x1, x2 = x1 + dx1 * w + sx * w, x2 + dx2 * w + sx * w
    y1, y2 = y1 + dy1 * h + sy * h, y2 + dy2 * h + sy * h
    min_w, min_h = 1.0 / shape[1], 1.0 / shape[0]
    x1, x2 = _clip_span(x1, x2, min_w)
    y1, y2 = _clip_span(y1, y2, min_h)
    return (x1, y1, x2, y2)


def _check_perturbation(noise: float, shift: float) -> None:
    if not 0.0 <= noise < 0.5:
        raise OracleError(f"box noise must lie in [0, 0.5), got {noise}")
    if not 0.0 <= shift <= 1.0:
        raise OracleError(f"box shift must lie in [0, 1], got {shift}")


def _clip_span(lo: float, hi: float, min_len: float) -> tuple[float, float]:
    lo, hi = min(max(lo, 0.0), 1.0), min(max(hi, 0.0), 1.0)
    if hi - lo < min_len:
        centre = min(max((lo + hi) / 2, min_len / 2), 1.0 - min_len / 2)
        lo, hi = centre - min_len / 2, centre + min_len / 2
    return lo, hi


def _deepest_admissible(
    region: NDArray[Any], excluded: Sequence[tuple[int, int]], radius: float
) -> tuple[float, int, int]:
    """Deepest pixel of ``region`` by padded EDT, outside discs around ``excluded`` pixels.

    Returns ``(depth, row, col)``; depth 0.0 (and row = col = -1) when no pixel is admissible.
    """
    rows = np.flatnonzero(region.any(axis=1))
    if rows.size == 0:
        return 0.0, -1, -1
    cols = np.flatnonzero(region.any(axis=0))
    r0, c0 = rows[0], cols[0]
    crop = region[r0 : rows[-1] + 1, c0 : cols[-1] + 1]
    # The one-pixel zero ring stands for everything outside the crop, image border included
    # (exact: clamping any outside background pixel onto the ring never increases its distance).
    depth = ndimage.distance_transform_edt(np.pad(crop, 1))[1:-1, 1:-1]
    if excluded:
        rr, cc = np.ogrid[r0 : r0 + crop.shape[0], c0 : c0 + crop.shape[1]]
        for er, ec in excluded:
            depth[(rr - er) ** 2 + (cc - ec) ** 2 < radius**2] = 0.0
    flat = int(np.argmax(depth))  # first maximum in row-major order
    r, c = divmod(flat, crop.shape[1])
    best = float(depth[r, c])
    return (best, int(r0 + r), int(c0 + c)) if best > 0 else (0.0, -1, -1)


# --- trajectories ---------------------------------------------------------------------------


@dataclass
class OracleStep:
    """One click of a trajectory and what it produced.

    Attributes:
        click: the oracle's click (normalised, at the centre of the chosen pixel).
        box: the box after growth, prompted together with all clicks so far.
        mask: bool ``(H, W)`` mask the segmenter returned.
        iou: ``IoU(mask, G)``.
    """

    click: Click
    box: Box
    mask: NDArray[Any]
    iou: float


@dataclass
class Trajectory:
    """One revision trajectory of Algorithm 1, as plain data.

    The trajectory's turns are ``(M_0, a_1), (M_1, a_2), …, (M_k, <stop/>)`` (see :meth:`turns`):
    each observation mask is followed by the action taken on it.

    Attributes:
        component_id: index of the ground-truth component (:func:`connected_components` order).
        gt_box: tight normalised box of the component.
        initial_box: the perturbed box that produced ``initial_mask``.
        initial_mask: bool ``(H, W)`` ``M_0 = F_seg(I, initial_box)``.
        initial_iou: ``IoU(M_0, G)``.
        steps: one :class:`OracleStep` per click, in order.
        stop_reason: ``"tau"``, ``"T"`` or ``"no-click"``.
        discarded: True when the discard guard rejected the trajectory (see ``discard_reason``).
        discard_reason: why, or ``""``.
    """

    component_id: int
    gt_box: Box
    initial_box: Box
    initial_mask: NDArray[Any]
    initial_iou: float
    steps: list[OracleStep] = field(default_factory=list)
    stop_reason: StopReason = "T"
    discarded: bool = False
    discard_reason: str = ""

    @property
    def clicks(self) -> list[Click]:
        return [s.click for s in self.steps]

    @property
    def masks(self) -> list[NDArray[Any]]:
        """``[M_0, M_1, …, M_k]``."""
        return [self.initial_mask] + [s.mask for s in self.steps]

    @property
    def ious(self) -> list[float]:
        """``[IoU(M_0, G), …, IoU(M_k, G)]``."""
        return [self.initial_iou] + [s.iou for s in self.steps]

    @property
    def final_mask(self) -> NDArray[Any]:
        return self.masks[-1]

    @property
    def final_iou(self) -> float:
        return self.ious[-1]

    @property
    def gain(self) -> float:
        """``IoU(M_final, G) - IoU(M_0, G)`` (the paper's R_gain for this trajectory)."""
        return self.final_iou - self.initial_iou

    def turns(self) -> list[tuple[NDArray[Any], Click | None]]:
        """Algorithm 1's output: ``(observation mask, action)`` pairs, the last action None (stop)."""
        masks = self.masks
        return [(masks[i], self.steps[i].click) for i in range(len(self.steps))] + [(masks[-1], None)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; masks as COCO compressed RLE (:func:`monailabel_xflow.rle.encode`)."""
        return {
            "component_id": int(self.component_id),
            "gt_box": [float(v) for v in self.gt_box],
            "initial_box": [float(v) for v in self.initial_box],
            "initial_mask": rle.encode(self.initial_mask),
            "initial_iou": float(self.initial_iou),
            "steps": [
                {
                    "click": {"positive": bool(s.click.positive), "x": float(s.click.x), "y": float(s.click.y)},
                    "box": [float(v) for v in s.box],
                    "mask": rle.encode(s.mask),
                    "iou": float(s.iou),
                }
                for s in self.steps
            ],
            "stop_reason": self.stop_reason,
            "discarded": bool(self.discarded),
            "discard_reason": self.discard_reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trajectory:
        """Inverse of :meth:`to_dict`.

        Raises:
            OracleError: a missing key, a malformed value, or an unknown stop reason.
        """
        try:
            steps = [
                OracleStep(
                    click=Click(bool(s["click"]["positive"]), float(s["click"]["x"]), float(s["click"]["y"])),
                    box=_box(s["box"]),
                    mask=rle.decode(s["mask"]),
                    iou=float(s["iou"]),
                )
                for s in data["steps"]
            ]
            traj = cls(
                component_id=int(data["component_id"]),
                gt_box=_box(data["gt_box"]),
                initial_box=_box(data["initial_box"]),
                initial_mask=rle.decode(data["initial_mask"]),
                initial_iou=float(data["initial_iou"]),
                steps=steps,
                stop_reason=data["stop_reason"],
                discarded=bool(data["discarded"]),
                discard_reason=str(data.get("discard_reason", "")),
            )
        except (KeyError, TypeError, ValueError) as err:  # rle.RLEError is a ValueError
            raise OracleError(f"malformed trajectory dict: {err!r}") from err
        if traj.stop_reason not in ("tau", "T", "no-click"):
            raise OracleError(f"malformed trajectory dict: unknown stop_reason {traj.stop_reason!r}")
        return traj


def _box(values: Sequence[float]) -> Box:
    if len(values) != 4:
        raise ValueError(f"a box needs 4 numbers, got {list(values)}")
    return tuple(float(v) for v in values)  # type: ignore[return-value]


class OracleClicker:
    """The simulated user of Algorithm 1, usable step by step or for a whole trajectory.

    Args:
        tau: stop threshold τ on ``IoU(M, G)``.
        max_clicks: click budget T.
        min_click_distance_px: same-polarity exclusion radius, in mask pixels.
        box_noise: edge jitter ``p`` of :func:`perturb_box`.
        box_shift: whole-box shift ``s`` of :func:`perturb_box`.
        discard_rule: ``"net"`` (final IoU must beat the initial IoU) or ``"every-click"``
            (additionally, every click must raise the IoU).

    Raises:
        OracleError: a parameter out of range.
    """

    def __init__(
        self,
        tau: float = TAU,
        max_clicks: int = MAX_CLICKS,
        min_click_distance_px: float = MIN_CLICK_DISTANCE_PX,
        box_noise: float = BOX_NOISE,
        box_shift: float = 0.0,
        discard_rule: DiscardRule = "net",
    ) -> None:
        if not 0.0 < tau <= 1.0:
            raise OracleError(f"tau must lie in (0, 1], got {tau}")
        try:
            max_clicks = check_budget(max_clicks)
        except BudgetError as err:
            raise OracleError(str(err)) from err
        if min_click_distance_px < 0:
            raise OracleError(f"min_click_distance_px must be >= 0, got {min_click_distance_px}")
        if discard_rule not in ("net", "every-click"):
            raise OracleError(f"discard_rule must be 'net' or 'every-click', got {discard_rule!r}")
        _check_perturbation(box_noise, box_shift)
        self.tau = float(tau)
        self.max_clicks = int(max_clicks)
        self.min_click_distance_px = float(min_click_distance_px)
        self.box_noise = float(box_noise)
        self.box_shift = float(box_shift)
        self.discard_rule = discard_rule

    # -- one step ----------------------------------------------------------------------------

    def next_click(self, mask: NDArray[Any], gt: NDArray[Any], previous_clicks: Sequence[Click] = ()) -> Click | None:
        """The oracle's click on ``mask`` (lines 8–14 of Algorithm 1 plus the 25-px guard).

        Ignores τ and T (see :meth:`decide`).

        Args:
            mask: current ``(H, W)`` prediction M.
            gt: ``(H, W)`` ground-truth component G.
            previous_clicks: clicks already issued (normalised), for the exclusion guard.

        Returns:
            A positive click at the deepest admissible pixel of ``G∖M`` if that depth is ``>=``
            the deepest admissible depth of ``M∖G``, else a negative click there; None when
            neither region has an admissible pixel. The click sits at the pixel centre.

        Raises:
            OracleError: masks not 2-D or of different shapes.
        """
        mask, gt = self._check(mask, gt)
        shape = gt.shape
        taken: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        for c in previous_clicks:
            taken[bool(c.positive)].append(point_to_pixel(c.x, c.y, shape))
        radius = self.min_click_distance_px
        miss = _deepest_admissible(gt & ~mask, taken[True], radius)
        over = _deepest_admissible(mask & ~gt, taken[False], radius)
        if miss[0] == 0.0 and over[0] == 0.0:
            return None
        positive = miss[0] >= over[0]
        _, row, col = miss if positive else over
        x, y = pixel_to_point(row, col, shape)
        return Click(positive, x, y)

    def decide(
        self, mask: NDArray[Any], gt: NDArray[Any], previous_clicks: Sequence[Click] = ()
    ) -> tuple[Click | None, StopReason | None]:
        """One turn of the revision policy: stop, or the next click (lines 5–14 of Algorithm 1).

        Args:
            mask: current ``(H, W)`` prediction M.
            gt: ``(H, W)`` ground-truth component G.
            previous_clicks: clicks already issued in this trajectory (they count against T).

        Returns:
            ``(None, "tau")`` if ``IoU(mask, gt) >= τ`` (checked first), ``(None, "T")`` if
            ``len(previous_clicks) >= T``, ``(None, "no-click")`` if :meth:`next_click` finds
            no admissible click, else ``(click, None)``.
        """
        mask, gt = self._check(mask, gt)
        if mask_iou(mask, gt) >= self.tau:
            return None, "tau"
        if len(previous_clicks) >= self.max_clicks:
            return None, "T"
        click = self.next_click(mask, gt, previous_clicks)
        return (click, None) if click is not None else (None, "no-click")

    # -- judging a trajectory ---------------------------------------------------------------

    def discard_reason(self, traj: Trajectory) -> str:
        """Why the discard guard rejects ``traj`` (empty: kept)."""
        if not traj.steps:
            return ""
        if traj.final_iou <= traj.initial_iou:
            return (
                f"clicked {len(traj.steps)} times without improving IoU "
                f"({traj.initial_iou:.4f} -> {traj.final_iou:.4f})"
            )
        if self.discard_rule == "every-click":
            ious = traj.ious
            for t in range(1, len(ious)):
                if ious[t] <= ious[t - 1]:
                    return f"click {t} did not improve IoU ({ious[t - 1]:.4f} -> {ious[t]:.4f})"
        return ""

    @staticmethod
    def _check(mask: NDArray[Any], gt: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any]]:
        mask, gt = _as_mask(mask, "mask"), _as_mask(gt, "gt")
        if mask.shape != gt.shape:
            raise OracleError(f"mask shape {mask.shape} differs from ground-truth shape {gt.shape}")
        return mask, gt


class OracleRevisionPolicy:
    """The simulated user of Algorithm 1 (paper Appendix A.3) acting as a revision policy.

    Each turn asks :meth:`OracleClicker.decide` for the ground-truth component: stop once
    ``IoU(M, G) >= τ``, after ``T`` clicks, or when no admissible click is left; otherwise click
    the deepest point of the missed (positive) or over-segmented (negative) region.

    Args:
        gt_mask: ``(H, W)`` bool ground-truth component G, same shape as the masks it will see.
        clicker: an ``OracleClicker`` (default: the paper's τ = 0.70, T = 4, 25 px guard).
        exact: answer with the :class:`~monailabel_xflow.policy.protocol.Stage2Action` itself,
            the click at its exact pixel centre (Algorithm 1's trajectories); by default the
            action is written as protocol text (:func:`format_stage2`, coordinates on the
            0-1000 grid, a short ``<think>`` naming the reason), as π_rev would say it.

    Raises:
        OracleError: ``gt_mask`` is not 2-D.
    """

    def __init__(self, gt_mask: NDArray[Any], clicker: OracleClicker | None = None, exact: bool = False) -> None:
        self.gt = _as_mask(gt_mask, "gt_mask")
        self.clicker = clicker if clicker is not None else OracleClicker()
        self.exact = bool(exact)

    def start(self, image: NDArray[Any] | None, instruction: Instruction | None, box: Box) -> OracleSession:
        return OracleSession(self)


_ORACLE_REASONS = {
    "tau": "The mask follows the lesion.",
    "T": "The click budget is spent.",
    "no-click": "No click can improve the mask.",
}


@dataclass
class OracleSession:
    """One revision conversation of the oracle; ``stop_reason`` says why it stopped, if it did."""

    policy: OracleRevisionPolicy
    stop_reason: StopReason | None = None
    zoom: bool = False  # it reads the mask itself and answers in image coordinates

    def step(self, state: RevisionState) -> Stage2Answer:
        mask = np.asarray(state.mask, dtype=bool)
        if mask.shape != self.policy.gt.shape:
            raise OracleError(f"mask shape {mask.shape} differs from ground-truth shape {self.policy.gt.shape}")
        click, reason = self.policy.clicker.decide(mask, self.policy.gt, list(state.clicks))
        self.stop_reason = reason
        if click is None:
            action = Stage2Action(None, _ORACLE_REASONS.get(reason or "", ""))
        else:
            action = Stage2Action(
                click,
                "The mask misses part of the lesion."
                if click.positive
                else "The mask covers tissue outside the lesion.",
            )
        return action if self.policy.exact else format_stage2(action)


def simulated_user(max_clicks: int, min_click_distance_px: float = MIN_CLICK_DISTANCE_PX) -> OracleClicker:
    """The simulated annotator of the click benchmark and the promotion check: the oracle, never
    stopping at τ (τ = 1: it stops only on a perfect mask, after ``max_clicks`` clicks, or with no
    admissible click)."""
    return OracleClicker(tau=1.0, max_clicks=max_clicks, min_click_distance_px=min_click_distance_px)


class GroundTruthReviser:
    """π_rev replaced by the simulated user of Algorithm 1 that holds the question's ground truth.

    For each Stage 1 lesion box the oracle revises towards one GT component: the one with the most
    pixels inside the box, or, when the box holds none, the one whose centre lies nearest the box
    centre (the lesion the box was meant for). On a negative question (empty GT) the target is
    empty, so the oracle clicks negative on what was drawn. Clicks, τ = 0.7, T and the 25 px guard
    are :class:`~monailabel_xflow.policy.oracle.OracleClicker`'s.

    Args:
        gt: ``(H, W)`` bool ground truth of the question at the image's size.
        clicker: an ``OracleClicker`` (default: the paper's settings).
    """

    def __init__(self, gt: NDArray[Any], clicker: OracleClicker | None = None) -> None:
        from monailabel_xflow.geometry import connected_components

        self.gt: NDArray[np.bool_] = np.asarray(gt, bool)
        self.clicker = clicker if clicker is not None else OracleClicker()
        self.components = connected_components(self.gt)

    def target(self, box: Box) -> NDArray[np.bool_]:
        """The GT component a lesion box (normalised xyxy) is revised towards (empty if none)."""
        if not self.components:
            return np.zeros_like(self.gt)
        h, w = self.gt.shape
        x1, y1, x2, y2 = box
        r0, r1 = int(np.floor(y1 * h)), int(np.ceil(y2 * h))
        c0, c1 = int(np.floor(x1 * w)), int(np.ceil(x2 * w))
        inside = [int(c[r0:r1, c0:c1].sum()) for c in self.components]
        if max(inside) > 0:
            return self.components[int(np.argmax(inside))]
        cy, cx = (y1 + y2) / 2 * h, (x1 + x2) / 2 * w
        dist = []
        for c in self.components:
            rows, cols = np.nonzero(c)
            dist.append((rows.mean() - cy) ** 2 + (cols.mean() - cx) ** 2)
        return self.components[int(np.argmin(dist))]

    def start(self, image: NDArray[np.float32], instruction: Instruction, box: Box) -> OracleSession:
        """The oracle's session for one lesion box (:class:`~monailabel_xflow.policy.base.RevisionPolicy`)."""
        return OracleRevisionPolicy(self.target(box), self.clicker).start(image, instruction, box)
