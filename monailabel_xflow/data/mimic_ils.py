"""The records that pass between the report side and the image side of the MIMIC-ILS pipeline.

Only plain data lives here, so both sides (and tests) can build them without importing either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from monailabel_xflow.errors import InputError

LOCATION_CATEGORIES: tuple[str, ...] = (
    "thoracic spine",
    "cervical spine",
    "lumbar spine",
    "clavicle",
    "scapula",
    "rib",
    "sternum",
    "diaphragm",
    "mediastinum",
    "abdomen",
    "heart",
    "breast",
    "trachea",
    "vessels",
    "lung",
    "pleura",
    "lateral view location",
)
"""The 17 location categories of MIMIC-ILS."""

LUNG_LOBES: tuple[str, ...] = (
    "right upper lobe",
    "right middle lobe",
    "right lower lobe",
    "left upper lobe",
    "left lower lobe",
)
"""The five lobes; the eight zones and two lungs are :data:`monailabel_xflow.vocabulary.REGIONS`."""


@dataclass(frozen=True)
class ReportedFinding:
    """One finding of a report: the paper's 6-tuple (entity, sentence, presence, certainty,
    location, predicted type).

    Attributes:
        entity: the finding as written, anatomy words moved out ("hilar adenopathy" ->
            "adenopathy").
        sentence: 1-based index of the sentence in the chosen report section.
        present: True for present or stable, False for absent or resolved.
        tentative: True for hedged statements ("possible", "suggests", "cannot exclude").
        locations: fine location labels: lung / zone strings of ``vocabulary`` ("left lung base"),
            lobes of :data:`LUNG_LOBES`, or one of :data:`LOCATION_CATEGORIES`; empty when the
            report names no location.
        finding: the predicted type as one of ``vocabulary.FINDINGS`` ("opacity reflects
            pneumonia" -> "pneumonia"), or None when the entity is none of them.
        hedge: for a tentative tuple, how the report hedges it, when the structurer knows:
            ``"probable"`` ("likely", "probable", "suspicious for"), ``"possible"`` ("may",
            "possible", "cannot exclude") or ``"alternative"`` ("atelectasis versus pneumonia");
            None for a definite tuple or an unknown grade. Not one of the paper's six fields:
            it is left out of equality, ``repr`` and :func:`tuple_to_dict` when None, and only
            report-level labels read it (``ils.report_eval.report_labels``).
    """

    entity: str
    sentence: int
    present: bool
    tentative: bool
    locations: tuple[str, ...] = ()
    finding: str | None = None
    hedge: str | None = field(default=None, compare=False, repr=False)


REPORTS_CSV_COLUMNS: tuple[str, ...] = ("study_id", "image_path", "report")
"""Columns of a reports CSV (``xflow phantom`` writes one; ``xflow ils build --reports`` reads it).

Schema: UTF-8, comma-separated, a header row naming at least these columns (others are kept and
ignored), one row per image:

* ``study_id``: the study the image belongs to; for phantoms the MIMIC-style key of
  ``mimic_ils.json`` (``s5...``). ``xflow ils build`` takes one (frontal) image per study: the
  first row of a study; later rows of the same study are skipped with a message.
* ``image_path``: the image (PNG / JPEG / DICOM), relative to the folder given as ``xflow ils
  build --images`` (for ``xflow phantom`` sets, the CSV's own folder) or absolute.
* ``report``: the whole free-text report, line breaks kept (CSV-quoted); the section is chosen
  by :func:`choose_section`.
"""


class ReportsCsvError(InputError):
    """A reports CSV that does not follow :data:`REPORTS_CSV_COLUMNS`; the message says where."""


def write_reports_csv(path, rows) -> None:
    """Write ``rows`` (mappings with the :data:`REPORTS_CSV_COLUMNS` keys) to ``path``."""
    import csv
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(REPORTS_CSV_COLUMNS), extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: row[k] for k in REPORTS_CSV_COLUMNS})


def read_reports_csv(path) -> list[dict[str, str]]:
    """Read a reports CSV (schema: :data:`REPORTS_CSV_COLUMNS`).

    Returns:
        One dict per row with at least ``study_id``, ``image_path`` (as written) and ``report``.

    Raises:
        ReportsCsvError: missing file or column, or a row with an empty ``study_id`` /
            ``image_path`` (the message names the row).
    """
    import csv
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ReportsCsvError(f"reports CSV {path} does not exist")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REPORTS_CSV_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ReportsCsvError(
                f"{path}: missing column(s) {missing}; a reports CSV has the columns {list(REPORTS_CSV_COLUMNS)}"
            )
        rows = []
        for n, row in enumerate(reader, start=2):
            for c in ("study_id", "image_path"):
                if not (row.get(c) or "").strip():
                    raise ReportsCsvError(f"{path}, line {n}: empty {c}")
            row["report"] = row.get("report") or ""
            rows.append(row)
    return rows


TRUTH_NAME = "report_findings.json"
"""Truth file ``xflow phantom`` writes under ``ground-truth/``: ``{study_id: {section_name,
section_text, findings: [ReportedFinding as dict]}}``."""


def pair_record(
    instruction: str, kind: str, answer: str, target: str, location, sent_idx: int | None, mask_path: str | None
) -> dict:
    """One instruction-answer pair in the MIMIC-ILS release layout.

    ``pair_id`` is left "" (numbered once the study's pairs are known); ``seg`` is whether the
    pair has a mask (``mask_path``, relative to ``lesion_mask/``; None for a negative)."""
    return {
        "pair_id": "",
        "instruction": instruction,
        "answer": answer,
        "type": kind,
        "target": target,
        "location": list(location),
        "sent_idx": sent_idx,
        "seg": mask_path is not None,
        "seg_mask_path": mask_path,
    }


def tuple_to_dict(t: ReportedFinding) -> dict:
    d = asdict(t)
    d["locations"] = list(t.locations)
    if d["hedge"] is None:
        del d["hedge"]
    return d
