"""Running an evaluation set, resumably, and writing the reports (paper §5, §6.1, Tables 1 and 3).

:func:`evaluate` calls a predictor on every :class:`~monailabel_xflow.data.readers.EvalCase`, reduces
each (prediction, GT) pair to :class:`~monailabel_xflow.metrics.SampleStats` and appends one JSON
line per case to ``out_dir/results.jsonl`` as soon as it is done. A second call with the same
``out_dir`` reads that file and only predicts the cases not finished yet (a case whose stored
instruction or connectivity differs from the current one, or that ended in an error, is
redone), so an interrupted run continues where it stopped. Records also carry the identity of
what produced them (``predictor_id``, e.g. :func:`files_fingerprint` of a model's config and
weights): records of another model or of other predictions are redone, never silently reused.
:func:`write_reports` then writes:

- ``report.json``: every figure (per level, per finding, per level × finding, the equal-weight
  level average, mask noise, errors and dataset problems); undefined ratios are ``null``;
- ``report.md``: a table laid out like the paper's Table 1 (levels and their equal-weight
  average), per-finding tables, and the mask-noise table laid out like Table 3;
- ``levels.png``, ``findings.png``, ``fragmentation.png`` (matplotlib, Agg backend).

Geometry: metrics are computed at the GT mask's resolution. A prediction of another size is
resized to it with nearest-neighbour sampling (MIMIC-ILS masks are 512 × 512 while the images are
not), and the record notes ``resized``. A negative case has no GT mask, so its prediction is
scored at its own size; ``None`` is an empty prediction.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.data.readers import EvalCase, read_mask_png
from monailabel_xflow.errors import XFlowError
from monailabel_xflow.geometry import resize_mask
from monailabel_xflow.metrics import (
    CONNECTIVITY,
    SampleStats,
    level_average,
    sample_stats,
    summarize,
    summarize_groups,
)
from monailabel_xflow.vocabulary import FINDINGS, LEVELS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "EvaluationError",
    "RESULTS_NAME",
    "evaluate",
    "load_results",
    "build_report",
    "write_reports",
    "predictions_from_dir",
    "files_fingerprint",
    "model_identity",
    "grouped_bars",
    "Predictor",
]

log = logging.getLogger(__name__)

RESULTS_NAME = "results.jsonl"
REPORT_JSON = "report.json"
REPORT_MD = "report.md"

Predictor = Callable[[EvalCase], "NDArray[Any] | None"]


class EvaluationError(XFlowError, RuntimeError):
    """A prediction that cannot be scored (missing file, wrong dimensionality)."""


# --- predictions -------------------------------------------------------------------------------


def predictions_from_dir(folder: str | Path) -> Predictor:
    """Predictor reading saved masks ``folder/<case_id>.png`` (non-zero = lesion).

    The returned callable raises :class:`EvaluationError` for a missing file, which
    :func:`evaluate` records as that case's error.
    """
    folder = Path(folder)

    def predict(case: EvalCase) -> NDArray[Any]:
        path = folder / f"{case.case_id}.png"
        if not path.is_file():
            raise EvaluationError(f"missing prediction {path}")
        return read_mask_png(path)

    return predict


def _as_prediction(pred: Any) -> NDArray[Any] | None:
    if pred is None:
        return None
    if hasattr(pred, "detach"):  # a torch tensor
        pred = pred.detach().cpu().numpy()
    array: NDArray[Any] = np.asarray(pred)
    if array.ndim == 3 and 1 in (array.shape[0], array.shape[-1]):
        array = array.reshape(array.shape[1:] if array.shape[0] == 1 else array.shape[:-1])
    if array.ndim != 2:
        raise EvaluationError(f"prediction must be a 2-D (H, W) mask, got shape {array.shape}")
    mask: NDArray[np.bool_] = np.not_equal(array, 0)
    return mask


# --- running -----------------------------------------------------------------------------------


def load_results(out_dir: str | Path) -> dict[str, dict[str, Any]]:
    """The last stored record of every case in ``out_dir/results.jsonl`` ({} if none).

    A truncated last line (a run killed mid-write) is ignored.
    """
    path = Path(out_dir) / RESULTS_NAME
    records: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return records
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            line = line.strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and "case_id" in record:
                records[record["case_id"]] = record
    return records


def files_fingerprint(*paths: str | os.PathLike[str]) -> str:
    """A short hash of the names, sizes and modification times of the files at ``paths``.

    Folders are walked. It changes whenever one of those files is added, removed or rewritten
    (a retrained model, a new prediction), without reading gigabytes of weights. Paths that do
    not exist (a hub id, say) enter as their text.
    """
    digest = hashlib.sha256()
    for root in paths:
        root = Path(root)
        files = sorted(f for f in root.rglob("*") if f.is_file()) if root.is_dir() else [root]
        for f in files:
            if f.is_file():
                stat = f.stat()
                digest.update(f"{f}:{stat.st_size}:{stat.st_mtime_ns}".encode())
            else:
                digest.update(f"{f}:absent".encode())
    return digest.hexdigest()[:16]


def truth_key(case: EvalCase) -> str:
    """What a case is scored against: its image and ground-truth files (name, size, modification
    time: a moved or copied folder keeps its results), its RLE (``truth_id``) and whether it is a
    positive; a short hash."""
    import hashlib

    def stat(path: Path | None) -> list[Any]:
        if path is None:
            return []
        try:
            st = Path(path).stat()
            return [Path(path).name, st.st_size, st.st_mtime_ns]
        except OSError:
            return [Path(path).name]

    parts = [case.positive, stat(case.image_path), stat(case.mask_path), case.truth_id]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _is_done(record: Mapping[str, Any] | None, case: EvalCase, connectivity: int, predictor_id: str | None) -> bool:
    """A stored record is reused only if it was scored, for the same question against the same
    truth (:func:`truth_key`: a corrected mask is scored again), the same way, by the same
    predictor."""
    return (
        record is not None
        and "stats" in record
        and record.get("instruction") == case.instruction.text
        and record.get("truth") == truth_key(case)
        and record.get("connectivity", CONNECTIVITY) == connectivity
        and record.get("predictor") == predictor_id
    )


def _image_shape(case: EvalCase) -> tuple[int, int]:
    """(H, W) of the case's image from its header; (1, 1) when PIL cannot read it (e.g. DICOM)."""
    from PIL import Image

    try:
        with Image.open(case.image_path) as im:
            return im.height, im.width
    except (OSError, ValueError):
        return 1, 1


