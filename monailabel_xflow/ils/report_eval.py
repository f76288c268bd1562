"""Scoring report structuring against known tuples: precision and recall per field.

Fields (MIMIC-ILS 6-tuple), each scored as a set of facts per study, predicted vs truth:

* **entity**: ``(sentence, key)`` where ``key`` is the vocabulary finding (the predicted type
  when there is one) or, for findings outside the seven, the lower-cased entity text;
* **presence**: ``(sentence, key, present)``;
* **certainty**: ``(sentence, key, tentative)``;
* **location**: ``(sentence, key, label)`` for every location label.

Precision = shared facts / predicted facts, recall = shared facts / true facts, summed over
studies (micro average). A wrong entity costs in every field; a right entity with a wrong
presence costs only in presence. Run as ``python -m monailabel_xflow.ils.report_eval
--phantoms DIR --out reports/ils/structuring.md`` on a folder ``xflow phantom`` wrote.

Against report-level labels written by others (``--cmc2007 FILE``: the CMC 2007 challenge's
coded reports, :func:`read_cmc2007`, committed as ``tests/data/cmc2007/``; ``--openi CSV``: the
Indiana University / Open-i reports with their manual MeSH headings, :func:`read_openi_csv`, not
committed): tuples become report labels under a certainty mode (:func:`report_labels`: the
MIMIC-ILS §C.1 rule, any certainty, or per finding by hedge grade), scored per finding with bootstrap CIs
(:func:`score_labels`) on a dev and a held-out part fixed by a hash of the report id
(:func:`split_of`), for the rules, a keyword + NegEx baseline and the CheXpert labeler's phrases
(:class:`PhraseNegExStructurer`), and the LLM structurer when a model is given
(:func:`evaluate_external`; ``reports/ils/external.md``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.data.mimic_ils import TRUTH_NAME, ReportedFinding

FIELDS: tuple[str, ...] = ("entity", "presence", "certainty", "location")


def _key(t: ReportedFinding) -> str:
    return t.finding or " ".join(t.entity.lower().split())


def facts(tuples: Iterable[ReportedFinding], field: str) -> set[tuple[Any, ...]]:
    """The set of facts one field of ``tuples`` states (see the module docstring)."""
    out: set[tuple[Any, ...]] = set()
    for t in tuples:
        k = (t.sentence, _key(t))
        if field == "entity":
            out.add(k)
        elif field == "presence":
            out.add(k + (t.present,))
        elif field == "certainty":
            out.add(k + (t.tentative,))
        elif field == "location":
            out.update(k + (loc,) for loc in t.locations)
        else:
            raise ValueError(f"unknown field {field!r}; supported: {', '.join(FIELDS)}")
    return out


def score(pairs: Iterable[tuple[list[ReportedFinding], list[ReportedFinding]]]) -> dict[str, dict]:
    """Micro precision / recall / F1 per field over ``(predicted, truth)`` pairs of studies.

    Returns:
        ``{field: {"precision", "recall", "f1", "tp", "predicted", "true"}}``; a ratio with a
        zero denominator is 1.0 (nothing to find, nothing claimed).
    """
    pairs = list(pairs)
    out = {}
    for field in FIELDS:
        tp = npred = ntrue = 0
        for pred, truth in pairs:
            p, t = facts(pred, field), facts(truth, field)
            tp += len(p & t)
            npred += len(p)
            ntrue += len(t)
        prec = tp / npred if npred else 1.0
        rec = tp / ntrue if ntrue else 1.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        out[field] = {"precision": prec, "recall": rec, "f1": f1, "tp": tp, "predicted": npred, "true": ntrue}
    return out


def tuple_from_dict(d: dict) -> ReportedFinding:
    return ReportedFinding(
        d["entity"],
        int(d["sentence"]),
        bool(d["present"]),
        bool(d["tentative"]),
        tuple(d.get("locations") or ()),
        d.get("finding"),
        d.get("hedge"),
    )


def evaluate_phantoms(folder: Path, structurer=None) -> dict:
    """Structure every report of a phantom set and score it against its truth.

    Args:
        folder: what ``xflow phantom --out`` wrote (``reports.csv`` and
            ``ground-truth/report_findings.json``).
        structurer: default the rule-based one.

    Returns:
        ``{"scores": score(...), "studies": n, "section_correct": k, "errors": [...]}`` where
        ``errors`` lists per study the facts missed / extra (for reading, capped at 50).
    """
    from monailabel_xflow.data.mimic_ils import read_reports_csv
    from monailabel_xflow.ils.report import choose_section, structure_section

    folder = Path(folder)
    truth = json.loads((folder / "ground-truth" / TRUTH_NAME).read_text())
    rows = read_reports_csv(folder / "reports.csv")
    pairs, section_ok = [], 0
    errors: list[dict[str, Any]] = []
    for row in rows:
        want = truth[row["study_id"]]
        sec = choose_section(row["report"])
        section_ok += sec.name == want["section_name"] and sec.text == want["section_text"]
        pred = structure_section(sec.text, structurer)
        true = [tuple_from_dict(d) for d in want["findings"]]
        pairs.append((pred, true))
        for field in FIELDS:
            p, t = facts(pred, field), facts(true, field)
            if p != t and len(errors) < 50:
                errors.append(
                    {
                        "study": row["study_id"],
                        "field": field,
                        "missed": sorted(map(str, t - p)),
                        "extra": sorted(map(str, p - t)),
                        "section": sec.text,
                    }
                )
    return {"scores": score(pairs), "studies": len(rows), "section_correct": section_ok, "errors": errors}


def evaluate_handwritten(path: Path, structurer=None) -> dict:
    """Score hand-written reports: a JSON ``{"reports": [{"id", "text", "truth": [[entity,
    sentence, present, tentative, [locations], finding], ...]}]}`` (the whole report; the
    section is chosen as usual). Same result layout as :func:`evaluate_phantoms` (every
    section counts as correct: the file names none)."""
    from monailabel_xflow.ils.report import structure_report

    data = json.loads(Path(path).read_text())
    pairs, errors = [], []
    for rep in data["reports"]:
        pred = structure_report(rep["text"], structurer)
        true = [ReportedFinding(e, int(s), bool(p), bool(t), tuple(loc), f) for e, s, p, t, loc, f in rep["truth"]]
        pairs.append((pred, true))
        for field in FIELDS:
            p, t = facts(pred, field), facts(true, field)
            if p != t:
                errors.append(
                    {
                        "study": rep["id"],
                        "field": field,
                        "missed": sorted(map(str, t - p)),
                        "extra": sorted(map(str, p - t)),
                        "section": rep["text"],
                    }
                )
    n = len(data["reports"])
    return {"scores": score(pairs), "studies": n, "section_correct": n, "errors": errors}


# --- external evaluation: report-level labels written by others ------------------------------

EXTERNAL_FINDINGS: tuple[str, ...] = (
    "pneumonia",
    "atelectasis",
    "effusion",
    "edema",
    "cardiomegaly",
    "consolidation",
    "opacity",
)
"""Findings an external set may label; a set scores those it has positives for."""

CERTAINTY_MODES: tuple[str, ...] = ("definite", "any", "per-finding")
"""How tuples become report labels: ``"definite"`` (MIMIC-ILS §C.1: a tentative finding is an
opacity, not the finding it may be), ``"any"`` (a tentative finding counts as the finding) or
``"per-finding"`` (a tentative finding counts when its hedge grade is one its finding accepts,
:data:`~monailabel_xflow.ils.report_rules.TENTATIVE_COUNTS_AS`; else as under ``"definite"``)."""

MACRO_MIN_POSITIVES = 5
"""A finding enters the macro average only with at least this many reference positives."""


@dataclass(frozen=True)
class LabelledReport:
    """One external report with the findings its reference labels say are present.

    Attributes:
        id: the set's report id.
        text: the report as the structurer reads it (sections with their headers).
        labels: findings of :data:`EXTERNAL_FINDINGS` the reference marks present.
        split: ``"dev"`` (looked at while fixing rules) or ``"held-out"`` (only scored).
    """

    id: str
    text: str
    labels: frozenset
    split: str


def split_of(report_id: str, dev_fraction: float = 0.4) -> str:
    """``"dev"`` or ``"held-out"``, fixed by a hash of the id (no look at the text or labels)."""
    h = int(hashlib.sha256(report_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "dev" if h < dev_fraction else "held-out"


CMC_FINDING_CODES: dict[str, str] = {"486": "pneumonia", "518.0": "atelectasis", "511.9": "effusion"}
"""ICD-9-CM codes of the CMC 2007 set that name a chest radiograph finding."""

_CMC_URINARY = re.compile(r"^(59\d|753|788|791|741|V13\.0)")
_RENAL_WORDS = re.compile(
    r"\b(kidneys?|renal|bladder|reflux|hydronephrosis|ureter\w*|urethr\w*|vcug|"
    r"pelvicaliectasis|collecting systems?|voiding)\b",
    re.I,
)


def read_cmc2007(path: Path) -> list[LabelledReport]:
    """The chest radiograph reports of the CMC 2007 Medical NLP Challenge set with their labels.

    The set (Pestian et al., BioNLP 2007: pediatric radiology reports of Cincinnati Children's
    Hospital, each with a clinical history and an impression, ICD-9-CM codes by three coding
    companies and their majority) also holds renal / urinary studies; a report is kept as a chest
    report unless a majority code is urinary (590-599, 741, 753, 788, 791, V13.0x) or its
    impression names the urinary tract. Labels are the majority codes of
    :data:`CMC_FINDING_CODES` (no code: the finding is absent or not asserted). The text given
    to the structurer is ``"CLINICAL HISTORY: ...\n\nIMPRESSION: ..."``.

    Args:
        path: ``2007ChallengeTrainData.xml`` (or a file of the same layout).

    Raises:
        ValueError: the file is not XML of that layout.
    """
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as err:
        raise ValueError(f"cannot read the CMC 2007 set {path}: {err}") from err
    out = []
    for doc in root.iter("doc"):
        codes = [c.text.strip() for c in doc.iter("code") if c.get("origin") == "CMC_MAJORITY" and c.text]
        texts = {t.get("type"): (t.text or "").strip() for t in doc.iter("text")}
        doc_id = doc.get("id")
        if "IMPRESSION" not in texts or doc_id is None:
            raise ValueError(f"{path}: a <doc> without an id or an IMPRESSION text")
        if any(_CMC_URINARY.match(c) for c in codes) or _RENAL_WORDS.search(texts["IMPRESSION"]):
            continue
        text = f"CLINICAL HISTORY: {texts.get('CLINICAL_HISTORY', '')}\n\nIMPRESSION: {texts['IMPRESSION']}"
        labels = frozenset(CMC_FINDING_CODES[c] for c in codes if c in CMC_FINDING_CODES)
        out.append(LabelledReport(doc_id, text, labels, split_of(doc_id)))
    return out


OPENI_MESH: dict[str, tuple[str, ...]] = {
    "pneumonia": ("Pneumonia",),
    "atelectasis": ("Pulmonary Atelectasis",),
    "effusion": ("Pleural Effusion",),
    "edema": ("Pulmonary Edema",),
    "cardiomegaly": ("Cardiomegaly",),
    "consolidation": ("Consolidation",),
    "opacity": ("Opacity", "Airspace Disease", "Infiltrate"),
}
"""Manual MeSH headings of the Indiana University chest X-ray collection (Open-i) that name
each finding (the heading before the first ``/``; qualifiers such as ``/borderline`` ignored)."""


def read_openi_csv(path: Path) -> list[LabelledReport]:
    """The Indiana University / Open-i chest radiograph reports with their manual MeSH labels.

    Demner-Fushman et al., JAMIA 2016: adult chest radiograph reports of the Indiana Network for
    Patient Care, de-identified, each coded by hand with MeSH headings. This reads the common
    CSV layout of that collection (``uid, MeSH, Problems, image, indication, comparison,
    findings, impression``; one heading per ``;``). Reports with neither findings nor impression
    are left out. Labels are the findings of :data:`OPENI_MESH` whose heading the report carries.
    The text is ``"FINDINGS: ...\n\nIMPRESSION: ..."`` (parts that are empty left out); the split
    is :func:`split_of` of the uid (the whole set is held out here: no rule was made on it).

    Raises:
        ValueError: the file cannot be read or lacks one of the columns named.
    """
    import csv

    need = {"uid", "MeSH", "findings", "impression"}
    heading_to = {h: f for f, hs in OPENI_MESH.items() for h in hs}
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise ValueError(f"cannot read the Open-i reports {path}: {err}") from err
    if not rows or need - set(rows[0]):
        raise ValueError(f"{path}: an Open-i reports CSV needs the columns {', '.join(sorted(need))}")
    out = []
    for row in rows:
        parts = [(h, (row[c] or "").strip()) for h, c in (("FINDINGS", "findings"), ("IMPRESSION", "impression"))]
        text = "\n\n".join(f"{h}: {t}" for h, t in parts if t)
        if not text:
            continue
        headings = {m.split("/")[0].strip() for m in (row["MeSH"] or "").split(";")}
        labels = frozenset(heading_to[h] for h in headings if h in heading_to)
        out.append(LabelledReport(row["uid"], text, labels, split_of(row["uid"])))
    return out


def report_labels(tuples: Iterable[ReportedFinding], mode: str = "definite") -> set[str]:
    """The findings a structured report states present, as a report-level label set.

    A present tuple names its finding type and, when that is a predicted type, also the
    entity's own finding ("opacities compatible with atelectasis": opacity and atelectasis).
    In ``"definite"`` mode (MIMIC-ILS §C.1, the default) a tentative tuple names only
    ``opacity`` (for a lung finding) or nothing (a tentative cardiomegaly or effusion is
    neither); in ``"any"`` mode it names its findings as a definite one would; in
    ``"per-finding"`` mode it names each of its findings whose accepted hedge grades
    (:data:`~monailabel_xflow.ils.report_rules.TENTATIVE_COUNTS_AS`) hold the tuple's
    :attr:`~monailabel_xflow.data.mimic_ils.ReportedFinding.hedge` (an unknown grade counts as
    ``"possible"``), and the rest as under ``"definite"`` ("likely atelectasis": atelectasis;
    "likely pneumonia": opacity).

    Raises:
        ValueError: ``mode`` is not one of :data:`CERTAINTY_MODES`.
    """
    from monailabel_xflow.ils import report_rules as R
    from monailabel_xflow.ils.report import finding_of

    if mode not in CERTAINTY_MODES:
        raise ValueError(f"unknown certainty mode {mode!r}; supported: {', '.join(CERTAINTY_MODES)}")
    out: set[str] = set()
    for t in tuples:
        if not t.present:
            continue
        if t.finding is None:
            continue
        named = {n for n in (t.finding, finding_of(t.entity)) if n is not None}
        if t.tentative and mode != "any":
            grade = t.hedge or "possible"
            counted = {f for f in named if mode == "per-finding" and grade in R.TENTATIVE_COUNTS_AS.get(f, ())}
            out |= counted
            if (named - counted) & {"opacity", "consolidation", "pneumonia", "atelectasis", "edema"}:
                out.add("opacity")
        else:
            out |= named
    return out


def _prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def _counts(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """``[tp, fp, fn]`` per finding (columns) of boolean (report, finding) matrices."""
    return np.stack([(pred & true).sum(0), (pred & ~true).sum(0), (~pred & true).sum(0)])


def _summary(counts: np.ndarray, macro_mask: np.ndarray) -> tuple[float, float]:
    """(micro F1, macro F1 over ``macro_mask``) of a ``[3, finding]`` count matrix."""
    micro = _prf(*counts.sum(1))[2]
    f1s = [_prf(*counts[:, j])[2] for j in np.flatnonzero(macro_mask)]
    return micro, float(np.mean(f1s)) if f1s else 0.0


def score_labels(
    pred: dict[str, np.ndarray],
    true: np.ndarray,
    findings: Sequence[str],
    baseline: str | None = None,
    resamples: int = 2000,
    seed: int = 0,
    peers: Sequence[str] = (),
) -> dict:
    """Per-finding and averaged P / R / F1 of report-level labels, with bootstrap 95 % CIs.

    Args:
        pred: system name -> boolean ``(reports, findings)`` predictions.
        true: boolean ``(reports, findings)`` reference labels.
        findings: column names.
        baseline: a key of ``pred``; every other system gets the CI of its micro / macro F1
            minus the baseline's, on the same resamples (paired).
        peers: further keys of ``pred`` to compare with the same way: every other system gets
            ``"diff_vs": {peer: {"micro_ci", "macro_ci"}}``.
        resamples: bootstrap resamples of the reports (percentile intervals).
        seed: resampling seed.

    Returns:
        ``{"findings": [...], "macro_findings": [...], "systems": {name: {"per_finding": {f:
        {"precision", "recall", "f1", "f1_ci", "tp", "fp", "fn", "positives"}}, "micro": {...},
        "macro_f1", "macro_f1_ci", "micro_f1_ci", ("diff_micro_ci", "diff_macro_ci")}}}``.
    """
    n = true.shape[0]
    macro_mask = true.sum(0) >= MACRO_MIN_POSITIVES
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(resamples, n)) if n else np.zeros((0, 0), int)
    boot: dict[str, np.ndarray] = {}
    out: dict = {
        "findings": list(findings),
        "reports": n,
        "macro_findings": [f for f, m in zip(findings, macro_mask, strict=False) if m],
        "systems": {},
    }
    for name, p in pred.items():
        c = _counts(p, true)
        per = {}
        samples = np.zeros((resamples, 2 + len(findings)))
        for b in range(resamples):
            cb = _counts(p[idx[b]], true[idx[b]])
            samples[b, :2] = _summary(cb, macro_mask)
            samples[b, 2:] = [_prf(*cb[:, j])[2] for j in range(len(findings))]
        boot[name] = samples
        for j, f in enumerate(findings):
            pr, rc, f1 = _prf(*c[:, j])
            per[f] = {
                "precision": pr,
                "recall": rc,
                "f1": f1,
                "f1_ci": _ci(samples[:, 2 + j]),
                "tp": int(c[0, j]),
                "fp": int(c[1, j]),
                "fn": int(c[2, j]),
                "positives": int(true[:, j].sum()),
            }
        micro, macro = _summary(c, macro_mask)
        mp, mr, _ = _prf(*c.sum(1))
        out["systems"][name] = {
            "per_finding": per,
            "micro": {"precision": mp, "recall": mr, "f1": micro},
            "micro_f1_ci": _ci(samples[:, 0]),
            "macro_f1": macro,
            "macro_f1_ci": _ci(samples[:, 1]),
        }
    if baseline is not None and baseline in boot:
        for name, samples in boot.items():
            if name != baseline:
                out["systems"][name]["diff_micro_ci"] = _ci(samples[:, 0] - boot[baseline][:, 0])
                out["systems"][name]["diff_macro_ci"] = _ci(samples[:, 1] - boot[baseline][:, 1])
    for peer in peers:
        if peer not in boot:
            continue
        for name, samples in boot.items():
            if name != peer:
                out["systems"][name].setdefault("diff_vs", {})[peer] = {
                    "micro_ci": _ci(samples[:, 0] - boot[peer][:, 0]),
                    "macro_ci": _ci(samples[:, 1] - boot[peer][:, 1]),
                }
    return out


def _ci(values: np.ndarray) -> list[float]:
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))] if len(values) else [0.0, 0.0]


def certainty_agreement(
    tuples_per_report: Sequence[Sequence[ReportedFinding]], true: np.ndarray, findings: Sequence[str]
) -> dict:
    """How often a system's certainty agrees with labels that code only asserted findings.

    Coders of the CMC set assign a diagnosis code only to a diagnosis the report asserts (ICD-9-CM
    outpatient guidelines: "probable", "suspected", "rule out" are not coded), so for every
    report where the system states finding f present, definite should go with a code and
    tentative without one.

    Returns:
        ``{f: {"mentions", "agree", "accuracy"}}`` over findings with at least one present mention.
    """
    from monailabel_xflow.ils.report import finding_of

    out = {}
    for j, f in enumerate(findings):
        agree = total = 0
        for tuples, row in zip(tuples_per_report, true, strict=False):
            said = [t for t in tuples if t.present and t.finding and f in {t.finding, finding_of(t.entity)}]
            if not said:
                continue
            definite = any(not t.tentative for t in said)
            total += 1
            agree += definite == bool(row[j])
        if total:
            out[f] = {"mentions": total, "agree": agree, "accuracy": agree / total}
    return out


def evaluate_external(
    reports: Sequence[LabelledReport],
    structurers: dict[str, Callable],
    section_rules: Sequence[str] = ("findings", "findings+impression"),
    baseline: str | None = "keyword+NegEx",
    resamples: int = 2000,
    splits: Sequence[str] = ("dev", "held-out", "all"),
) -> dict:
    """Score structurers on labelled reports, per split, section rule and certainty mode.

    A report a structurer cannot structure (``ValueError``: no section, an LLM answer that
    failed validation) counts as stating nothing, and is counted in ``failures``.

    Returns:
        ``{"splits": {split: {"reports", "positives", "runs": {f"{rule}/{mode}": score_labels(...)},
        "certainty": {system: certainty_agreement(...)}, "failures": {system: n}}}}``; the
        splits are those asked for, of ``dev``, ``held-out`` and ``all``.
    """
    from monailabel_xflow.ils.report import structure_report

    findings = [f for f in EXTERNAL_FINDINGS if any(f in r.labels for r in reports)]
    tuples: dict[tuple[str, str], list] = {}
    failures: dict[str, int] = {name: 0 for name in structurers}
    for name, structurer in structurers.items():
        for rule in section_rules:
            got = []
            for r in reports:
                try:
                    got.append(structure_report(r.text, structurer, rule))
                except ValueError:
                    got.append([])
                    failures[name] += rule == section_rules[0]
            tuples[(name, rule)] = got
    out: dict = {"findings": findings, "splits": {}}
    for split in splits:
        keep = [k for k, r in enumerate(reports) if split == "all" or r.split == split]
        true = np.array([[f in reports[k].labels for f in findings] for k in keep], bool).reshape(
            len(keep), len(findings)
        )
        runs = {}
        for rule in section_rules:
            for mode in CERTAINTY_MODES:
                pred = {
                    name: np.array(
                        [[f in report_labels(tuples[(name, rule)][k], mode) for f in findings] for k in keep], bool
                    ).reshape(len(keep), len(findings))
                    for name in structurers
                }
                runs[f"{rule}/{mode}"] = score_labels(
                    pred, true, findings, baseline, resamples, peers=[PEER] if baseline else []
                )
        certainty = {
            name: certainty_agreement([tuples[(name, section_rules[0])][k] for k in keep], true, findings)
            for name in structurers
        }
        out["splits"][split] = {
            "reports": len(keep),
            "positives": dict(zip(findings, map(int, true.sum(0)), strict=False)),
            "runs": runs,
            "certainty": certainty,
            "failures": failures if split == "all" else None,
        }
    return out


# --- comparison structurers: keyword + NegEx, and a published labeler's phrases ---------------

KEYWORDS: dict[str, tuple[str, ...]] = {
    "pneumonia": (r"\bpneumonias?\b",),
    "atelectasis": (r"\batelectasis\b",),
    "effusion": (r"\beffusions?\b",),
    "edema": (r"\bedema\b",),
    "cardiomegaly": (r"\bcardiomegaly\b",),
    "consolidation": (r"\bconsolidations?\b",),
    "opacity": (r"\bopacit(?:y|ies)\b",),
}
"""The baseline's keywords (regular expressions): each finding's own name."""

PEER = "CheXpert phrases+NegEx"
"""The published labeler's phrases: the second system every other one is compared with."""

