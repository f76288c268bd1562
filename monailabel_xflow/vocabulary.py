"""The fixed vocabulary of XFlow and MIMIC-ILS.

Text answers are scored by exact match, so every string the models read or write comes from
here. Nothing in this module imports anything heavy.

Sides are the *patient's*: the patient's left lung appears on the image's right in a frontal
(PA/AP) radiograph displayed in radiological convention.
"""

from __future__ import annotations

FINDINGS: tuple[str, ...] = (
    "cardiomegaly",
    "pneumonia",
    "atelectasis",
    "opacity",
    "consolidation",
    "edema",
    "effusion",
)
"""The seven findings, in the order used for label values (label value = index + 1)."""

LESION_INFERENCE_TARGETS: tuple[str, ...] = ("pneumonia", "atelectasis", "edema")
"""Findings a lesion-inference question ("... and predict its type") may resolve an opacity to."""

HEART = "heart"
"""Region string of cardiomegaly, which is asked at chest level only."""

RIGHT_LUNG = "right lung"
LEFT_LUNG = "left lung"
LUNGS: tuple[str, ...] = (RIGHT_LUNG, LEFT_LUNG)

ZONES: dict[str, tuple[str, ...]] = {
    RIGHT_LUNG: (
        "right apical zone lung",
        "right upper zone lung",
        "right mid zone lung",
        "right lung base",
    ),
    LEFT_LUNG: (
        "left apical zone lung",
        "left upper zone lung",
        "left mid zone lung",
        "left lung base",
    ),
}
"""The eight zones, four per lung, from apex to base. The strings are irregular on purpose."""

ALL_ZONES: tuple[str, ...] = ZONES[RIGHT_LUNG] + ZONES[LEFT_LUNG]
REGIONS: tuple[str, ...] = LUNGS + ALL_ZONES + (HEART,)

LEVELS: tuple[str, ...] = ("chest", "lung", "zone")
"""Question levels of the XFlow evaluation: finding alone, one lung, named zones."""

KINDS: tuple[str, ...] = ("basic", "global", "lesion_inference")
"""Instruction types of MIMIC-ILS."""

REGION_JOINER = " and "

PRESENT = "present"
ABSENT = "absent"


def label_value(finding: str) -> int:
    """Label-map value of a finding (1..7); 0 is background."""
    return FINDINGS.index(finding) + 1


def lung_of(region: str) -> str:
    """The lung ('right lung' / 'left lung') a lung or zone string belongs to.

    Raises:
        ValueError: for 'heart' or an unknown string.
    """
    for lung, zones in ZONES.items():
        if region == lung or region in zones:
            return lung
    raise ValueError(f"{region!r} is not a lung or lung zone")


def join_regions(regions: tuple[str, ...] | list[str]) -> str:
    """Join region strings the MIMIC-ILS way ("left lung base and left mid zone lung")."""
    return REGION_JOINER.join(regions)
