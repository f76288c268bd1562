"""Segmentation metrics of the XFlow evaluation (paper §5.2, §6.1, App. B).

Work is split in two so that large evaluations stay fast and resumable:

1. :func:`sample_stats` reduces one (prediction, ground truth) pair to a few integers
   (:class:`SampleStats`: intersection, union, areas, component and speck counts). Only this step
   touches pixels, and only inside the bounding box of the two masks.
2. :func:`summarize` turns any collection of those records into the reported figures, and
   :func:`summarize_groups` / :func:`level_average` slice them per finding and per question level.

Definitions (every ratio over an empty set is ``nan``, written ``null`` in JSON):

- **gIoU**: mean per-sample IoU over positive samples (a positive has a non-empty GT mask; an
  empty prediction on it scores 0).
- **cIoU**: Σ intersection / Σ union over positive samples.
- **N-Acc**: share of negative samples whose prediction is entirely empty (one stray pixel fails).
- **Presence precision / recall / F1**: a non-empty prediction is a positive call.
- **gIoU (all samples, ROSALIA)**: mean IoU over *all* samples with an empty prediction on an
  empty target scoring 1 and a non-empty one on an empty target 0. Reported separately, because
  it mixes N-Acc into gIoU; it is *not* the paper's gIoU.
- **Mask noise** (positives only): ΔC = C(pred) − C(GT); a *speck* is a connected component with
  fewer than 0.1 % of the image's pixels (``geometry.SPECK_FRACTION``, the one speck rule);
  "outside GT" specks share no pixel with the GT mask;
  speck area is the share of the predicted mask's pixels that lie in specks.

Connected components use **8-connectivity** (pixels touching at a corner belong to one
component): a lesion outline drawn by a radiologist and resized to another resolution often
touches itself only diagonally, and 4-connectivity would count such staircase steps as extra
fragments. Pass ``connectivity=4`` to :func:`sample_stats` to change it.

Question levels are averaged with **equal weight** (:func:`level_average`), never pooled: the zone
level holds most of the negatives (paper App. B) and pooling would mostly report N-Acc at the
zone level.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

import numpy as np
from numpy.typing import NDArray
from scipy import ndimage

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import SPECK_FRACTION, speck_area_px
from monailabel_xflow.vocabulary import LEVELS

__all__ = [
    "CONNECTIVITY",
    "SPECK_FRACTION",
    "MetricsError",
    "SampleStats",
    "sample_stats",
    "summarize",
    "summarize_groups",
    "level_average",
    "RATE_KEYS",
]

CONNECTIVITY = 8
"""Default pixel connectivity for component counting (8 = corners touch)."""

RATE_KEYS: tuple[str, ...] = ("giou", "ciou", "n_acc", "precision", "recall", "f1", "giou_all")
"""The summary entries that are averaged over levels by :func:`level_average`."""

_STRUCTURES = {4: ndimage.generate_binary_structure(2, 1), 8: ndimage.generate_binary_structure(2, 2)}


class MetricsError(InputError):
    """Masks that cannot be compared (shape mismatch, not 2-D) or a bad parameter."""


@dataclass(frozen=True)
class SampleStats:
    """Pixel counts of one (prediction, ground truth) pair; everything the metrics need.

    Attributes:
        intersection: pixels in both masks.
        union: pixels in either mask.
        pred_area: predicted pixels.
        gt_area: ground-truth pixels (0 for a negative sample).
        image_area: H * W of the compared masks (the speck threshold is relative to it).
        pred_components: connected components of the prediction.
        gt_components: connected components of the ground truth.
        pred_specks: prediction components smaller than ``SPECK_FRACTION * image_area``.
        pred_specks_outside_gt: of those, the ones sharing no pixel with the ground truth.
        pred_speck_area: pixels of the prediction lying in specks.
        gt_specks: ground-truth components that are specks (the paper's "GT" noise row).
        gt_speck_area: ground-truth pixels lying in specks.
    """

    intersection: int
    union: int
    pred_area: int
    gt_area: int
    image_area: int
    pred_components: int
    gt_components: int
    pred_specks: int
    pred_specks_outside_gt: int
    pred_speck_area: int
    gt_specks: int
    gt_speck_area: int

    @property
    def positive(self) -> bool:
        """The sample has a lesion (non-empty ground truth)."""
        return self.gt_area > 0

    @property
    def predicted_positive(self) -> bool:
        """The prediction calls the lesion present (non-empty mask)."""
        return self.pred_area > 0

    @property
    def iou(self) -> float:
        """IoU; 0 on a positive with an empty prediction, ``nan`` when both masks are empty."""
        return self.intersection / self.union if self.union else math.nan

    @property
    def iou_all(self) -> float:
        """ROSALIA's per-sample IoU: 1 when both masks are empty."""
        return self.intersection / self.union if self.union else 1.0

    @property
    def delta_components(self) -> int:
        """ΔC = C(pred) − C(GT)."""
        return self.pred_components - self.gt_components

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SampleStats:
        return cls(**{f.name: int(data[f.name]) for f in fields(cls)})


def mask_iou(a: NDArray[Any], b: NDArray[Any]) -> float:
    """Intersection over union of two ``(H, W)`` masks (non-zero = foreground).

    The single-pair IoU used by the oracle, the rewards and training checks; 1.0 when both are
    empty (nothing to disagree on). The evaluation's per-sample figures come from
    :func:`sample_stats`, which keeps the empty-on-empty case apart.
    """
    a, b = np.asarray(a, dtype=bool), np.asarray(b, dtype=bool)
    union = np.count_nonzero(a | b)
    return 1.0 if union == 0 else np.count_nonzero(a & b) / union


def _bbox(mask: NDArray[np.bool_]) -> tuple[int, int, int, int] | None:
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(mask[rows[0] : rows[-1] + 1].any(axis=0))
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


def _as_mask(mask: NDArray[Any] | None, name: str) -> NDArray[np.bool_] | None:
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise MetricsError(f"{name} mask must be 2-D (H, W), got shape {mask.shape}")
    return mask if mask.dtype == bool else mask != 0


def _components(crop: NDArray[np.bool_], structure: NDArray[np.bool_]) -> tuple[NDArray[np.int32], NDArray[np.intp]]:
    """Label image and per-component sizes (index i-1 is label i)."""
    labels, n = ndimage.label(crop, structure=structure)
    sizes = np.bincount(labels.ravel(), minlength=n + 1)[1:]
    return labels, sizes


def sample_stats(
    pred: NDArray[Any] | None,
    gt: NDArray[Any] | None,
    *,
    connectivity: int = CONNECTIVITY,
    speck_fraction: float = SPECK_FRACTION,
) -> SampleStats:
    """Reduce one (prediction, ground truth) pair to :class:`SampleStats`.

    Args:
        pred: predicted mask, shape (H, W), non-zero = lesion; ``None`` = empty prediction.
        gt: ground-truth mask of the same shape; ``None`` or all-zero = negative sample.
        connectivity: 8 (default) or 4.
        speck_fraction: speck threshold as a fraction of H * W.

    Returns:
        The sample's counts.

    Raises:
        MetricsError: masks are not 2-D, shapes differ, both are ``None``, or bad connectivity.
    """
    if connectivity not in _STRUCTURES:
        raise MetricsError(f"connectivity must be 4 or 8, got {connectivity}")
    pred = _as_mask(pred, "predicted")
    gt = _as_mask(gt, "ground-truth")
    ref = pred if pred is not None else gt
    if ref is None:
        raise MetricsError("need at least one mask to know the image size")
    if pred is not None and gt is not None and pred.shape != gt.shape:
        raise MetricsError(f"predicted mask {pred.shape} and ground truth {gt.shape} differ in shape")
    shape = ref.shape
    image_area = int(shape[0] * shape[1])
    threshold = speck_area_px(shape, speck_fraction)
    structure = _STRUCTURES[connectivity]

    # Everything happens inside the bounding box of both masks: lesions are small, images large.
    boxes = [b for b in (_bbox(m) for m in (pred, gt) if m is not None) if b is not None]
    if not boxes:
        return SampleStats(0, 0, 0, 0, image_area, 0, 0, 0, 0, 0, 0, 0)
    r0, r1 = min(b[0] for b in boxes), max(b[1] for b in boxes)
    c0, c1 = min(b[2] for b in boxes), max(b[3] for b in boxes)
    p = pred[r0:r1, c0:c1] if pred is not None else np.zeros((r1 - r0, c1 - c0), bool)
    g = gt[r0:r1, c0:c1] if gt is not None else np.zeros((r1 - r0, c1 - c0), bool)

    pred_area = int(np.count_nonzero(p))
    gt_area = int(np.count_nonzero(g))
    intersection = int(np.count_nonzero(p & g))
    union = pred_area + gt_area - intersection

    pred_specks = outside = pred_speck_area = pred_components = 0
    if pred_area:
        labels, sizes = _components(p, structure)
        pred_components = int(sizes.size)
        is_speck = sizes < threshold
        touches_gt = np.bincount(labels[g], minlength=sizes.size + 1)[1:] > 0
        pred_specks = int(is_speck.sum())
        outside = int((is_speck & ~touches_gt).sum())
        pred_speck_area = int(sizes[is_speck].sum())
    gt_specks = gt_speck_area = gt_components = 0
    if gt_area:
        _, gsizes = _components(g, structure)
        gt_components = int(gsizes.size)
        gt_specks = int((gsizes < threshold).sum())
        gt_speck_area = int(gsizes[gsizes < threshold].sum())
    return SampleStats(
        intersection=intersection,
        union=union,
        pred_area=pred_area,
        gt_area=gt_area,
        image_area=image_area,
        pred_components=pred_components,
        gt_components=gt_components,
        pred_specks=pred_specks,
        pred_specks_outside_gt=outside,
        pred_speck_area=pred_speck_area,
        gt_specks=gt_specks,
        gt_speck_area=gt_speck_area,
    )


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def summarize(stats: Iterable[SampleStats]) -> dict[str, Any]:
    """Metrics of a set of samples (one level, one finding, or anything else).

    Returns:
        dict with counts ``n``, ``n_positive``, ``n_negative``, ``tp``, ``fp``, ``fn``, ``tn``;
        rates ``giou``, ``ciou``, ``n_acc``, ``precision``, ``recall``, ``f1``, ``giou_all``
        (ROSALIA's all-samples gIoU); and the mask-noise means over positives ``noise``:
        ``delta_c``, ``specks``, ``specks_outside_gt``, ``speck_area_pct`` (mean per-case share of
        the predicted mask in specks, over positives with a non-empty prediction),
        ``speck_area_pct_pooled`` (Σ speck pixels / Σ predicted pixels), and the GT row
        ``gt_specks``, ``gt_speck_area_pct``. Undefined ratios are ``nan``.
    """
    stats = list(stats)
    pos = [s for s in stats if s.positive]
    neg = [s for s in stats if not s.positive]
    tp = sum(s.predicted_positive for s in pos)
    fn = len(pos) - tp
    fp = sum(s.predicted_positive for s in neg)
    tn = len(neg) - fp
    pos_called = [s for s in pos if s.pred_area]
    return {
        "n": len(stats),
        "n_positive": len(pos),
        "n_negative": len(neg),
        "tp": tp,
        "fp": fp,
        "fn": fn,
        "tn": tn,
        "giou": _mean([s.iou for s in pos]),
        "ciou": _ratio(sum(s.intersection for s in pos), sum(s.union for s in pos)),
        "n_acc": _ratio(tn, len(neg)),
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "f1": _ratio(2 * tp, 2 * tp + fp + fn),
        "giou_all": _mean([s.iou_all for s in stats]),
        "noise": {
            "n": len(pos),
            "delta_c": _mean([s.delta_components for s in pos]),
            "specks": _mean([s.pred_specks for s in pos]),
            "specks_outside_gt": _mean([s.pred_specks_outside_gt for s in pos]),
            "speck_area_pct": _mean([100.0 * s.pred_speck_area / s.pred_area for s in pos_called]),
            "speck_area_pct_pooled": 100.0 * _ratio(sum(s.pred_speck_area for s in pos), sum(s.pred_area for s in pos)),
            "gt_specks": _mean([s.gt_specks for s in pos]),
            "gt_speck_area_pct": _mean([100.0 * s.gt_speck_area / s.gt_area for s in pos]),
        },
    }


K = TypeVar("K", bound=Hashable)
"""A group key of :func:`summarize_groups` (a level, a finding, a (finding, level) pair)."""


def summarize_groups(items: Iterable[tuple[K, SampleStats]]) -> dict[K, dict[str, Any]]:
    """:func:`summarize` per group key, keys in first-seen order.

    Args:
        items: ``(key, stats)`` pairs, e.g. ``(case.level, stats)`` or ``(case.finding, stats)``.
    """
    groups: dict[K, list[SampleStats]] = {}
    for key, stats in items:
        groups.setdefault(key, []).append(stats)
    return {key: summarize(group) for key, group in groups.items()}


def level_average(per_level: Mapping[str, Mapping[str, Any]], levels: Sequence[str] = LEVELS) -> dict[str, Any]:
    """Equal-weight average of each rate in :data:`RATE_KEYS` over question levels.

    A level missing from ``per_level``, or whose rate is ``nan`` (e.g. no negatives, so no N-Acc),
    is left out of that rate's average; ``levels_used`` lists which levels contributed to gIoU.

    Args:
        per_level: output of :func:`summarize_groups` keyed by level.
        levels: the levels to average (default chest, lung, zone).
    """
    out: dict[str, Any] = {}
    for key in RATE_KEYS:
        values = [per_level[lv][key] for lv in levels if lv in per_level and not math.isnan(per_level[lv][key])]
        out[key] = float(np.mean(values)) if values else math.nan
    out["levels_used"] = [lv for lv in levels if lv in per_level and not math.isnan(per_level[lv]["giou"])]
    return out
