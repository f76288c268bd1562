"""Lesion masks from three visual cues: Algorithm 1 of the MIMIC-ILS paper.

Inputs per image, all on the same ``(H, W)`` pixel grid (row 0 at the top):

* ``x`` and ``x_hat``: the radiograph and its healthy counterfactual, uint8 (the paper's 8-bit
  ``x``; the counterfactual is the RadEdit role, :mod:`monailabel_xflow.ils.stages`).
* the anomaly image ``x_ano = (x - x_hat) / 255`` (signed float) and the anomaly map
  ``A = {x_ano >= tau_ano}`` (:func:`anomaly_image`, :func:`anomaly_map`);
* anatomy masks of the reported locations ``M_i`` and the lungs ``L_r``, ``L_l`` (bool);
* lesion boxes ``B_j`` in continuous pixel ``(x1, y1, x2, y2)`` with a confidence in ``[0, 1]``.

For each box the four conditions of Algorithm 1 (:func:`check_box`), with the thresholds of the
paper's Table 7 (:class:`Thresholds`; edema has its own ``tau_ano`` and ``tau_conf``; the
higher-recall variant halves them all, :meth:`Thresholds.halved`):

* c1 ``IoU(B, union M_i) >= tau_anatomy`` (0.25)
* c2 ``conf >= tau_conf`` (0.20, edema 0.01)
* c3 ``|B & A| / |B| >= tau_signal`` (0.20)
* c4 ``IoU(B, L_r) >= tau_size or IoU(B, L_l) >= tau_size`` (0.10)

A box passing all four contributes the connected components of ``A`` (8-connected) that touch
it, each refined (:func:`refine`); the lesion mask is their union (:func:`lesion_mask`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import ndimage

from monailabel_xflow.geometry import box_to_mask, components_touching, pixels_to_box
from monailabel_xflow.metrics import mask_iou

EIGHT = np.ones((3, 3), dtype=bool)
"""8-connectivity, as :func:`monailabel_xflow.geometry.connected_components` uses."""


@dataclass(frozen=True)
class Thresholds:
    """The thresholds of Algorithm 1 (paper Table 7).

    Attributes:
        anomaly: ``tau_ano`` on ``x_ano`` (fraction of the 8-bit range).
        anomaly_edema: ``tau_ano`` for edema, which spreads widely with subtle changes.
        anatomy: ``tau_anatomy``, c1's IoU of the box with the reported-location union.
        confidence: ``tau_conf``, c2's detector confidence.
        confidence_edema: ``tau_conf`` for edema.
        signal: ``tau_signal``, c3's share of box pixels in the anomaly map.
        size: ``tau_size``, c4's IoU of the box with either lung.
    """

    anomaly: float = 0.10
    anomaly_edema: float = 0.01
    anatomy: float = 0.25
    confidence: float = 0.20
    confidence_edema: float = 0.01
    signal: float = 0.20
    size: float = 0.10

    def halved(self) -> Thresholds:
        """The paper's higher-recall variant: every threshold halved."""
        return Thresholds(**{k: v / 2 for k, v in asdict(self).items()})

    def anomaly_for(self, finding: str) -> float:
        return self.anomaly_edema if finding == "edema" else self.anomaly

    def confidence_for(self, finding: str) -> float:
        return self.confidence_edema if finding == "edema" else self.confidence


DEFAULT_THRESHOLDS = Thresholds()
HIGH_RECALL_THRESHOLDS = DEFAULT_THRESHOLDS.halved()


@dataclass(frozen=True)
class RefineParams:
    """Post-processing of a component (paper App. A.5; sizes are not published: ours).

    Attributes:
        open_radius: opening radius in pixels per 1000 px of image side (removes scattered
            noise); the same radius closes small holes afterwards.
        grow_radius: how far (pixels per 1000 px of side) growth into similar intensity may reach.
        grow_tolerance: a pixel is similar when ``|x - mean(x over the component)|`` is at most
            this many grey levels (8-bit).
    """

    open_radius: float = 3.0
    grow_radius: float = 12.0
    grow_tolerance: float = 12.0

    def pixels(self, per_thousand: float, shape: Sequence[int]) -> int:
        return max(1, int(round(per_thousand * max(shape) / 1000)))


def anomaly_image(x: np.ndarray, x_hat: np.ndarray) -> np.ndarray:
    """``x_ano = (x - x_hat) / 255`` as float32 ``(H, W)`` in ``[-1, 1]``.

    Raises:
        ValueError: shapes differ or an input is not 2-D.
    """
    x, x_hat = np.asarray(x), np.asarray(x_hat)
    if x.ndim != 2 or x.shape != x_hat.shape:
        raise ValueError(f"x and x_hat must be 2-D and alike, got {x.shape} and {x_hat.shape}")
    return (x.astype(np.float32) - x_hat.astype(np.float32)) / 255.0


