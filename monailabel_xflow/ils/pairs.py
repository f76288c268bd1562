"""Location verification, quality control and the instruction-answer rules of MIMIC-ILS.

After Algorithm 1 (:mod:`monailabel_xflow.ils.masks`) each reported finding has three location
sets (paper §3.1):

* **reported**: every fine lung label of the finding (:func:`reported_labels`);
* **grounded**: the reported labels whose anatomy mask the generated lesion mask overlaps;
* **empty** (per study): lung regions overlapping no reported location of any finding.

Pairs (:func:`study_pairs`), every string from :class:`~monailabel_xflow.instructions.Instruction`:

* basic positive at the grounded location, the target ``opacity`` when the finding is tentative;
* global positive only when grounded == reported (answer: "It is located in the ...");
  cardiomegaly (definite) always gets a global positive with the heart mask;
* lesion inference for pneumonia, atelectasis and edema: "highly suggestive of" (definite) or
  "possibly reflects" (tentative);
* negatives: one per absent finding type (basic in a random lung region, or global), a
  cardiomegaly negative only when the cardiothoracic ratio is at most 0.45; one empty-location
  substitution per present type; one lesion-inference negative in an empty region.

Choices where the paper is silent (ours, conservative: precision before recall):

* A lung finding reported without a lung location ("pulmonary edema") is reported in both lungs.
  Labels outside the lungs (pleura, diaphragm, ...) are not lung anatomy and are left out.
* Lobes are anatomy for Algorithm 1 but not instruction regions: a grounded lobe is written as
  the zones where the mask lies inside that lobe. A zone whose lung is also grounded is dropped.
* "opacity" covers pneumonia, atelectasis, consolidation and edema too: no opacity negative or
  global is drawn where one of them is present, except in empty regions; a global positive needs
  its finding to be the only present finding answering the target.
* Tentative findings give no global positive (the generic target would claim every opacity), and
  a tentative cardiomegaly gives neither a positive nor a negative.
* ``sent_idx`` is 0-based (the 1-based ``ReportedFinding.sentence`` minus one), like the
  phantom exporter's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from monailabel_xflow.data.mimic_ils import LUNG_LOBES, ReportedFinding, pair_record
from monailabel_xflow.data.phantom import CTR_NORMAL_MAX, cardiothoracic_ratio
from monailabel_xflow.ils.masks import LesionResult
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.vocabulary import (
    ALL_ZONES,
    FINDINGS,
    HEART,
    LESION_INFERENCE_TARGETS,
    LUNGS,
    REGIONS,
    lung_of,
)

LUNG_FINDINGS: tuple[str, ...] = tuple(f for f in FINDINGS if f != "cardiomegaly")
OPACITY_LIKE: frozenset[str] = frozenset({"opacity", "pneumonia", "atelectasis", "consolidation", "edema"})
"""Findings that a question about "opacity" also asks about."""

LUNG_LABELS: tuple[str, ...] = LUNGS + ALL_ZONES + LUNG_LOBES
"""Fine lung labels the location stage is asked for."""

QC_TOLERANCE = 0.05
"""Largest disagreement between the two anatomy models, as a fraction of the image side (ours;
the paper names the measures, outermost lung columns and lowest heart row, not the cut-off)."""


def reported_labels(finding: ReportedFinding) -> tuple[str, ...]:
    """The fine lung labels Algorithm 1 uses for a finding (rules in the module docstring)."""
    labels: list[str] = []
    for loc in finding.locations:
        if loc in LUNG_LABELS:
            labels.append(loc)
        elif loc == "lung":
            labels += list(LUNGS)
    if not labels and finding.finding in LUNG_FINDINGS:
        labels = list(LUNGS)
    return tuple(dict.fromkeys(labels))


def grounded_labels(reported: Sequence[str], masks: Mapping[str, np.ndarray], lesion: np.ndarray) -> tuple[str, ...]:
    """The reported labels whose anatomy mask the lesion mask overlaps (in reported order)."""
    return tuple(lab for lab in reported if lab in masks and bool((masks[lab] & lesion).any()))


def instruction_regions(
    grounded: Sequence[str], masks: Mapping[str, np.ndarray], lesion: np.ndarray
) -> tuple[str, ...]:
    """Grounded labels as instruction regions (lungs and zones, vocabulary order)."""
    regions = set()
    for label in grounded:
        if label in REGIONS:
            regions.add(label)
        elif label in LUNG_LOBES and label in masks:
            lobe = masks[label] & lesion
            regions.update(z for z in ALL_ZONES if z in masks and (masks[z] & lobe).any())
    regions -= {z for z in ALL_ZONES if lung_of(z) in regions}
    return tuple(r for r in REGIONS if r in regions)


def empty_regions(occupied: np.ndarray, masks: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """Lungs and zones (vocabulary order) whose mask overlaps nothing of ``occupied``."""
    return tuple(r for r in LUNGS + ALL_ZONES if r in masks and masks[r].any() and not (masks[r] & occupied).any())


def ctr(right_lung: np.ndarray, left_lung: np.ndarray, heart: np.ndarray) -> float | None:
    """Cardiothoracic ratio on the masks (:func:`monailabel_xflow.data.phantom.cardiothoracic_ratio`);
    None when a mask is empty."""
    if not (right_lung.any() and left_lung.any() and heart.any()):
        return None
    return cardiothoracic_ratio({LUNGS[0]: right_lung, LUNGS[1]: left_lung}, heart)


def cardiomegaly_negative_allowed(ratio: float | None) -> bool:
    """The paper's rule: a cardiomegaly negative only when the CTR is at most 0.45."""
    return ratio is not None and ratio <= CTR_NORMAL_MAX


