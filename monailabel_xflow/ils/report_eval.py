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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterable

from monailabel_xflow.data.mimic_ils import TRUTH_NAME, ReportedFinding

FIELDS: tuple[str, ...] = ("entity", "presence", "certainty", "location")


def _key(t: ReportedFinding) -> str:
    return t.finding or " ".join(t.entity.lower().split())


def facts(tuples: Iterable[ReportedFinding], field: str) -> set[tuple]:
    """The set of facts one field of ``tuples`` states (see the module docstring)."""
    out = set()
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
    return ReportedFinding(d["entity"], int(d["sentence"]), bool(d["present"]), bool(d["tentative"]),
                           tuple(d.get("locations") or ()), d.get("finding"))


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
    pairs, section_ok, errors = [], 0, []
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
                errors.append({"study": row["study_id"], "field": field, "missed": sorted(map(str, t - p)),
                               "extra": sorted(map(str, p - t)), "section": sec.text})
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
                errors.append({"study": rep["id"], "field": field, "missed": sorted(map(str, t - p)),
                               "extra": sorted(map(str, p - t)), "section": rep["text"]})
    n = len(data["reports"])
    return {"scores": score(pairs), "studies": n, "section_correct": n, "errors": errors}


def render_markdown(result: dict, title: str, how: str) -> str:
    """A small report: the per-field table and how it was made."""
    lines = [f"# {title}", "", how, "",
             f"Studies: {result['studies']}; section chosen as written: "
             f"{result['section_correct']}/{result['studies']}.", "",
             "| field | precision | recall | F1 | facts predicted | facts true |", "|---|---|---|---|---|---|"]
    for field, s in result["scores"].items():
        lines.append(f"| {field} | {s['precision']:.3f} | {s['recall']:.3f} | {s['f1']:.3f} | "
                     f"{s['predicted']} | {s['true']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m monailabel_xflow.ils.report_eval",
                                 description="score report structuring on a phantom set")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--phantoms", help="folder written by `xflow phantom`")
    src.add_argument("--handwritten", help="JSON of hand-written reports with their tuples")
    ap.add_argument("--out", help="markdown report to write (a JSON with the errors goes beside it)")
    args = ap.parse_args(argv)
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