def anomaly_map(x_ano: np.ndarray, tau: float) -> np.ndarray:
    """``A = {x_ano >= tau}`` (bool): pixels the counterfactual darkened by at least ``tau``."""
    return np.asarray(x_ano) >= tau


@dataclass(frozen=True)
class Detection:
    """One lesion box of the detector (the YOLO role).

    Attributes:
        box: continuous pixel ``(x1, y1, x2, y2)`` on the image grid, x = column.
        confidence: in ``[0, 1]``.
        label: the detector's class name (VinDr-CXR style), kept for the review sheet.
    """

    box: tuple[float, float, float, float]
    confidence: float
    label: str = "lesion"

    def mask(self, shape: Sequence[int]) -> np.ndarray:
        """Pixels whose centres lie in the box (:func:`monailabel_xflow.geometry.box_to_mask`)."""
        return box_to_mask(pixels_to_box(self.box, shape), shape)


@dataclass(frozen=True)
class BoxCheck:
    """The four conditions of Algorithm 1 for one box, with the values they compared."""

    anatomy_iou: float
    confidence: float
    signal: float
    lung_iou: float
    c1: bool
    c2: bool
    c3: bool
    c4: bool

    @property
    def passed(self) -> bool:
        return self.c1 and self.c2 and self.c3 and self.c4

    def failed(self) -> list[str]:
        return [c for c in ("c1", "c2", "c3", "c4") if not getattr(self, c)]


def check_box(
    box: np.ndarray,
    confidence: float,
    anomaly: np.ndarray,
    reported_union: np.ndarray,
    right_lung: np.ndarray,
    left_lung: np.ndarray,
    finding: str,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
) -> BoxCheck:
    """Conditions c1-c4 of Algorithm 1 for one box mask (formulae in the module docstring).

    Args:
        box: bool ``(H, W)`` box mask ``B_j``.
        confidence: the detector's confidence for it.
        anomaly: bool anomaly map ``A`` (already thresholded for ``finding``).
        reported_union: bool union of the reported-location anatomy masks.
        right_lung, left_lung: bool lung masks (the HybridGNet role).
        finding: the reported finding (edema has its own confidence threshold).
    """
    area = int(np.count_nonzero(box))
    anatomy_iou = mask_iou(box, reported_union) if reported_union.any() else 0.0
    signal = np.count_nonzero(box & anomaly) / area if area else 0.0
    lung_iou = max(
        mask_iou(box, right_lung) if right_lung.any() else 0.0, mask_iou(box, left_lung) if left_lung.any() else 0.0
    )
    return BoxCheck(
        anatomy_iou=float(anatomy_iou),
        confidence=float(confidence),
        signal=float(signal),
        lung_iou=float(lung_iou),
        c1=area > 0 and anatomy_iou >= thresholds.anatomy,
        c2=confidence >= thresholds.confidence_for(finding),
        c3=area > 0 and signal >= thresholds.signal,
        c4=area > 0 and lung_iou >= thresholds.size,
    )


def _disk(radius: int) -> np.ndarray:
    r = np.arange(-radius, radius + 1)
    return (r[:, None] ** 2 + r[None, :] ** 2) <= radius * radius


def extend_to_costophrenic_angle(mask: np.ndarray, lung: np.ndarray) -> np.ndarray:
    """Fill ``lung`` below the upper edge of ``mask`` down to the lung's lowest rows.

    For every lung column holding mask pixels the fill starts at the column's top mask pixel;
    lung columns without any (typically the lateral costophrenic recess the anomaly map missed)
    take the top row interpolated from the nearest columns that have one. Only rows in the lower
    half of the lung are filled: effusion is a finding of the base.

    Returns:
        bool ``(H, W)``: ``mask`` plus the filled lung pixels.
    """
    inside = mask & lung
    if not inside.any():
        return mask.copy()
    rows = np.flatnonzero(lung.any(axis=1))
    mid_row = (rows[0] + rows[-1]) / 2
    cols = np.flatnonzero(inside.any(axis=0))
    tops = np.argmax(inside[:, cols], axis=0).astype(np.float64)
    lung_cols = np.flatnonzero(lung.any(axis=0))
    top_all = np.interp(lung_cols, cols, tops)  # constant beyond the outermost columns
    top_all = np.maximum(top_all, mid_row)
    grid = np.arange(mask.shape[0])[:, None]
    fill = np.zeros_like(mask)
    fill[:, lung_cols] = grid >= np.ceil(top_all)[None, :]
    return mask | (fill & lung)


