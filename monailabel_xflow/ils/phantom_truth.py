"""Known truth for checking the pipeline on a phantom set (``xflow phantom``).

:func:`truth_inputs` makes the studies a perfect report structurer would give (one finding per
present finding, at the zones it occupies; definite or tentative as drawn), so the image side is
measured apart from report structuring; :func:`mask_iou_by_finding` scores generated masks
against the phantom's own lesion masks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from monailabel_xflow.data.export import GT_DIR, JSON_NAME, MASK_DIR, META_NAME
from monailabel_xflow.data.mimic_ils import ReportedFinding
from monailabel_xflow.data.readers import read_mask_png
from monailabel_xflow.ils.pipeline import StudyInput
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS


def _meta(root: Path) -> list[dict]:
    return json.loads((root / GT_DIR / META_NAME).read_text())


def _splits(root: Path) -> dict[str, str]:
    release = json.loads((root / GT_DIR / JSON_NAME).read_text())
    return {study: split for split, studies in release.items() for study in studies}


def truth_inputs(root: str | Path) -> list[StudyInput]:
    """One :class:`StudyInput` per phantom of the set at ``root``, findings from its ground truth.

    Each present finding is one :class:`ReportedFinding` (sentence = its rank among the study's
    findings) located at the zones its lesions occupy (the heart for cardiomegaly); tentative
    when its first lesion was drawn non-confident.
    """
    root = Path(root)
    splits = _splits(root)
    out = []
    for rec in _meta(root):
        findings = []
        for n, finding in enumerate(f for f in FINDINGS if f in rec["findings"]):
            lesions = [les for les in rec["lesions"] if les["finding"] == finding]
            zones = {z for les in lesions for z in les["zones"]}
            locations = ("heart",) if finding == "cardiomegaly" else tuple(z for z in ALL_ZONES if z in zones)
            findings.append(ReportedFinding(finding, n + 1, True, not lesions[0]["confident"], locations, finding))
        out.append(
            StudyInput(
                rec["study"],
                root / rec["image"],
                tuple(findings),
                splits.get(rec["study"], "train"),
                str(rec["study"]),
                "findings",
                "",
            )
        )
    return out


def truth_masks(root: str | Path, study: str) -> dict[str, np.ndarray]:
    """The phantom's lesion masks of ``study`` per finding (union over its lesions)."""
    root = Path(root)
    rec = next(r for r in _meta(root) if r["study"] == study)
    out: dict[str, np.ndarray] = {}
    for les in rec["lesions"]:
        m = read_mask_png(root / GT_DIR / MASK_DIR / les["mask"])
        out[les["finding"]] = out.get(les["finding"], np.zeros_like(m)) | m
    return out


def mask_iou_by_finding(
    phantom_root: str | Path, out: str | Path, records: Iterable[Mapping]
) -> dict[str, dict[str, float]]:
    """IoU of every generated lung-lesion mask with the phantom's mask of the same finding.

    Args:
        phantom_root: the phantom set.
        out: the pipeline's output folder for a run on that set.
        records: that run's study records (``work/studies/*.json``).

    Returns:
        ``{finding: {"n": masks, "mean_iou": m, "median_iou": md}}`` for findings with masks.
    """
    ious: dict[str, list[float]] = {}
    for rec in records:
        if rec.get("error") or rec.get("qc"):
            continue
        truth = truth_masks(phantom_root, rec["study"])
        pos = rec["entry"]["instruction_answer_pairs"]["positive_pairs"]
        seen = set()
        for pair in pos:
            rel = pair["seg_mask_path"]
            if pair["type"] != "basic" or rel in seen or pair["target"] == "cardiomegaly":
                continue
            seen.add(rel)
            finding = next(
                f["finding"] for f in rec["findings"] if rel.endswith(f"finding{f['index']}_{f['finding']}.png")
            )
            gen = read_mask_png(Path(out) / GT_DIR / MASK_DIR / rel)
            ious.setdefault(finding, []).append(mask_iou(gen, truth.get(finding, np.zeros_like(gen))))
    return {f: {"n": len(v), "mean_iou": float(np.mean(v)), "median_iou": float(np.median(v))} for f, v in ious.items()}