def anatomy_disagreement(
    first: Mapping[str, np.ndarray], second: Mapping[str, np.ndarray], tolerance: float = QC_TOLERANCE
) -> list[str]:
    """The QC cross-check of the two anatomy models (paper App. D.2).

    Compares the outermost columns of the lungs (right lung's leftmost, left lung's rightmost)
    and the heart's lowest row.

    Args:
        first, second: ``{"right lung", "left lung", "heart"} -> bool mask`` from the anatomy
            stage and the location stage.
        tolerance: largest difference, as a fraction of the image width (columns) or height (rows).

    Returns:
        One line per disagreement (empty list: the image passes); a missing or empty mask counts.
    """
    problems = []
    for key in (*LUNGS, HEART):
        if key not in first or key not in second or not first[key].any() or not second[key].any():
            problems.append(f"{key}: missing in one anatomy model")
    if problems:
        return problems
    h, w = first[HEART].shape

    def outer(m: np.ndarray, side: str) -> int:
        cols = np.flatnonzero(m.any(axis=0))
        return int(cols[0] if side == LUNGS[0] else cols[-1])

    for lung in LUNGS:
        a, b = outer(first[lung], lung), outer(second[lung], lung)
        if abs(a - b) > tolerance * w:
            problems.append(f"{lung}: outermost column {a} vs {b}")
    a = int(np.flatnonzero(first[HEART].any(axis=1))[-1])
    b = int(np.flatnonzero(second[HEART].any(axis=1))[-1])
    if abs(a - b) > tolerance * h:
        problems.append(f"heart: lowest row {a} vs {b}")
    return problems


@dataclass
class FindingOutcome:
    """One reported finding after the image side.

    Attributes:
        finding: the structured finding.
        reported: :func:`reported_labels`.
        grounded: :func:`grounded_labels` (``()`` without a mask).
        mask: the lesion mask (the heart for cardiomegaly), None when none was made.
        result: Algorithm 1's record (None for cardiomegaly and findings it does not run on).
        reason: why no mask (review sheet), "" when there is one.
    """

    finding: ReportedFinding
    reported: tuple[str, ...] = ()
    grounded: tuple[str, ...] = ()
    mask: np.ndarray | None = None
    result: LesionResult | None = None
    reason: str = ""


@dataclass
class Pairs:
    """The pairs of one study, in the MIMIC-ILS layout, and their masks (name -> bool mask)."""

    positive: list[dict] = field(default_factory=list)
    negative: list[dict] = field(default_factory=list)
    masks: dict[str, np.ndarray] = field(default_factory=dict)

    def add(
        self,
        ins: Instruction,
        answer: str,
        target: str,
        location: Sequence[str],
        sent: int | None,
        mask: np.ndarray | None = None,
        mask_name: str | None = None,
    ) -> None:
        if mask is None:
            self.negative.append(pair_record(ins.text, ins.kind, answer, target, location, sent, None))
            return
        if mask_name is None:
            raise ValueError("a pair with a mask needs the mask's file name")
        self.masks[mask_name] = mask
        self.positive.append(pair_record(ins.text, ins.kind, answer, target, location, sent, mask_name))

    def number(self, study: str) -> None:
        for i, pair in enumerate(self.positive + self.negative):
            pair["pair_id"] = f"{study}_{i:03d}"