def _score(
    case: EvalCase, predict: Predictor, connectivity: int, save_dir: Path | None, predictor_id: str | None
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "case_id": case.case_id,
        "instruction": case.instruction.text,
        "level": case.level,
        "finding": case.finding,
        "positive": case.positive,
        "connectivity": connectivity,
        "truth": truth_key(case),
    }
    if predictor_id is not None:
        record["predictor"] = predictor_id
    notes = []
    gt = case.load_mask()
    pred = _as_prediction(predict(case))
    if save_dir is not None:
        from PIL import Image

        save_dir.mkdir(parents=True, exist_ok=True)
        shape = pred.shape if pred is not None else (gt.shape if gt is not None else _image_shape(case))
        out = pred if pred is not None else np.zeros(shape, bool)
        Image.fromarray(out.astype(np.uint8) * 255).save(save_dir / f"{case.case_id}.png")
    if gt is not None and pred is not None and pred.shape != gt.shape:
        notes.append(f"resized prediction {pred.shape[0]}x{pred.shape[1]} to GT {gt.shape[0]}x{gt.shape[1]}")
        if abs(pred.shape[0] * gt.shape[1] - gt.shape[0] * pred.shape[1]) > 0.02 * gt.shape[0] * pred.shape[1]:
            notes.append(  # a 512 x 512 MIMIC-ILS mask is resized by design; another shape is not
                f"the GT mask ({gt.shape[0]}x{gt.shape[1]}) has another aspect ratio than the prediction "
                f"({pred.shape[0]}x{pred.shape[1]}): transposed, or made for another image?"
            )
        record["resized"] = True
        pred = resize_mask(pred, gt.shape)
    if gt is None and pred is None:
        pred = np.zeros((1, 1), bool)  # empty on a negative: every count is 0 whatever the size
    stats = sample_stats(pred, gt, connectivity=connectivity)
    if case.positive and not stats.positive:
        notes.append("positive case with an empty GT mask: scored as a negative")
    record["stats"] = stats.to_dict()
    if notes:
        record["notes"] = notes
    return record