CHEXPERT_PHRASE_FILES: dict[str, str] = {
    "pneumonia": "pneumonia",
    "atelectasis": "atelectasis",
    "pleural_effusion": "effusion",
    "edema": "edema",
    "cardiomegaly": "cardiomegaly",
    "consolidation": "consolidation",
    "lung_opacity": "opacity",
    "airspace_opacity": "opacity",
}
"""CheXpert labeler phrase files (``phrases/{mention,unmention}/NAME.txt``) -> our findings."""


class PhraseNegExStructurer:
    """A comparison structurer: regular-expression phrases searched in each lower-cased sentence
    (the CheXpert labeler's matching), a match dropped when it overlaps one of its finding's
    "unmention" phrases, then medspaCy's default ConText rules (NegEx's lexicon) for negation
    and uncertainty. No locations, no predicted types; sentence indices as :func:`split_sentences`.

    Args:
        phrases: finding -> regular expressions that name it (e.g. :data:`KEYWORDS`).
        unmention: finding -> expressions whose matches void an overlapping mention.
    """

    def __init__(self, phrases: Mapping[str, Sequence[str]], unmention: Mapping[str, Sequence[str]] | None = None):
        from monailabel_xflow.ils.report import blank_pipeline

        self.phrases = {f: [re.compile(p) for p in ps] for f, ps in phrases.items()}
        self.unmention = {f: [re.compile(p) for p in ps] for f, ps in (unmention or {}).items()}
        self.nlp = blank_pipeline()
        self.nlp.add_pipe("medspacy_pyrush")
        self.context = blank_pipeline().add_pipe("medspacy_context")  # medspaCy's default (NegEx-derived) rules

    def _spans(self, doc, sent):
        text = sent.text.lower()
        for finding, patterns in self.phrases.items():
            voids = [m.span() for u in self.unmention.get(finding, ()) for m in u.finditer(text)]
            for pattern in patterns:
                for m in pattern.finditer(text):
                    if any(m.start() < e and m.end() > s for s, e in voids):
                        continue
                    span = doc.char_span(
                        sent.start_char + m.start(), sent.start_char + m.end(), label=finding, alignment_mode="expand"
                    )
                    if span is not None:
                        yield span

    def __call__(self, section: str) -> list[ReportedFinding]:
        import spacy

        from monailabel_xflow.ils.report import run_pipeline

        doc = run_pipeline(self.nlp, section)
        sents = [s for s in doc.sents if any(c.isalpha() for c in s.text)]
        spans = [(k, sp) for k, sent in enumerate(sents, 1) for sp in self._spans(doc, sent)]
        doc.ents = spacy.util.filter_spans([sp for _, sp in spans])
        self.context(doc)
        index = {(sp.start, sp.end): k for k, sp in spans}
        return [
            ReportedFinding(e.text, index[(e.start, e.end)], not e._.is_negated, bool(e._.is_uncertain), (), e.label_)
            for e in doc.ents
            if not e._.is_hypothetical
        ]


