"""Building the CheXpercept evaluation set (paper §5.1, App. A.1–A.2, B.1).

Three steps, each a pure function of plain data so it can be checked by hand:

1. **Verdicts.** Every source (CheXpercept's zone lists, the report parse, Chest ImaGenome) is
   reduced to a verdict, present (True) or absent (False), per *triple*
   ``(image_id, finding, region)``; ``region`` is a lung, a zone, or :data:`CHEST` for the
   finding anywhere in the chest. :func:`verdicts_from_zones` does this for a source that lists
   the zones a finding occupies (CheXpercept's form).
2. **Three-source agreement** (:func:`agree`). A triple is admitted only when *every* source
   gives it a verdict and all verdicts are identical; it takes that verdict as its label.
   Anything else, including a source that is silent about the triple, drops it.
3. **Patient-level split** (:func:`patient_split`). Radiographs are divided by patient, so no
   patient is on both sides. Patients are placed greedily, scarcest first, each on the side that
   is furthest below its quota (relative deficit) on the scarcest stratum the patient carries;
   every radiograph also carries the stratum ``"radiographs"``, so patients without a rare
   stratum balance the overall ratio. Matching the overall ratio alone could strand a rare
   stratum (the paper's 85 unilateral pairs) almost entirely on one side.

:func:`questions` turns admitted triples into evaluation questions at the three levels.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from monailabel_xflow.errors import InputError
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS, ZONES

__all__ = [
    "CHEST",
    "CheXperceptError",
    "Triple",
    "Agreement",
    "verdicts_from_zones",
    "agree",
    "Question",
    "questions",
    "SplitItem",
    "SplitResult",
    "patient_split",
    "default_strata",
]

CHEST = "chest"
"""Region of a chest-level triple: the finding anywhere in the radiograph."""

RADIOGRAPHS = "radiographs"
"""Stratum every radiograph carries (balances the overall ratio)."""

Triple = tuple[str, str, str]
"""``(image_id, finding, region)``; region is :data:`CHEST`, a lung or a zone."""


class CheXperceptError(InputError):
    """Inconsistent input (unknown finding or region, bad ratios)."""


# --- verdicts and agreement --------------------------------------------------------------------


def verdicts_from_zones(
    image_id: str, finding: str, zones: Iterable[str], present: bool | None = None
) -> dict[Triple, bool]:
    """Verdicts of a source that lists the zones a finding occupies.

    Args:
        image_id: the radiograph.
        finding: one of the seven findings.
        zones: zones (or whole lungs, meaning their four zones) the finding occupies; empty when
            absent.
        present: chest-level verdict; default ``bool(zones)``. Cardiomegaly has no zones, so pass
            it here.

    Returns:
        For cardiomegaly only the chest triple; otherwise the chest triple, both lungs (present
        when any of their zones is) and all eight zones.

    Raises:
        CheXperceptError: unknown finding or region.
    """
    if finding not in FINDINGS:
        raise CheXperceptError(f"unknown finding {finding!r}")
    occupied: set[str] = set()
    for region in zones:
        if region in LUNGS:
            occupied.update(ZONES[region])
        elif region in ALL_ZONES:
            occupied.add(region)
        else:
            raise CheXperceptError(f"{image_id}/{finding}: {region!r} is not a lung or zone")
    chest = bool(occupied) if present is None else bool(present)
    out: dict[Triple, bool] = {(image_id, finding, CHEST): chest}
    if finding == "cardiomegaly":
        return out
    for lung in LUNGS:
        out[(image_id, finding, lung)] = any(z in occupied for z in ZONES[lung])
    for zone in ALL_ZONES:
        out[(image_id, finding, zone)] = zone in occupied
    return out


@dataclass
class Agreement:
    """Result of :func:`agree`.

    Attributes:
        admitted: triple -> agreed verdict.
        dropped: triple -> why it was dropped (missing source(s) or the disagreeing verdicts).
    """

    admitted: dict[Triple, bool]
    dropped: dict[Triple, str]

    def images(self) -> set[str]:
        """Radiographs keeping at least one admitted triple."""
        return {t[0] for t in self.admitted}


def agree(sources: Mapping[str, Mapping[Triple, bool]]) -> Agreement:
    """The three-source agreement filter (App. A.2), for any number (>= 1) of sources.

    Args:
        sources: source name -> its verdicts.

    Returns:
        :class:`Agreement` over the union of all triples any source mentions, in sorted order.
    """
    if not sources:
        raise CheXperceptError("need at least one source")
    universe = sorted(set().union(*(set(v) for v in sources.values())))
    admitted: dict[Triple, bool] = {}
    dropped: dict[Triple, str] = {}
    for triple in universe:
        missing = [name for name, v in sources.items() if triple not in v]
        if missing:
            dropped[triple] = f"missing in {', '.join(missing)}"
            continue
        verdicts = {name: bool(v[triple]) for name, v in sources.items()}
        if len(set(verdicts.values())) == 1:
            admitted[triple] = next(iter(verdicts.values()))
        else:
            dropped[triple] = "disagree: " + ", ".join(
                f"{n}={'present' if p else 'absent'}" for n, p in verdicts.items()
            )
    return Agreement(admitted, dropped)


# --- questions ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """One evaluation question about one radiograph."""

    image_id: str
    instruction: Instruction
    positive: bool

    @property
    def level(self) -> str:
        return self.instruction.level


def questions(admitted: Mapping[Triple, bool]) -> list[Question]:
    """Evaluation questions from admitted triples (App. B.1).

    - chest triple -> "Segment the F." (global);
    - lung triple -> "Segment the F in the <lung>.";
    - zone level: each absent zone is its own negative question; the present zones of one lung
      form one positive question naming them all ("... in the left mid zone lung and left lung
      base."), asked only when all four zones of that lung were admitted (otherwise the set of
      zones it names is not known to be right) and not all four are present (that is the lung
      question).

    Returns:
        Questions sorted by image, finding order, level, then region order.
    """
    by_key: dict[tuple[str, str], dict[str, bool]] = {}
    for (image, finding, region), verdict in admitted.items():
        by_key.setdefault((image, finding), {})[region] = verdict
    out: list[Question] = []
    order = {f: n for n, f in enumerate(FINDINGS)}
    for image, finding in sorted(by_key, key=lambda k: (k[0], order[k[1]])):
        regions = by_key[(image, finding)]
        if CHEST in regions:
            out.append(Question(image, Instruction(finding, (), "global"), regions[CHEST]))
        if finding == "cardiomegaly":
            continue
        for lung in LUNGS:
            if lung in regions:
                out.append(Question(image, Instruction(finding, (lung,)), regions[lung]))
        for lung in LUNGS:
            zones = ZONES[lung]
            present = [z for z in zones if regions.get(z) is True]
            if present and len(present) < len(zones) and all(z in regions for z in zones):
                out.append(Question(image, Instruction(finding, tuple(present)), True))
            for z in zones:
                if regions.get(z) is False:
                    out.append(Question(image, Instruction(finding, (z,)), False))
    return out


# --- patient-level split -----------------------------------------------------------------------


@dataclass(frozen=True)
class SplitItem:
    """A radiograph to place: its id, its patient, and the strata it carries (may repeat)."""

    image_id: str
    patient_id: str
    strata: Collection[str] = ()


@dataclass
class SplitResult:
    """Result of :func:`patient_split`.

    Attributes:
        assignment: image id -> side.
        patients: patient id -> side.
        counts: side -> stratum -> count placed there (``"radiographs"`` included).
        totals: stratum -> count overall.
        ratios: the target ratios, normalised to sum 1.
    """

    assignment: dict[str, str]
    patients: dict[str, str]
    counts: dict[str, Counter]
    totals: Counter
    ratios: dict[str, float] = field(default_factory=dict)

    def share(self, side: str, stratum: str = RADIOGRAPHS) -> float:
        """Share of ``stratum`` placed on ``side``."""
        return self.counts[side][stratum] / self.totals[stratum] if self.totals[stratum] else float("nan")


def default_strata(admitted: Mapping[Triple, bool]) -> dict[str, list[str]]:
    """Strata per radiograph from admitted triples, as the paper balances them.

    ``positive:<finding>`` for each finding present at chest level, and ``unilateral`` once per
    finding admitted present in exactly one lung and absent from the other.
    """
    strata: dict[str, list[str]] = {}
    for (image, finding, region), verdict in admitted.items():
        strata.setdefault(image, [])
        if region == CHEST and verdict:
            strata[image].append(f"positive:{finding}")
    for (image, finding, region), verdict in admitted.items():
        if region == LUNGS[0]:
            other = admitted.get((image, finding, LUNGS[1]))
            if other is not None and verdict != other:
                strata[image].append("unilateral")
    return strata


def patient_split(
    items: Sequence[SplitItem],
    ratios: Mapping[str, float] | None = None,
    *,
    seed: int = 0,
) -> SplitResult:
    """Greedy patient-level stratified split (App. A.1).

    Args:
        items: the radiographs; ``image_id`` unique.
        ratios: side -> target share (normalised); default ``{"rl": 0.7, "eval": 0.3}``.
        seed: breaks ties between equally scarce patients and equally deficient sides.

    Returns:
        :class:`SplitResult`; every patient's radiographs are on one side.

    Raises:
        CheXperceptError: duplicate image ids, or non-positive ratios.
    """
    ratios = dict(ratios or {"rl": 0.7, "eval": 0.3})
    if not ratios or any(r <= 0 for r in ratios.values()):
        raise CheXperceptError(f"ratios must be positive, got {ratios}")
    norm = sum(ratios.values())
    ratios = {side: r / norm for side, r in ratios.items()}
    ids = Counter(it.image_id for it in items)
    dup = [i for i, n in ids.items() if n > 1]
    if dup:
        raise CheXperceptError(f"duplicate image ids: {dup[:5]}")

    per_patient: dict[str, list[SplitItem]] = {}
    for it in items:
        per_patient.setdefault(it.patient_id, []).append(it)
    carried = {p: Counter(s for it in its for s in list(it.strata) + [RADIOGRAPHS]) for p, its in per_patient.items()}
    totals: Counter = Counter()
    for c in carried.values():
        totals.update(c)
    quota = {side: {s: r * totals[s] for s in totals} for side, r in ratios.items()}
    counts: dict[str, Counter[str]] = {side: Counter() for side in ratios}
    rng = np.random.default_rng(seed)
    jitter = {p: rng.random() for p in per_patient}

    def scarcest(p: str) -> str:
        return min(carried[p], key=lambda s: (totals[s], s))

    order = sorted(per_patient, key=lambda p: (totals[scarcest(p)], -len(per_patient[p]), jitter[p]))
    patients: dict[str, str] = {}
    for p in order:
        s = scarcest(p)

        def deficit(side: str, stratum: str) -> float:
            return 1.0 - counts[side][stratum] / quota[side][stratum]

        side = max(ratios, key=lambda sd: (deficit(sd, s), deficit(sd, RADIOGRAPHS), rng.random()))
        patients[p] = side
        counts[side].update(carried[p])
    assignment = {it.image_id: patients[it.patient_id] for it in items}
    return SplitResult(assignment, patients, counts, totals, ratios)
