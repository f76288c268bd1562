"""Known truth for checking the pipeline on a phantom set (``xflow phantom``).

:func:`truth_inputs` makes the studies a perfect report structurer would give (one finding per
present finding, at the zones it occupies; definite or tentative as drawn), so the image side is
measured apart from report structuring; :func:`mask_iou_by_finding` scores generated masks
against the phantom's own lesion masks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from monailabel_xflow.datasets import read_mask_png
from monailabel_xflow.ils.pipeline import StudyInput
from monailabel_xflow.ils.records import ReportedFinding
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.phantom_export import GT_DIR, JSON_NAME, MASK_DIR, META_NAME
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
        out.append(StudyInput(rec["study"], root / rec["image"], tuple(findings), splits.get(rec["study"], "train"),
                              str(rec["study"]), "findings", ""))
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


def mask_iou_by_finding(phantom_root: str | Path, out: str | Path, records: Iterable[Mapping]) -> dict[str, dict[str, float]]:
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
            finding = next(f["finding"] for f in rec["findings"] if rel.endswith(f"finding{f['index']}_{f['finding']}.png"))
            gen = read_mask_png(Path(out) / GT_DIR / MASK_DIR / rel)
            ious.setdefault(finding, []).append(mask_iou(gen, truth.get(finding, np.zeros_like(gen))))
    return {f: {"n": len(v), "mean_iou": float(np.mean(v)), "median_iou": float(np.median(v))}
            for f, v in ious.items()}


PAPER_TABLE8 = {
    "default": {"atelectasis": 13.4, "pneumonia": 28.5, "edema": 58.0, "mean": 28.3},
    "halved": {"atelectasis": 28.7, "edema": 82.1, "mean": 47.3},
}
"""The recall figures (%) of the paper's Table 8 quoted in its text (DESIGN §14); the others are
not in the summaries we have."""


def recall_report(phantom_root: str | Path, work: str | Path, inputs, source: str, workers: int = 1,
                  progress=lambda it: it) -> tuple[dict, str]:
    """Pipeline recall per finding (Table 8 layout, default and halved thresholds) and mask IoU
    against the phantom truth.

    Args:
        phantom_root: the phantom set.
        work: folder for the two pipeline runs (``default/``, ``halved/``; resumable).
        inputs: the studies (:func:`truth_inputs`, or a structurer's output on the set's reports).
        source: what ``inputs`` are, for the report's heading.

    Returns:
        ``(figures, markdown)``.
    """
    from monailabel_xflow.ils import masks as alg
    from monailabel_xflow.ils.pairs import LUNG_FINDINGS
    from monailabel_xflow.ils.pipeline import WORK_DIR, PipelineConfig, run

    work = Path(work)
    figures: dict = {"phantom_set": str(phantom_root), "findings_from": source, "studies": len(inputs)}
    for name, thr in (("default", alg.DEFAULT_THRESHOLDS), ("halved", alg.HIGH_RECALL_THRESHOLDS)):
        out = work / name
        summary = run(inputs, PipelineConfig(out.resolve(), None, Path(phantom_root).resolve(), thr),
                      workers=workers, progress=progress)
        records = [json.loads(p.read_text()) for p in sorted((out / WORK_DIR).glob("*.json"))]
        figures[name] = {"recall": summary["recall"], "mask_iou": mask_iou_by_finding(phantom_root, out, records),
                         "positive_pairs": summary["positive_pairs"], "negative_pairs": summary["negative_pairs"],
                         "qc_dropped": summary["qc_dropped"]}
    cols = list(LUNG_FINDINGS) + ["mean"]

    def pct(v):
        return "—" if v is None else f"{100 * v:.1f}"

    lines = [f"# MIMIC-ILS pipeline on phantoms: recall and mask IoU", "",
             f"{len(inputs)} phantom studies (`{phantom_root}`), findings from {source}; phantom stand-in stages "
             "(anatomy, lesion-free rendering, noisy boxes: `monailabel_xflow/ils/stages.py`).", "",
             "## Pipeline recall (%), the layout of the paper's Table 8", "",
             "| thresholds | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name in ("default", "halved"):
        rec = figures[name]["recall"]
        lines.append(f"| {name} (ours) | " + " | ".join(pct(rec[c]["recall"]) for c in cols) + " |")
    for name in ("default", "halved"):
        lines.append(f"| {name} (paper) | " + " | ".join(
            f"{PAPER_TABLE8[name][c]:.1f}" if c in PAPER_TABLE8[name] else "" for c in cols) + " |")
    lines += ["", "Reported present findings per type (default / halved masks made): " + ", ".join(
        f"{c} {figures['default']['recall'][c]['reported']} ({figures['default']['recall'][c]['generated']} / "
        f"{figures['halved']['recall'][c]['generated']})" for c in LUNG_FINDINGS), "",
        "## Mask IoU of generated masks against the phantom's lesion masks", "",
        "| thresholds | " + " | ".join(LUNG_FINDINGS) + " |", "|---" * (len(LUNG_FINDINGS) + 1) + "|"]
    for name in ("default", "halved"):
        iou = figures[name]["mask_iou"]
        lines.append(f"| {name} | " + " | ".join(
            f"{iou[c]['mean_iou']:.2f} (n={iou[c]['n']})" if c in iou else "—" for c in LUNG_FINDINGS) + " |")
    lines += ["", "Mean IoU per generated basic-instruction mask; the phantom mask is the union of that "
              "finding's lesions.", ""]
    return figures, "\n".join(lines)