def chexpert_structurer(folder: Path) -> PhraseNegExStructurer:
    """The CheXpert labeler's published mention / unmention phrases (a checkout of
    ``stanfordmlgroup/chexpert-labeler``: ``phrases/mention/*.txt``, ``phrases/unmention/*.txt``)
    matched its way, with ConText's NegEx rules in place of its dependency-graph negation and
    uncertainty patterns (they need a parser this project does not ship)."""
    folder = Path(folder)

    def read(kind: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for stem, finding in CHEXPERT_PHRASE_FILES.items():
            f = folder / "phrases" / kind / f"{stem}.txt"
            if f.is_file():
                out.setdefault(finding, []).extend(
                    x.strip().replace("_", " ") for x in f.read_text().splitlines() if x.strip()
                )
        return out

    phrases = read("mention")
    if not phrases:
        raise ValueError(f"no CheXpert mention phrases under {folder}/phrases/mention")
    return PhraseNegExStructurer(phrases, read("unmention"))


def render_external(result: dict, how: str) -> str:
    """Markdown tables of :func:`evaluate_external`: per split, rule and mode."""
    lines = [how, ""]
    for split, sres in result["splits"].items():
        lines += [
            f"### {split} ({sres['reports']} reports; reference positives: "
            + ", ".join(f"{f} {n}" for f, n in sres["positives"].items())
            + ")",
            "",
        ]
        for run, sc in sres["runs"].items():
            peer = any(s.get("diff_vs") for s in sc["systems"].values())
            lines += [
                f"**{run}** (macro over: {', '.join(sc['macro_findings']) or 'none'})",
                "",
                "| system | micro P | micro R | micro F1 [95 % CI] | macro F1 [95 % CI] | "
                "Δ micro F1 vs baseline [CI] | Δ macro F1 [CI] | "
                + ("Δ micro F1 vs CheXpert phrases [CI] | " if peer else "")
                + " | ".join(f"{f} P / R / F1 [F1 CI]" for f in sc["findings"])
                + " |",
                "|---" * (6 + bool(peer) + len(sc["findings"])) + "|---|",
            ]
            for name, s in sc["systems"].items():
                dm = s.get("diff_micro_ci")
                dM = s.get("diff_macro_ci")
                cells = [
                    name,
                    f"{s['micro']['precision']:.3f}",
                    f"{s['micro']['recall']:.3f}",
                    f"{s['micro']['f1']:.3f} [{s['micro_f1_ci'][0]:.3f}, {s['micro_f1_ci'][1]:.3f}]",
                    f"{s['macro_f1']:.3f} [{s['macro_f1_ci'][0]:.3f}, {s['macro_f1_ci'][1]:.3f}]",
                    f"[{dm[0]:+.3f}, {dm[1]:+.3f}]" if dm else "-",
                    f"[{dM[0]:+.3f}, {dM[1]:+.3f}]" if dM else "-",
                ]
                if peer:
                    dp = s.get("diff_vs", {}).get(PEER)
                    cells.append(f"[{dp['micro_ci'][0]:+.3f}, {dp['micro_ci'][1]:+.3f}]" if dp else "-")
                cells += [
                    f"{v['precision']:.2f} / {v['recall']:.2f} / {v['f1']:.2f} "
                    f"[{v['f1_ci'][0]:.2f}, {v['f1_ci'][1]:.2f}]"
                    for v in s["per_finding"].values()
                ]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
        lines += [
            "Certainty agreement (definite ⇔ coded), papers' section rule:",
            "",
            "| system | " + " | ".join(f"{f} (agree / mentions)" for f in result["findings"]) + " |",
            "|---" * (1 + len(result["findings"])) + "|",
        ]
        for name, cert in sres["certainty"].items():
            lines.append(
                f"| {name} | "
                + " | ".join(
                    f"{cert[f]['accuracy']:.2f} ({cert[f]['agree']}/{cert[f]['mentions']})" if f in cert else "-"
                    for f in result["findings"]
                )
                + " |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def render_markdown(result: dict, title: str, how: str) -> str:
    """A small report: the per-field table and how it was made."""
    lines = [
        f"# {title}",
        "",
        how,
        "",
        f"Studies: {result['studies']}; section chosen as written: {result['section_correct']}/{result['studies']}.",
        "",
        "| field | precision | recall | F1 | facts predicted | facts true |",
        "|---|---|---|---|---|---|",
    ]
    for field, s in result["scores"].items():
        lines.append(
            f"| {field} | {s['precision']:.3f} | {s['recall']:.3f} | {s['f1']:.3f} | {s['predicted']} | {s['true']} |"
        )
    return "\n".join(lines) + "\n"


def external_structurers(
    chexpert_phrases: str | None = None, llm_model: str | None = None, llm_max_new_tokens: int = 512
) -> dict[str, Callable]:
    """The systems scored on an external set: the rules, the keyword + NegEx baseline, the
    CheXpert labeler's phrases (given a checkout) and the LLM structurer (given a model)."""
    from monailabel_xflow.ils.report import default_structurer

    systems: dict[str, Callable] = {"rules": default_structurer(), "keyword+NegEx": PhraseNegExStructurer(KEYWORDS)}
    if chexpert_phrases:
        systems[PEER] = chexpert_structurer(Path(chexpert_phrases))
    if llm_model:
        from monailabel_xflow.ils.report_llm import structurer_from_name

        systems["llm"] = structurer_from_name("llm", model=llm_model, max_new_tokens=llm_max_new_tokens)
    return systems


def _external(args) -> tuple[str, dict]:
    """``--cmc2007`` / ``--openi``: the markdown report and the result of :func:`evaluate_external`."""
    source = Path(args.cmc2007 or args.openi)
    reports = read_cmc2007(source) if args.cmc2007 else read_openi_csv(source)
    splits = [x.strip() for x in args.splits.split(",") if x.strip()]
    if not splits or set(splits) - {"dev", "held-out", "all"}:
        raise SystemExit(f"--splits: a comma-separated list of dev, held-out, all; got {args.splits!r}")
    systems = external_structurers(args.chexpert_phrases, args.llm_model, args.llm_max_new_tokens)
    result = evaluate_external(reports, systems, resamples=args.resamples, splits=splits)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    what = (
        f"CMC 2007 chest radiograph reports: {len(reports)} of `{source.name}` (sha256 {digest[:16]}...), "
        f"labels = the coders' majority ICD-9-CM codes (486 pneumonia, 518.0 atelectasis, 511.9 effusion)"
        if args.cmc2007
        else f"Indiana University / Open-i chest radiograph reports: {len(reports)} of `{source.name}` (sha256 "
        f"{digest[:16]}...), labels = the manual MeSH headings ("
        + "; ".join(f"{f}: {' / '.join(hs)}" for f, hs in OPENI_MESH.items())
        + ")"
    )
    how = (
        f"# Report structuring against external labels\n\nGenerated by `python -m monailabel_xflow.ils.report_eval "
        f"--{'cmc2007' if args.cmc2007 else 'openi'} ...`; read with `reports/ils/structuring.md` (source, licence, "
        f"split, what the labels mean). {what}; "
        f"{args.resamples} bootstrap resamples of the reports (95 % percentile intervals; the Δ columns are paired "
        f"differences to keyword+NegEx and, where it ran, to the CheXpert phrases). Run names: section rule / "
        f"certainty mode."
    )
    return render_external(result, how), result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m monailabel_xflow.ils.report_eval", description="score report structuring on a phantom set"
    )
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--phantoms", help="folder written by `xflow phantom`")
    src.add_argument("--handwritten", help="JSON of hand-written reports with their tuples")
    src.add_argument(
        "--cmc2007",
        help="the CMC 2007 challenge's 2007ChallengeTrainData.xml (external labels; in the repository: "
        "tests/data/cmc2007/2007ChallengeTrainData.xml)",
    )
    src.add_argument("--openi", metavar="CSV", help="Indiana University / Open-i reports CSV with manual MeSH labels")
    ap.add_argument(
        "--chexpert-phrases",
        metavar="DIR",
        help="with --cmc2007 / --openi: a chexpert-labeler checkout; its phrases become the peer system",
    )
    ap.add_argument("--llm-model", metavar="PATH", help="with --cmc2007: also score the LLM structurer (local model)")
    ap.add_argument(
        "--llm-max-new-tokens",
        type=int,
        default=512,
        metavar="N",
        help="with --llm-model: longest answer per report (default 512)",
    )
    ap.add_argument("--resamples", type=int, default=2000, help="with --cmc2007: bootstrap resamples (default 2000)")
    ap.add_argument(
        "--splits",
        default="dev,held-out,all",
        help="with --cmc2007: comma-separated splits to score (default dev,held-out,all)",
    )
    ap.add_argument("--out", help="markdown report to write (a JSON with the errors goes beside it)")
    args = ap.parse_args(argv)
    if args.cmc2007 or args.openi:
        text, result = _external(args)
    else:
        if args.phantoms:
            result = evaluate_phantoms(Path(args.phantoms))
            how = f"Rule-based structurer (medspaCy) on the phantom reports of `{args.phantoms}`."
        else:
            result = evaluate_handwritten(Path(args.handwritten))
            how = f"Rule-based structurer (medspaCy) on the hand-written reports of `{args.handwritten}`."
        text = render_markdown(result, "Report structuring against known tuples", how)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
