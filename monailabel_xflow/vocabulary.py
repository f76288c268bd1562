"""The fixed vocabulary of XFlow and MIMIC-ILS.

Text answers are scored by exact match, so every string the models read or write comes from
here. Nothing in this module imports anything heavy.

Sides are the *patient's*: the patient's left lung appears on the image's right in a frontal
(PA/AP) radiograph displayed in radiological convention.
"""

from __future__ import annotations

from dataclasses import dataclass

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


# --- codes of the findings in DICOM SEG objects (monailabel_xflow.data.seg) ------------------

NO_FINDING = "no finding"
"""The one segment of a SEG that holds no finding."""


@dataclass(frozen=True)
class Coded:
    """One code: value, scheme designator, meaning."""

    value: str
    scheme: str
    meaning: str


CATEGORY = Coded("49755003", "SCT", "Morphologically Abnormal Structure")
FINDING_CODES: dict[str, Coded] = {
    "cardiomegaly": Coded("8186001", "SCT", "Cardiomegaly"),
    "pneumonia": Coded("233604007", "SCT", "Pneumonia"),
    "atelectasis": Coded("46621007", "SCT", "Atelectasis"),
    "opacity": Coded("112001", "DCM", "Opacity"),
    "consolidation": Coded("95436008", "SCT", "Lung consolidation"),
    "edema": Coded("19242006", "SCT", "Pulmonary edema"),
    "effusion": Coded("60046008", "SCT", "Pleural effusion"),
}
"""Category SCT 49755003 "Morphologically Abnormal Structure" for every
finding (DICOM PS3.16 CID 7150 "Segmentation Property Categories"); types, with their source:

==============  =====  =========  ===============================  ==========================================
finding         value  scheme     code / meaning                   source
==============  =====  =========  ===============================  ==========================================
cardiomegaly    1      SCT        8186001 Cardiomegaly             SNOMED CT International (see below)
pneumonia       2      SCT        233604007 Pneumonia              SNOMED CT International (not in PS3.16)
atelectasis     3      SCT        46621007 Atelectasis             SNOMED CT International (not in PS3.16)
opacity         4      DCM        112001 Opacity                   DICOM PS3.16 CID 6104 (SNOMED CT has no
                                                                   plain "lung opacity" concept in PS3.16)
consolidation   5      SCT        95436008 Lung consolidation      SNOMED CT International (not in PS3.16)
edema           6      SCT        19242006 Pulmonary edema         DICOM PS3.16 CID 3700
effusion        7      SCT        60046008 Pleural effusion        DICOM PS3.16 CID 645
no finding      -      SCT        17621005 Normal                  DICOM PS3.16 CID 7151
==============  =====  =========  ===============================  ==========================================

(PS3.16 codes as shipped in ``pydicom.sr``; the SNOMED CT codes not taken from PS3.16 are the
International Edition's disorder concepts of those names. PS3.16 CID 12249 lists "Cardiomegaly"
as SCT 287272002, but PS3.16's own SNOMED mapping gives 287272002 the fully specified name
"Enlarged septal foramen of heart (disorder)"; SEGs are written with 8186001 and 287272002 is
accepted as cardiomegaly when reading, see :data:`READ_ALIASES`.)
"""
NO_FINDING_CODE = Coded("17621005", "SCT", "Normal")
READ_ALIASES: dict[tuple[str, str], str] = {("287272002", "SCT"): "cardiomegaly"}
"""Other tools' type codes read as a finding (PS3.16 CID 12249's "Cardiomegaly")."""
assert tuple(FINDING_CODES) == FINDINGS