def evaluate(
    cases: Sequence[EvalCase],
    predict: Predictor,
    out_dir: str | Path,
    *,
    connectivity: int = CONNECTIVITY,
    resume: bool = True,
    predictor_id: str | None = None,
    progress: bool = True,
    save_predictions: bool = False,
    problems: Sequence[str] = (),
    title: str = "XFlow evaluation",
    plots: bool = True,
) -> dict[str, Any]:
    """Score ``predict`` on ``cases``, resumably, and write the reports into ``out_dir``.

    Args:
        cases: the evaluation set (unique ``case_id``).
        predict: ``predict(case) -> mask``: bool/0-1/0-255 array (H, W) (a leading or trailing
            singleton axis is squeezed), or ``None`` for "absent". Exceptions are recorded as the
            case's error and the run goes on.
        out_dir: folder for ``results.jsonl`` and the reports (created).
        connectivity: 8 or 4, for component counting.
        resume: reuse finished records in ``out_dir/results.jsonl``; False starts afresh.
        predictor_id: identity of ``predict`` (model weights, predictions folder), stored in
            every record; records with another identity are redone.
        progress: show a tqdm bar.
        save_predictions: also write every prediction as ``out_dir/predictions/<case_id>.png``.
        problems: dataset problems to carry into the report.
        title: heading of the Markdown report.
        plots: write the PNG plots.

    Returns:
        The report dict (also written to ``report.json``).

    Raises:
        EvaluationError: repeated case ids (results are keyed by them).
    """
    seen: set[str] = set()
    duplicates: set[str] = set()
    for c in cases:
        if c.case_id in seen:
            duplicates.add(c.case_id)
        seen.add(c.case_id)
    if duplicates:
        raise EvaluationError(f"case ids must be unique; repeated: {sorted(duplicates)[:10]}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    results_path = out_dir / RESULTS_NAME
    if not resume and results_path.exists():
        results_path.unlink()
    stored = load_results(out_dir) if resume else {}
    pending = [c for c in cases if not _is_done(stored.get(c.case_id), c, connectivity, predictor_id)]
    other = sum(
        1
        for c in pending
        if "stats" in stored.get(c.case_id, {}) and stored[c.case_id].get("predictor") != predictor_id
    )
    if other:
        log.warning(
            "%d stored result(s) in %s came from another model or predictions; redoing them", other, results_path
        )
    save_dir = out_dir / "predictions" if save_predictions else None

    iterator: Iterable[EvalCase] = pending
    if progress:
        from tqdm import tqdm

        iterator = tqdm(pending, desc="evaluating", unit="case", initial=len(cases) - len(pending), total=len(cases))
    with results_path.open("a", encoding="utf-8") as handle:
        for case in iterator:
            try:
                record = _score(case, predict, connectivity, save_dir, predictor_id)
            except KeyboardInterrupt:
                raise
            except Exception as err:  # one bad case must not end a long run; it is listed instead
                record = {
                    "case_id": case.case_id,
                    "instruction": case.instruction.text,
                    "error": f"{type(err).__name__}: {err}",
                }
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            stored[case.case_id] = record
    records = [stored[c.case_id] for c in cases if c.case_id in stored]
    report = build_report(records, problems=problems, connectivity=connectivity)
    write_reports(report, records, out_dir, title=title, plots=plots)
    return report


# --- reports -----------------------------------------------------------------------------------


def build_report(
    records: Sequence[Mapping[str, Any]], *, problems: Sequence[str] = (), connectivity: int = CONNECTIVITY
) -> dict[str, Any]:
    """Aggregate per-case records (as stored in ``results.jsonl``) into the report dict."""
    scored = [(r, SampleStats.from_dict(r["stats"])) for r in records if "stats" in r]
    per_level = summarize_groups((r["level"], s) for r, s in scored)
    per_finding_level = summarize_groups(((r["finding"], r["level"]), s) for r, s in scored)
    per_finding = {}
    for finding in [f for f in FINDINGS if any(r["finding"] == f for r, _ in scored)]:
        levels = {lv: per_finding_level[(finding, lv)] for lv in LEVELS if (finding, lv) in per_finding_level}
        per_finding[finding] = {
            "levels": levels,
            "average": level_average(levels),
            "all_levels": summarize(s for r, s in scored if r["finding"] == finding),
        }
    all_positive = summarize(s for _, s in scored)
    return {
        "n_cases": len(records),
        "n_scored": len(scored),
        "connectivity": connectivity,
        "levels": {lv: per_level[lv] for lv in LEVELS if lv in per_level},
        "average": level_average(per_level),
        "findings": per_finding,
        "noise": all_positive["noise"],
        "pooled_counts": {k: all_positive[k] for k in ("n", "n_positive", "n_negative", "tp", "fp", "fn", "tn")},
        "resized": sum(bool(r.get("resized")) for r in records),
        "notes": [f"{r['case_id']}: {n}" for r in records for n in r.get("notes", []) if "resized" not in n],
        "errors": {r["case_id"]: r["error"] for r in records if "error" in r},
        "dataset_problems": list(problems),
    }


def _clean(value: Any) -> Any:
    """JSON-safe copy: nan -> None, tuple keys -> 'a/b'."""
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, Mapping):
        return {("/".join(k) if isinstance(k, tuple) else k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _f(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:.{digits}f}"


def format_markdown(report: Mapping[str, Any], title: str = "XFlow evaluation") -> str:
    """The Markdown report (Table 1 / Table 3 layouts)."""
    lines = [f"# {title}", ""]
    lines += [
        "## Segmentation and presence (Table 1 layout)",
        "",
        "Levels are averaged with equal weight, never pooled. gIoU (all) is ROSALIA's all-samples "
        "gIoU (an empty prediction on an empty target scores 1); it is not the paper's gIoU.",
        "",
        "| Level | Positives | Negatives | gIoU | cIoU | F1 | Precision | Recall | N-Acc | gIoU (all) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for lv, s in report["levels"].items():
        lines.append(
            f"| {lv} | {s['n_positive']} | {s['n_negative']} | {_f(s['giou'])} | {_f(s['ciou'])} | {_f(s['f1'])} | "
            f"{_f(s['precision'])} | {_f(s['recall'])} | {_f(s['n_acc'])} | {_f(s['giou_all'])} |"
        )
    a = report["average"]
    lines.append(
        f"| **average** | | | **{_f(a['giou'])}** | **{_f(a['ciou'])}** | **{_f(a['f1'])}** | {_f(a['precision'])} | "
        f"{_f(a['recall'])} | {_f(a['n_acc'])} | {_f(a['giou_all'])} |"
    )
    lines += [
        "",
        "## Per finding (equal-weight average over the levels the finding is asked at)",
        "",
        "| Finding | Positives | Negatives | gIoU | cIoU | F1 | N-Acc |",
        "|---|---|---|---|---|---|---|",
    ]
    for finding, entry in report["findings"].items():
        allv, avg = entry["all_levels"], entry["average"]
        lines.append(
            f"| {finding} | {allv['n_positive']} | {allv['n_negative']} | {_f(avg['giou'])} | {_f(avg['ciou'])} | "
            f"{_f(avg['f1'])} | {_f(avg['n_acc'])} |"
        )
    lines += [
        "",
        "## gIoU per finding and level",
        "",
        "| Finding | " + " | ".join(LEVELS) + " |",
        "|---|" + "---|" * len(LEVELS),
    ]
    for finding, entry in report["findings"].items():
        cells = [_f(entry["levels"][lv]["giou"]) if lv in entry["levels"] else "—" for lv in LEVELS]
        lines.append(f"| {finding} | " + " | ".join(cells) + " |")
    n = report["noise"]
    lines += [
        "",
        f"## Mask noise over {n['n']} positive cases (Table 3 layout; {report['connectivity']}-connectivity, "
        "specks < 0.1 % of the image)",
        "",
        "| Masks | ΔC | Specks | Specks outside GT | Speck area % of mask |",
        "|---|---|---|---|---|",
        f"| GT | — | {_f(n['gt_specks'], 2)} | — | {_f(n['gt_speck_area_pct'], 2)} |",
        f"| Prediction | {_f(n['delta_c'], 2)} | {_f(n['specks'], 2)} | {_f(n['specks_outside_gt'], 2)} | "
        f"{_f(n['speck_area_pct'], 2)} (pooled {_f(n['speck_area_pct_pooled'], 2)}) |",
        "",
        f"Cases: {report['n_cases']}, scored {report['n_scored']}, predictions resized to the GT: {report['resized']}.",
    ]
    if report["errors"]:
        lines += ["", f"## Errors ({len(report['errors'])} cases, not scored)", ""]
        lines += [f"- `{cid}`: {msg}" for cid, msg in list(report["errors"].items())[:50]]
    if report["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"][:50]]
    if report["dataset_problems"]:
        lines += ["", f"## Dataset problems ({len(report['dataset_problems'])} entries left out)", ""]
        lines += [f"- {p}" for p in report["dataset_problems"][:50]]
    return "\n".join(lines) + "\n"


def grouped_bars(
    ax: Axes,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    rotation: float = 0,
    intervals: Mapping[str, Sequence[tuple[float, float] | None]] | None = None,
) -> None:
    """Draw one cluster of bars per group, one bar per series (None drawn as a gap), on ``ax``.

    The bar charts of the evaluation report and of the phantom benchmark
    (:mod:`~monailabel_xflow.eval.phantom_plots`) are drawn with it.

    Args:
        ax: the matplotlib axes drawn on (x ticks set to ``groups``).
        groups: the clusters, left to right.
        series: ``{legend label: one height per group (None: no bar)}``.
        rotation: of the group labels, in degrees.
        intervals: per series, ``(low, high)`` per group or None, drawn as error bars.
    """
    width = 0.8 / len(series)
    for k, (label, ys) in enumerate(series.items()):
        offset = (k - (len(series) - 1) / 2) * width
        heights = np.asarray([np.nan if y is None else y for y in ys], float)
        yerr = None
        if intervals and label in intervals:
            bounds = [
                b if b is not None and not np.isnan(h) else (h, h)
                for b, h in zip(intervals[label], heights, strict=False)
            ]
            yerr = np.abs(
                np.asarray(
                    [
                        [h - lo for (lo, _), h in zip(bounds, heights, strict=False)],
                        [hi - h for (_, hi), h in zip(bounds, heights, strict=False)],
                    ],
                    float,
                )
            )
        ax.bar(
            np.arange(len(groups)) + offset,
            heights,
            width,
            label=label,
            yerr=yerr,
            error_kw={"elinewidth": 0.8, "capsize": 1.5},
        )
    ax.set_xticks(np.arange(len(groups)), groups, rotation=rotation)


def write_plots(report: Mapping[str, Any], records: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """Per-level bars, per-finding bars and the fragmentation histogram, as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    metrics = [("giou", "gIoU"), ("ciou", "cIoU"), ("f1", "F1"), ("n_acc", "N-Acc")]
    groups = list(report["levels"]) + ["average"]
    values = {**report["levels"], "average": report["average"]}
    fig, ax = plt.subplots(figsize=(7, 3.5))
    grouped_bars(ax, groups, {label: [values[g][key] for g in groups] for key, label in metrics})
    ax.set_ylim(0, 1)
    ax.set_ylabel("score")
    ax.set_title("Per question level (average = equal weight)")
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    written.append(out_dir / "levels.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    findings = list(report["findings"])
    fig, ax = plt.subplots(figsize=(8, 3.5))
    grouped_bars(
        ax,
        findings,
        {lv: [report["findings"][f]["levels"].get(lv, {}).get("giou") for f in findings] for lv in LEVELS},
        rotation=20,
    )
    ax.set_ylim(0, 1)
    ax.set_ylabel("gIoU")
    ax.set_title("gIoU per finding and level")
    ax.legend(ncol=3, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout()
    written.append(out_dir / "findings.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    stats = [SampleStats.from_dict(r["stats"]) for r in records if "stats" in r]
    pos = [s for s in stats if s.positive]
    fig, axes = plt.subplots(1, 2, figsize=(8, 3.2))
    dc = [s.delta_components for s in pos]
    if dc:
        lo, hi = min(dc), max(dc)
        axes[0].hist(dc, bins=np.arange(lo - 0.5, hi + 1.5), color="tab:blue")
    axes[0].set_xlabel("ΔC = components(pred) − components(GT)")
    axes[0].set_ylabel("positive cases")
    sp = [s.pred_specks for s in pos]
    if sp:
        axes[1].hist(sp, bins=np.arange(-0.5, max(sp) + 1.5), color="tab:orange")
    axes[1].set_xlabel("specks per predicted mask")
    fig.suptitle(f"Mask fragmentation over {len(pos)} positive cases")
    fig.tight_layout()
    written.append(out_dir / "fragmentation.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)
    return written


def write_reports(
    report: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    title: str = "XFlow evaluation",
    plots: bool = True,
) -> None:
    """Write ``report.json``, ``report.md`` and (``plots``) the PNG plots into ``out_dir``."""
    out_dir = Path(out_dir)
    clean = _clean(report)
    (out_dir / REPORT_JSON).write_text(json.dumps(clean, indent=2))
    (out_dir / REPORT_MD).write_text(format_markdown(clean, title))
    if plots:
        write_plots(clean, records, out_dir)


def model_identity(config: str) -> str:
    """Fingerprint of a model config file and the local weights it names (hub ids as text)."""
    from monailabel_xflow.eval.evaluate import files_fingerprint
    from monailabel_xflow.workflow.model_config import ModelConfig

    paths: list[str | Path] = [config]
    try:
        cfg = ModelConfig.load(config)
        for value in cfg.weights().values():
            _, path = cfg.locate(value)
            paths.append(path if path is not None else value)  # a hub id enters as its text
    except (ValueError, OSError):
        return files_fingerprint(config)
    return files_fingerprint(*paths)