def study_pairs(
    study: str,
    outcomes: Sequence[FindingOutcome],
    masks: Mapping[str, np.ndarray],
    heart: np.ndarray,
    ratio: float | None,
    rng: np.random.Generator,
) -> Pairs:
    """Instruction-answer pairs of one study (rules in the module docstring).

    Args:
        study: the study id (mask names are ``<study>/<name>.png``, pair ids ``<study>_NNN``).
        outcomes: every finding of the report, in report order.
        masks: location masks of :data:`LUNG_LABELS` (those the location stage made).
        heart: the heart mask (anatomy stage): cardiomegaly's positive mask.
        ratio: the image's cardiothoracic ratio.
        rng: the study's generator (random regions and negative kinds).
    """
    shape = heart.shape
    pairs = Pairs()
    present = [o for o in outcomes if o.finding.present]
    present_types = {o.finding.finding for o in present if o.finding.finding}
    occupied = np.zeros(shape, bool)
    for o in present:
        if o.finding.finding == "cardiomegaly":
            continue
        for lab in reported_labels(o.finding) if o.finding.finding else _other_labels(o.finding):
            if lab in masks:
                occupied |= masks[lab]
        if o.mask is not None:
            occupied |= o.mask
    empty = empty_regions(occupied, masks)

    def sent(o: FindingOutcome | None) -> int | None:
        return None if o is None else o.finding.sentence - 1

    for k, o in enumerate(outcomes):
        f = o.finding
        if not f.present or f.finding is None or o.mask is None:
            continue
        name = f"{study}/finding{k}_{f.finding}.png"
        if f.finding == "cardiomegaly":
            ins = Instruction("cardiomegaly", (), "global")
            pairs.add(ins, ins.located_answer((HEART,)), "cardiomegaly", [HEART], sent(o), o.mask, name)
            continue
        regions = instruction_regions(o.grounded, masks, o.mask)
        if not regions:
            continue
        target = "opacity" if f.tentative else f.finding
        ins = Instruction(target, regions, "basic")
        pairs.add(ins, "", target, regions, sent(o), o.mask, name)
        answering = [p for p in present if p.finding.finding in (OPACITY_LIKE if target == "opacity" else {target})]
        if not f.tentative and set(o.grounded) == set(o.reported) and answering == [o]:
            ins = Instruction(target, (), "global")
            pairs.add(ins, ins.located_answer(regions), target, regions, sent(o), o.mask, name)
        if f.finding in LESION_INFERENCE_TARGETS:
            ins = Instruction("opacity", regions, "lesion_inference")
            pairs.add(ins, ins.lesion_answer(f.finding, not f.tentative), f.finding, regions, sent(o), o.mask, name)

    lung_regions = LUNGS + ALL_ZONES
    opacity_present = bool(present_types & OPACITY_LIKE)
    for finding in FINDINGS:
        if finding in present_types:
            continue
        if finding == "cardiomegaly":
            if cardiomegaly_negative_allowed(ratio):
                ins = Instruction(finding, (), "global")
                pairs.add(ins, ins.absent_answer(), finding, [], None)
            continue
        if finding == "opacity" and opacity_present:  # only where no opacity-like finding is
            if empty:
                region = empty[int(rng.integers(len(empty)))]
                ins = Instruction(finding, (region,), "basic")
                pairs.add(ins, ins.absent_answer(), finding, [region], None)
            continue
        if rng.random() < 0.5:
            ins = Instruction(finding, (), "global")
            pairs.add(ins, ins.absent_answer(), finding, [], None)
        else:
            region = lung_regions[int(rng.integers(len(lung_regions)))]
            ins = Instruction(finding, (region,), "basic")
            pairs.add(ins, ins.absent_answer(), finding, [region], None)
    for finding in LUNG_FINDINGS:  # empty-location substitution, one per present type
        if finding in present_types and empty:
            region = empty[int(rng.integers(len(empty)))]
            o = next(p for p in present if p.finding.finding == finding)
            ins = Instruction(finding, (region,), "basic")
            pairs.add(ins, ins.absent_answer(), finding, [region], sent(o))
    if empty:
        region = empty[int(rng.integers(len(empty)))]
        ins = Instruction("opacity", (region,), "lesion_inference")
        pairs.add(ins, ins.absent_answer(), "opacity", [region], None)
    pairs.number(study)
    return pairs


def _other_labels(finding: ReportedFinding) -> tuple[str, ...]:
    """Lung labels of a finding outside the seven (a nodule, a mass): its lung location occupies
    the lungs like any lesion's; without any location, both lungs; outside the lungs, none."""
    if not finding.locations:
        return LUNGS
    labels = [
        lab for loc in finding.locations for lab in ((loc,) if loc in LUNG_LABELS else LUNGS if loc == "lung" else ())
    ]
    return tuple(dict.fromkeys(labels))
