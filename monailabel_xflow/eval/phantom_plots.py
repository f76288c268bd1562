"""The phantom benchmark's figures: ``OUT/levels.png`` and ``OUT/findings.png`` (bars with bootstrap
95 % intervals) and ``OUT/contact-sheet.png`` (the same questions, every method side by side).

A prediction file the contact sheet needs and cannot find is an error, never drawn as empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.eval.phantom_protocol import METHOD_TITLES, case_gt, record_iou
from monailabel_xflow.geometry import resize_mask
from monailabel_xflow.vocabulary import FINDINGS, LEVELS

__all__ = ["GT_COLOUR", "PRED_COLOUR", "write_plots", "contact_cases", "write_contact_sheet"]

GT_COLOUR = (40, 220, 40)
PRED_COLOUR = (240, 60, 60)


def _bounds(ci: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """``(low, high)`` of an interval, or None."""
    return None if not ci or ci.get("low") is None else (ci["low"], ci["high"])


def write_plots(out: Path, summary: Mapping[str, Any], methods: Sequence[str]) -> list[Path]:
    """``levels.png`` (gIoU, F1, N-Acc per level) and ``findings.png`` (gIoU and F1 per finding),
    with the bootstrap 95 % intervals as error bars (gIoU only per finding).

    Args:
        out: the benchmark folder the PNGs are written to.
        summary: the summary of :func:`~monailabel_xflow.eval.phantom_report.write_summary`
            (``methods`` figures and ``bootstrap`` intervals).
        methods: the methods drawn, in legend order.

    Returns:
        The two PNG paths.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from monailabel_xflow.eval.evaluate import grouped_bars

    titles = [METHOD_TITLES[m] for m in methods]
    written = []
    groups = list(LEVELS) + ["average"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for ax, (key, label) in zip(axes, (("giou", "gIoU"), ("f1", "presence F1"), ("n_acc", "N-Acc")), strict=True):
        series, intervals = {}, {}
        for m, t in zip(methods, titles, strict=True):
            s = summary["methods"][m]
            series[t] = [(s["average"] if g == "average" else s["levels"].get(g, {})).get(key) for g in groups]
            intervals[t] = [_bounds(s.get("ci", {}).get(key if g == "average" else f"{g}/{key}")) for g in groups]
        grouped_bars(ax, groups, series, intervals=intervals)
        ax.set_title(label)
        ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    written.append(out / "levels.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    boot_findings = summary.get("bootstrap", {}).get("findings", {})
    for ax, (key, label) in zip(axes, (("giou", "gIoU"), ("f1", "presence F1")), strict=True):
        finding_intervals = (
            {
                t: [_bounds(boot_findings.get(m, {}).get(f)) for f in FINDINGS]
                for m, t in zip(methods, titles, strict=True)
            }
            if key == "giou"
            else None
        )
        grouped_bars(
            ax,
            list(FINDINGS),
            {
                t: [summary["methods"][m]["findings"].get(f, {}).get(key) for f in FINDINGS]
                for m, t in zip(methods, titles, strict=True)
            },
            rotation=20,
            intervals=finding_intervals,
        )
        ax.set_ylabel(label)
        ax.set_ylim(0, 1)
    axes[0].set_title("Per finding (equal-weight average over levels)")
    axes[0].legend(fontsize=7, ncol=len(methods), loc="upper center")
    fig.tight_layout()
    written.append(out / "findings.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


def contact_cases(cases: Sequence[EvalCase], per_level: int = 3) -> list[EvalCase]:
    """The questions of the contact sheet: per level, positives of different findings, then one
    negative; deterministic (the first eligible in case order)."""
    chosen: list[EvalCase] = []
    for level in LEVELS:
        seen: set[str] = set()
        for c in cases:
            if c.level == level and c.positive and c.finding not in seen and len(seen) < per_level - 1:
                seen.add(c.finding)
                chosen.append(c)
        neg = next((c for c in cases if c.level == level and not c.positive), None)
        if neg is not None:
            chosen.append(neg)
    return chosen


def write_contact_sheet(
    out: Path, methods: Sequence[str], cases: Sequence[EvalCase], records: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> Path:
    """``OUT/contact-sheet.png``. Rows: the questions of :func:`contact_cases`; columns: the GT,
    then each method's mask (red) over the GT outline (green).

    Args:
        out: the benchmark folder (predictions are read from ``out/<method>/predictions/``).
        methods: the model methods drawn (baselines draw nothing worth seeing).
        cases: every question of the run.
        records: ``{method: {case_id: scored record}}``.

    Raises:
        EvaluationError: a method has no record or no prediction file for a drawn question.
    """
    from PIL import Image

    from monailabel_xflow.eval.evaluate import EvaluationError
    from monailabel_xflow.rendering import contact_sheet, overlay
    from monailabel_xflow.transforms.loading import load_cxr

    tiles, titles = [], []
    for case in contact_cases(cases):
        image, _ = load_cxr(case.image_path)
        gt = case_gt(case, image.shape)
        tiles.append(overlay(image, [gt], colors=[GT_COLOUR]))
        titles.append(f"{case.level}: {case.finding}" + ("" if case.positive else " (absent)"))
        for m in methods:
            png = out / m / "predictions" / f"{case.case_id}.png"
            record = records[m].get(case.case_id)
            if record is None or not png.is_file():
                raise EvaluationError(
                    f"{METHOD_TITLES[m]} has no {'prediction file ' + str(png) if record else 'scored record'} "
                    f"for {case.case_id}: rerun the benchmark (it predicts what is missing); "
                    "a missing prediction is never drawn as empty"
                )
            pred = np.asarray(Image.open(png)) > 0
            pred = pred if pred.shape == image.shape else resize_mask(pred, image.shape)
            tiles.append(overlay(overlay(image, [gt], colors=[GT_COLOUR], alpha=0.0), [pred], colors=[PRED_COLOUR]))
            score = f"IoU {record_iou(record):.2f}" if case.positive else ("empty" if not pred.any() else "drawn")
            titles.append(f"{METHOD_TITLES[m]} {score}")
    sheet = contact_sheet(
        tiles,
        titles,
        ncols=1 + len(methods),
        tile_size=200,
        legend=[("ground truth", GT_COLOUR), ("prediction", PRED_COLOUR)],
    )
    path = out / "contact-sheet.png"
    Image.fromarray(sheet).save(path, optimize=True)
    return path
