"""Bootstrap confidence intervals over images (phantoms), not questions.

Questions asked of one image share its anatomy, its lesions and one Stage 1 pass, so they are not
independent: resampling questions understates the uncertainty. :func:`resample_weights` draws
whole images with replacement (each replicate gives every question the number of times its image
was drawn), and :func:`metrics` computes, for every replicate at once, the figures of
:func:`~monailabel_xflow.eval.evaluate.build_report` (gIoU, cIoU, F1, N-Acc per level and their
equal-weight level average; ΔC and specks over positives). With weights of one the figures are
exactly the report's. A paired difference between two methods scored on the same questions is the
difference of their figures under the *same* weights (:func:`interval` of ``a - b``).

Intervals are percentile intervals (2.5 and 97.5 percentiles for 95 %); a replicate in which a
figure is undefined (a level without negatives, say) is left out of that figure's interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.metrics import SampleStats
from monailabel_xflow.vocabulary import LEVELS

__all__ = ["Scored", "resample_weights", "metrics", "interval", "RATES", "NOISE"]

RATES = ("giou", "ciou", "f1", "n_acc")
"""Figures averaged over levels with equal weight (as ``metrics.level_average``)."""

NOISE = ("delta_c", "specks", "specks_outside_gt")
"""Mask-noise figures: means over the positive questions, levels pooled (as the report's noise)."""


@dataclass
class Scored:
    """One method's per-question figures as arrays (``n`` questions, in a fixed order).

    Attributes:
        group: ``(n,)`` int, the image (phantom) each question is about, ``0 .. n_groups - 1``.
        level: ``(n,)`` int, index into :data:`~monailabel_xflow.vocabulary.LEVELS`.
        positive: ``(n,)`` bool, the GT mask is not empty.
        drawn: ``(n,)`` bool, the prediction is not empty (the presence decision).
        iou, inter, union, delta_c, specks, specks_outside_gt: ``(n,)`` float, per question.
    """

    group: NDArray[Any]
    level: NDArray[Any]
    positive: NDArray[Any]
    drawn: NDArray[Any]
    iou: NDArray[Any]
    inter: NDArray[Any]
    union: NDArray[Any]
    delta_c: NDArray[Any]
    specks: NDArray[Any]
    specks_outside_gt: NDArray[Any]

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]], groups: Sequence[Any]) -> Scored:
        """Arrays of scored records (``results.jsonl`` lines with ``stats`` and ``level``).

        Args:
            records: one per question, all scored.
            groups: the image of each record (any hashable: a path, a study id).

        Raises:
            ValueError: lengths differ, or a record is unscored or of an unknown level.
        """
        if len(records) != len(groups):
            raise ValueError(f"{len(records)} records but {len(groups)} groups")
        ids: dict[Any, int] = {}
        group = np.asarray([ids.setdefault(g, len(ids)) for g in groups], int)
        stats = []
        for r in records:
            if "stats" not in r or r.get("level") not in LEVELS:
                raise ValueError(f"record {r.get('case_id')!r} is not scored or has no known level")
            stats.append(SampleStats.from_dict(r["stats"]))
        pos = np.asarray([s.positive for s in stats], bool)
        return cls(
            group=group,
            level=np.asarray([LEVELS.index(r["level"]) for r in records], int),
            positive=pos,
            drawn=np.asarray([s.predicted_positive for s in stats], bool),
            iou=np.asarray([s.iou if s.positive else 0.0 for s in stats], float),
            inter=np.asarray([s.intersection for s in stats], float),
            union=np.asarray([s.union for s in stats], float),
            delta_c=np.asarray([s.delta_components for s in stats], float),
            specks=np.asarray([s.pred_specks for s in stats], float),
            specks_outside_gt=np.asarray([s.pred_specks_outside_gt for s in stats], float),
        )


def resample_weights(group: NDArray[Any], replicates: int = 2000, seed: int = 0) -> NDArray[Any]:
    """Per-question weights of ``replicates`` resamplings of the images, with replacement.

    Args:
        group: ``(n,)`` image index of every question (``0 .. G - 1``).
        replicates: how many resamplings B.
        seed: the generator's seed (the same seed, the same intervals).

    Returns:
        ``(B, n)`` float: how many times each question's image was drawn in each replicate.
    """
    group = np.asarray(group, int)
    n_groups = int(group.max()) + 1 if group.size else 0
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n_groups, size=(replicates, n_groups))
    counts = np.zeros((replicates, n_groups))
    np.add.at(counts, (np.arange(replicates)[:, None], draws), 1.0)
    return counts[:, group]


def _ratio(num: NDArray[Any], den: NDArray[Any]) -> NDArray[Any]:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def metrics(s: Scored, weights: NDArray[Any], subset: NDArray[Any] | None = None) -> dict[str, NDArray[Any]]:
    """The report's figures under each row of ``weights``.

    Args:
        s: one method's questions.
        weights: ``(B, n)`` (:func:`resample_weights`; ``np.ones((1, n))`` for the point estimate).
        subset: ``(n,)`` bool, questions to keep (e.g. one finding), or None for all.

    Returns:
        ``{name: (B,) array}``: ``giou``, ``ciou``, ``f1``, ``n_acc`` (equal-weight average over the
        levels where defined), the same per level as ``"<level>/<name>"``, and ``delta_c``,
        ``specks``, ``specks_outside_gt`` (means over positives); nan where undefined.
    """
    w = np.atleast_2d(np.asarray(weights, float))
    if subset is not None:
        w = w * np.asarray(subset, bool)
    pos, neg = w * s.positive, w * ~s.positive
    out: dict[str, NDArray[Any]] = {}
    per_level: dict[str, list[NDArray[Any]]] = {k: [] for k in RATES}
    for k, level in enumerate(LEVELS):
        at = s.level == k
        p, q = pos * at, neg * at
        tp, fn = (p * s.drawn).sum(1), (p * ~s.drawn).sum(1)
        fp, tn = (q * s.drawn).sum(1), (q * ~s.drawn).sum(1)
        values = {
            "giou": _ratio((p * s.iou).sum(1), p.sum(1)),
            "ciou": _ratio((p * s.inter).sum(1), (p * s.union).sum(1)),
            "f1": _ratio(2 * tp, 2 * tp + fp + fn),
            "n_acc": _ratio(tn, tn + fp),
        }
        for name, v in values.items():
            out[f"{level}/{name}"] = v
            per_level[name].append(v)
    for name, series in per_level.items():
        stacked = np.stack(series)  # (levels, B)
        defined = ~np.isnan(stacked)
        out[name] = _ratio(np.where(defined, stacked, 0.0).sum(0), defined.sum(0).astype(float))
    n_pos = pos.sum(1)
    for name in NOISE:
        out[name] = _ratio((pos * getattr(s, name)).sum(1), n_pos)
    return out


def interval(values: NDArray[Any], point: float, level: float = 0.95) -> dict[str, float | None]:
    """``{"value": point, "low", "high"}``: the percentile interval of bootstrap ``values``.

    Replicates where the figure is undefined (nan) are left out; ``low`` / ``high`` are None when
    none is defined, ``value`` None when ``point`` is nan.
    """
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    alpha = (1.0 - level) / 2.0
    low, high = (float(np.quantile(v, alpha)), float(np.quantile(v, 1.0 - alpha))) if v.size else (None, None)
    return {"value": None if point is None or np.isnan(point) else float(point), "low": low, "high": high}
