"""The records that pass between the report side and the image side of the MIMIC-ILS pipeline.

Only plain data lives here, so both sides (and tests) can build them without importing either.
"""

from __future__ import annotations

from dataclasses import dataclass

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
"""The 17 location categories of MIMIC-ILS (DESIGN §14)."""

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
    """

    entity: str
    sentence: int
    present: bool
    tentative: bool
    locations: tuple[str, ...] = ()
    finding: str | None = None