def refine(
    component: np.ndarray,
    image: np.ndarray,
    lungs: Sequence[np.ndarray],
    finding: str,
    params: RefineParams = RefineParams(),
) -> np.ndarray:
    """Refine(C) of Algorithm 1 (paper App. A.5).

    1. Opening then closing with a disk (scattered noise out, small holes closed).
    2. Growth into adjacent pixels of similar intensity: pixels of the lungs within
       ``grow_radius`` of the component whose grey level is within ``grow_tolerance`` of the
       component's mean, reached through such pixels (geodesic growth).
    3. Effusion only: each lung whose lower half the mask reaches is filled below the mask to its
       costophrenic angle (:func:`extend_to_costophrenic_angle`).

    Args:
        component: bool ``(H, W)``, the components of ``A`` touching a kept box.
        image: the radiograph ``x`` (uint8 or float in grey levels), ``(H, W)``.
        lungs: the lung masks (HybridGNet role); growth and the effusion fill stay inside them.
        finding: the reported finding.

    Returns:
        bool ``(H, W)``; may be empty when the opening removes everything.
    """
    shape = component.shape
    disk = _disk(params.pixels(params.open_radius, shape))
    mask = ndimage.binary_opening(component, structure=disk)
    mask = mask | ndimage.binary_closing(mask, structure=disk)
    if not mask.any():
        return mask
    lung_any = np.zeros(shape, bool)
    for lung in lungs:
        lung_any |= lung
    grey = np.asarray(image, dtype=np.float32)
    mean = float(grey[mask].mean())
    reach = ndimage.binary_dilation(mask, structure=_disk(params.pixels(params.grow_radius, shape)))
    similar = reach & lung_any & (np.abs(grey - mean) <= params.grow_tolerance)
    mask = ndimage.binary_propagation(mask, structure=EIGHT, mask=mask | similar)
    if finding == "effusion":
        for lung in lungs:
            rows = np.flatnonzero(lung.any(axis=1))
            if rows.size and (mask & lung)[int((rows[0] + rows[-1]) / 2) :].any():
                mask = extend_to_costophrenic_angle(mask, lung)
    return mask


@dataclass
class LesionResult:
    """What Algorithm 1 made of one reported finding.

    Attributes:
        mask: bool ``(H, W)`` lesion mask (empty when no box passed or refinement left nothing).
        checks: one :class:`BoxCheck` per detection, in detection order.
        kept: indices of the detections that passed c1-c4 and gave a non-empty component.
    """

    mask: np.ndarray
    checks: list[BoxCheck] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    @property
    def generated(self) -> bool:
        return bool(self.mask.any())

    def why_not(self) -> str:
        """Review-sheet reason when no mask came out ("" when one did)."""
        if self.generated:
            return ""
        if not self.checks:
            return "no lesion box"
        failed: dict[str, int] = {}
        for check in self.checks:
            for c in check.failed():
                failed[c] = failed.get(c, 0) + 1
        if not failed:
            return "boxes passed but refinement left no pixels"
        return "no box passed c1-c4 (failures: " + ", ".join(f"{c} x{n}" for c, n in sorted(failed.items())) + ")"


def lesion_mask(
    finding: str,
    x: np.ndarray,
    x_ano: np.ndarray,
    reported_masks: Sequence[np.ndarray],
    detections: Sequence[Detection],
    right_lung: np.ndarray,
    left_lung: np.ndarray,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    refine_params: RefineParams = RefineParams(),
) -> LesionResult:
    """Algorithm 1 for one reported finding.

    Args:
        finding: the reported finding (sets the edema thresholds and the effusion refinement).
        x: the radiograph, uint8 ``(H, W)``.
        x_ano: :func:`anomaly_image` of ``x`` and its counterfactual.
        reported_masks: anatomy masks ``M_i`` of the reported locations.
        detections: the detector's boxes for the image.
        right_lung, left_lung: lung masks.
        thresholds: Table 7 (or :meth:`Thresholds.halved`).

    Returns:
        :class:`LesionResult`.
    """
    shape = x.shape
    anomaly = anomaly_map(x_ano, thresholds.anomaly_for(finding))
    union = np.zeros(shape, bool)
    for m in reported_masks:
        union |= m
    out = LesionResult(np.zeros(shape, bool))
    for j, det in enumerate(detections):
        box = det.mask(shape)
        check = check_box(box, det.confidence, anomaly, union, right_lung, left_lung, finding, thresholds)
        out.checks.append(check)
        if not check.passed:
            continue
        component = components_touching(anomaly, box)
        if component.any():
            refined = refine(component, x, (right_lung, left_lung), finding, refine_params)
            if refined.any():
                out.mask |= refined
                out.kept.append(j)
    return out