PAPER_TABLE8 = {
    "default": {"atelectasis": 13.4, "pneumonia": 28.5, "edema": 58.0, "mean": 28.3},
    "halved": {"atelectasis": 28.7, "edema": 82.1, "mean": 47.3},
}
"""The recall figures (%) of the paper's Table 8 quoted in its text; the others are
not in the summaries we have."""


SOURCES = {"reports": "structured reports", "truth": "truth findings"}
"""Where a run's findings come from: the set's ``reports.csv`` through the structurer (the whole
pipeline), or :func:`truth_inputs` (a perfect structurer: the image side alone)."""


def _pct(v) -> str:
    return "—" if v is None else f"{100 * v:.1f}"


def recall_report(
    phantom_root: str | Path,
    work: str | Path,
    sources: Mapping[str, Sequence[StudyInput]],
    workers: int = 1,
    progress=lambda it: it,
    structuring: Mapping | None = None,
    how: str = "",
) -> tuple[dict, str]:
    """Pipeline recall per finding (Table 8 layout, default and halved thresholds) and mask IoU
    against the phantom truth, for one or more sources of findings; optionally the report
    structuring scores per field.

    Args:
        phantom_root: the phantom set.
        work: folder for the pipeline runs (``<source>/default/``, ``<source>/halved/``; resumable).
        sources: ``{"reports": studies from the structured reports.csv, "truth": truth_inputs(...)}``
            (either or both; keys of :data:`SOURCES`).
        structuring: :func:`monailabel_xflow.ils.report_eval.evaluate_phantoms` of the same
            reports, shown first.
        how: the command that made the report, quoted in it.

    Returns:
        ``(figures, markdown)``; ``figures["runs"][source][thresholds]`` holds ``recall``
        (:func:`~monailabel_xflow.ils.pipeline.recall_by_finding`), ``mask_iou``
        (:func:`mask_iou_by_finding`), pair counts and ``qc_dropped``.
    """
    from monailabel_xflow.ils import masks as alg
    from monailabel_xflow.ils.pairs import LUNG_FINDINGS
    from monailabel_xflow.ils.pipeline import WORK_DIR, PipelineConfig, run

    work = Path(work)
    n = max(len(v) for v in sources.values())
    figures: dict = {"phantom_set": str(phantom_root), "studies": n, "runs": {}}
    made: dict[str, dict[str, dict]] = {}
    if structuring is not None:
        figures["structuring"] = {k: structuring[k] for k in ("scores", "studies", "section_correct")}
    for src, inputs in sources.items():
        for name, thr in (("default", alg.DEFAULT_THRESHOLDS), ("halved", alg.HIGH_RECALL_THRESHOLDS)):
            out = work / src / name
            summary = run(
                inputs,
                PipelineConfig(out.resolve(), None, Path(phantom_root).resolve(), thr),
                workers=workers,
                progress=progress,
            )
            records = [json.loads(p.read_text()) for p in sorted((out / WORK_DIR).glob("*.json"))]
            made.setdefault(src, {})[name] = {
                (r["study"], f["finding"]): f["generated"]
                for r in records
                if not r.get("error")
                for f in r["findings"]
                if f["present"]
            }
            figures["runs"].setdefault(src, {})[name] = {
                "studies": summary["studies"],
                "recall": summary["recall"],
                "mask_iou": mask_iou_by_finding(phantom_root, out, records),
                "positive_pairs": summary["positive_pairs"],
                "negative_pairs": summary["negative_pairs"],
                "qc_dropped": summary["qc_dropped"],
            }
    runs = figures["runs"]
    cols = list(LUNG_FINDINGS) + ["mean"]
    lines = [
        "# MIMIC-ILS pipeline on phantoms: report structuring, recall and mask IoU",
        "",
        f"{n} phantom studies (`xflow phantom`, set `{Path(phantom_root).name}`), phantom stand-in stages "
        "(anatomy, lesion-free rendering, noisy boxes: `monailabel_xflow/ils/stages.py`). Findings come from "
        + " and from ".join(
            f"**{SOURCES[s]}**"
            + (
                " (the set's `reports.csv` through the report structurer: the whole pipeline)"
                if s == "reports"
                else " (what a perfect structurer would give: the image side alone)"
            )
            for s in runs
        )
        + ".",
        "",
    ]
    if how:
        lines += ["```bash", how, "```", ""]
    if structuring is not None:
        lines += [
            "## Report structuring: precision and recall per field",
            "",
            f"Section chosen as written: {structuring['section_correct']}/{structuring['studies']}. Facts as "
            "defined in `monailabel_xflow/ils/report_eval.py` (micro average over studies).",
            "",
            "| field | precision | recall | F1 | facts predicted | facts true |",
            "|---|---|---|---|---|---|",
        ]
        for field, sc in structuring["scores"].items():
            lines.append(
                f"| {field} | {sc['precision']:.3f} | {sc['recall']:.3f} | {sc['f1']:.3f} | "
                f"{sc['predicted']} | {sc['true']} |"
            )
        lines.append("")
    lines += [
        "## Pipeline recall (%), the layout of the paper's Table 8",
        "",
        "Recall = reported present lung findings that got a mask / reported present lung findings.",
        "",
        "| thresholds | findings from | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 2) + "|",
    ]
    for name in ("default", "halved"):
        for src in runs:
            rec = runs[src][name]["recall"]
            lines.append(f"| {name} | {SOURCES[src]} | " + " | ".join(_pct(rec[c]["recall"]) for c in cols) + " |")
        lines.append(
            f"| {name} | paper (MIMIC-CXR) | "
            + " | ".join(f"{PAPER_TABLE8[name][c]:.1f}" if c in PAPER_TABLE8[name] else "" for c in cols)
            + " |"
        )
    for src in runs:
        d, h = runs[src]["default"]["recall"], runs[src]["halved"]["recall"]
        lines += [
            "",
            f"Reported present findings ({SOURCES[src]}), masks made default / halved: "
            + ", ".join(f"{c} {d[c]['reported']} ({d[c]['generated']} / {h[c]['generated']})" for c in LUNG_FINDINGS)
            + ".",
        ]
    if {"reports", "truth"} <= set(made):
        lines += [""]
        for name in ("default", "halved"):
            a, b = made["truth"][name], made["reports"][name]
            only_truth = sorted({k[1] for k in a if a[k] and not b.get(k)})
            n_truth = sum(1 for k in a if a[k] and not b.get(k))
            n_rep = sum(1 for k in b if b[k] and not a.get(k))
            figures["runs"]["reports"][name]["differs_from_truth"] = {"truth_only": n_truth, "reports_only": n_rep}
            lines.append(
                f"{name.capitalize()} thresholds: {n_truth} finding(s) got a mask from the truth findings but "
                f"not from the structured reports ({', '.join(only_truth) or 'none'}), {n_rep} the other way."
            )
        exact = structuring is not None and all(
            v["precision"] == v["recall"] == 1.0 for v in structuring["scores"].values()
        )
        lines += [
            (
                "Structuring is exact here, so these differ by location alone"
                if exact
                else "Beside structuring errors (above), these differ by location"
            )
            + ": a report names a coarser region "
            'than the zones the lesion occupies ("bilateral pleural effusions" -> both whole lungs, '
            '"pulmonary edema" -> no location, so both lungs), and condition c1 compares each box with the reported '
            "region (Algorithm 1), so a small box in a large region fails it. Real reports are coarse in "
            "the same way."
        ]
    lines += [
        "",
        "The paper's rows are its MIMIC-CXR figures (with real models and real reports) for scale, not a "
        "like-for-like comparison: here the healthy counterfactual is the exact lesion-free rendering and the "
        "boxes are the true lesions' boxes, jittered, some missed, with random confidences and false boxes "
        "(`PhantomDetector`), so these figures measure Algorithm 1 and the location rules, not the models.",
    ]
    lines += [
        "",
        "## Mask IoU of generated masks against the phantom's lesion masks",
        "",
        "| thresholds | findings from | " + " | ".join(LUNG_FINDINGS) + " |",
        "|---" * (len(LUNG_FINDINGS) + 2) + "|",
    ]
    for name in ("default", "halved"):
        for src in runs:
            iou = runs[src][name]["mask_iou"]
            lines.append(
                f"| {name} | {SOURCES[src]} | "
                + " | ".join(f"{iou[c]['mean_iou']:.2f} (n={iou[c]['n']})" if c in iou else "—" for c in LUNG_FINDINGS)
                + " |"
            )
    lines += [
        "",
        "Mean IoU per generated basic-instruction mask; the phantom mask is the union of that finding's lesions.",
        "",
    ]
    return figures, "\n".join(lines)
