"""Writing phantoms to disk: PNG, DICOM, ground-truth masks and MIMIC-ILS JSON.

Layout of a set written by :func:`export_set` (``DIR`` is ``--out``; images at the top level so a
MONAI Label local datastore lists them, everything else in sub-folders)::

    DIR/<stem>.png                            8-bit grey, MONOCHROME2 (what a datastore serves)
    DIR/dicom/<stem>.dcm                      the same pixels as DICOM (with --dicom)
    DIR/ground-truth/mimic_ils.json           MIMIC-ILS release format (splits -> studies -> pairs)
    DIR/ground-truth/phantoms.json            per image: seed, view, CTR, lesions, DICOM variant
    DIR/ground-truth/lesion_mask/<study>/*.png  8-bit 0/255 masks; ``seg_mask_path`` is relative
                                              to ``DIR/ground-truth/lesion_mask/``
    DIR/ground-truth/anatomy/<stem>.png       8-bit label map: 1..8 the zones in
                                              ``vocabulary.ALL_ZONES`` order, 9 the heart, 0 else
    DIR/reports.csv                           a radiology-style report per image (schema:
                                              ``mimic_ils.REPORTS_CSV_COLUMNS``)
    DIR/ground-truth/report_findings.json     per study: the section a reader must choose and
                                              the 6-tuples it states (``data.phantom_reports``)

``image_path`` in the JSON is relative to ``DIR``.

How instruction-answer pairs are chosen (after MIMIC-ILS §3.2, with exact ground truth). Strings
always come from :class:`~monailabel_xflow.instructions.Instruction`; a positive ``basic`` answer
is ``""`` (MIMIC-ILS answers it with ``[SEG]`` alone, and we do not write the token).

Positives (:func:`positive_pairs`), per phantom:

* Present lung finding F:
  - global positive "Segment the F." answered with its location: per lung, the lung name when F
    occupies all four of its zones, else the occupied zones; mask = union of F's lesions;
  - lung positive "Segment the F in the <lung>." for each lung F is in; mask = F within that lung;
  - zone positive naming exactly the zones F occupies in that lung (unless all four); the same
    mask, which lies inside those zones and touches each.
* Cardiomegaly: global only, located in "heart", mask = the heart.
* Lesion inference: for each pneumonia / atelectasis / edema lesion whose zones hold no lesion of
  another finding, "Segment the opacity in <its zones> and predict its type." answered "highly
  suggestive of" (confident lesion) or "possibly reflects"; mask = that lesion.

Negatives (:func:`matched_negatives`), per set: every positive's exact question is asked of
:data:`NEGATIVES_PER_POSITIVE` other phantoms on which it is true (:func:`negative_allowed`: the
finding nowhere in the image for a global question, in none of the named regions for a basic
one, no lesion at all in the named zones for lesion inference), drawn at random, within the same
split first. So negatives name as many regions, in the same patterns, as positives, and a
question's wording says nothing about its answer (issue 35; ``eval/text_shortcut.py`` audits
it). This departs from
MIMIC-ILS §3.2, whose negatives name one region (an absent finding in a random region, a present
one in an "empty location"), because with exact phantom truth the text shortcut, not the image,
is what that rule teaches. A cardiomegaly negative lands on a phantom without cardiomegaly, whose
CTR is always <= 0.45, as the paper's rule asks.

``section_content`` is the chosen section of the study's report (``reports.csv``); ``sent_idx`` is
the 0-based index of the sentence stating the pair's finding in it (``None`` when the report does
not state it); ``seg`` is True for positives.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import numpy as np
from PIL import Image

from monailabel_xflow.data import PHANTOM_SEEDS, PHANTOM_SET_SIZE
from monailabel_xflow.data.mimic_ils import TRUTH_NAME as REPORT_TRUTH_NAME
from monailabel_xflow.data.mimic_ils import pair_record, tuple_to_dict, write_reports_csv
from monailabel_xflow.data.phantom import Phantom, PhantomError, generate_phantom
from monailabel_xflow.data.phantom_reports import phantom_report
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.vocabulary import (
    ALL_ZONES,
    FINDINGS,
    LESION_INFERENCE_TARGETS,
    LUNGS,
    ZONES,
    join_regions,
)

NEGATIVES_PER_POSITIVE = 4
"""Matched negatives per positive question in an exported set (:func:`matched_negatives`). Four
keeps a training set's negatives, and so the variety of images a policy learns "absent" from,
about as many as before issue 35 (one per positive gave a quarter of them)."""

GT_DIR = "ground-truth"
MASK_DIR = "lesion_mask"
DICOM_DIR = "dicom"
JSON_NAME = "mimic_ils.json"
META_NAME = "phantoms.json"
REPORTS_CSV = "reports.csv"

DX_STORAGE = "1.2.840.10008.5.1.4.1.1.1.1"  # Digital X-Ray Image Storage - For Presentation
CR_STORAGE = "1.2.840.10008.5.1.4.1.1.1"  # Computed Radiography Image Storage


@dataclass(frozen=True)
class DicomVariant:
    """How one image is written as DICOM."""

    photometric: str  # MONOCHROME1 (inverted: air bright) or MONOCHROME2
    bits: int  # 8 (BitsStored 8) or 16 (BitsStored 12)
    modality: str  # CR or DX


def dicom_variant(index: int) -> DicomVariant:
    """The variant of study ``index``: cycles MONOCHROME2/1 x 8/16-bit x CR/DX so small sets cover all."""
    return DicomVariant(
        photometric="MONOCHROME1" if index % 2 else "MONOCHROME2",
        bits=16 if (index // 2) % 2 else 8,
        modality="DX" if (index // 4) % 2 == 0 else "CR",
    )


def quantize(image: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12-bit and 8-bit versions of a ``[0, 1]`` image, the 8-bit derived from the 12-bit.

    Returns:
        ``(v12 uint16 in 0..4095, v8 uint8)`` with ``v8 = (v12 * 255 + 2047) // 4095`` (rounded),
        so a 16-bit DICOM and the PNG hold the same picture exactly.
    """
    v12 = np.round(np.clip(image, 0, 1) * 4095).astype(np.uint16)
    v8 = ((v12.astype(np.uint32) * 255 + 2047) // 4095).astype(np.uint8)
    return v12, v8


def save_mask(path: Path, mask: np.ndarray) -> None:
    """An 8-bit PNG with 0 / 255."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.where(mask, 255, 0).astype(np.uint8)).save(path)


def write_dicom(
    path: Path, phantom: Phantom, v12: np.ndarray, v8: np.ndarray, variant: DicomVariant, subject_id: str, study_id: str
) -> None:
    """One single-frame CR/DX DICOM of the phantom, with fresh UIDs.

    Pixels: 8-bit variants store ``v8``, 16-bit ones ``v12`` (BitsStored 12); MONOCHROME1 stores
    ``max - value``, so a reader that honours the photometric interpretation gets the PNG back.
    """
    import pydicom
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import UID, ExplicitVRLittleEndian, generate_uid

    sop_class = DX_STORAGE if variant.modality == "DX" else CR_STORAGE
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = UID(sop_class)
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = pydicom.uid.PYDICOM_IMPLEMENTATION_UID
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.is_little_endian, ds.is_implicit_VR = True, False
    ds.SOPClassUID, ds.SOPInstanceUID = sop_class, meta.MediaStorageSOPInstanceUID
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.Modality = variant.modality
    ds.PatientName = f"Phantom^{subject_id}"
    ds.PatientID = subject_id
    ds.PatientSex = "O"
    ds.PatientBirthDate = ""
    ds.StudyDate = ds.SeriesDate = ds.ContentDate = "20260101"
    ds.StudyTime = ds.SeriesTime = ds.ContentTime = "120000"
    ds.StudyID = study_id[:16]
    ds.AccessionNumber = study_id[:16]
    ds.StudyDescription = "Synthetic chest radiograph (monailabel-xflow phantom)"
    ds.SeriesDescription = f"CHEST {phantom.view}"
    ds.SeriesNumber, ds.InstanceNumber = 1, 1
    ds.Manufacturer = "monailabel-xflow phantom"
    ds.BodyPartExamined = "CHEST"
    ds.ViewPosition = phantom.view
    ds.PatientOrientation = ["L", "F"]  # rows run to the patient's left, columns to the feet
    ds.ImageType = ["DERIVED", "PRIMARY"]
    if variant.modality == "DX":
        ds.PresentationIntentType = "FOR PRESENTATION"
    spacing = [f"{phantom.pixel_spacing_mm:.6g}"] * 2
    ds.PixelSpacing = spacing
    ds.ImagerPixelSpacing = spacing
    values = v8 if variant.bits == 8 else v12
    stored = 8 if variant.bits == 8 else 12
    top = (1 << stored) - 1
    if variant.photometric == "MONOCHROME1":
        values = (top - values.astype(np.int32)).astype(values.dtype)
    ds.Rows, ds.Columns = values.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = variant.photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = variant.bits, stored, stored - 1
    ds.PixelRepresentation = 0
    ds.WindowCenter, ds.WindowWidth = (top + 1) // 2, top + 1
    ds.PixelData = values.astype(np.uint8 if variant.bits == 8 else np.uint16).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(str(path), write_like_original=False)


# --- pairs ----------------------------------------------------------------------------------


def _location(phantom: Phantom, finding: str) -> tuple[str, ...]:
    """Where a finding is, as a global answer names it: whole lungs or their occupied zones."""
    occupied = set(phantom.occupied_zones(finding))
    out: list[str] = []
    for lung in LUNGS:
        zs = [z for z in ZONES[lung] if z in occupied]
        out += [lung] if len(zs) == 4 else zs
    return tuple(out)


def report_sentences(phantom: Phantom) -> list[tuple[str, str]]:
    """Synthetic findings section: ``(finding, sentence)`` per present finding, or one normal line."""
    out = []
    for f in phantom.findings:
        if f == "cardiomegaly":
            out.append((f, f"The heart is enlarged (cardiothoracic ratio {phantom.ctr:.2f})."))
        else:
            where = join_regions(_location(phantom, f))
            out.append((f, f"{f.capitalize()} is seen in the {where}."))
    return out or [("", "The lungs are clear. The heart size is normal.")]


def positive_pairs(
    phantom: Phantom, study: str, sent_of: dict[str, int] | None = None
) -> tuple[list[tuple[Instruction, dict]], dict[str, np.ndarray]]:
    """The positive MIMIC-ILS pairs of one phantom (rules in the module docstring).

    Args:
        sent_of: finding -> 0-based sentence index for ``sent_idx``; default the sentences of
            :func:`report_sentences`.

    Returns:
        ``(positives, masks)``: ``(instruction, pair)`` per positive, and each ``seg_mask_path``
        (relative to ``lesion_mask/``) mapped to its bool mask.
    """
    if sent_of is None:
        sent_of = {f: i for i, (f, _) in enumerate(report_sentences(phantom)) if f}
    pos: list[tuple[Instruction, dict]] = []
    masks: dict[str, np.ndarray] = {}

    def add(ins: Instruction, answer: str, finding: str, location, mask: np.ndarray, mask_name: str) -> None:
        rel = f"{study}/{mask_name}.png"
        masks[rel] = mask
        pos.append((ins, pair_record(ins.text, ins.kind, answer, finding, location, sent_of.get(finding), rel)))

    for finding in phantom.findings:
        ins = Instruction(finding, (), "global")
        if finding == "cardiomegaly":
            add(ins, ins.located_answer(("heart",)), finding, ["heart"], phantom.heart, "cardiomegaly")
            continue
        loc = _location(phantom, finding)
        add(ins, ins.located_answer(loc), finding, loc, phantom.finding_mask(finding), finding)
        for lung in LUNGS:
            zones = [z for z in ZONES[lung] if z in phantom.occupied_zones(finding)]
            if not zones:
                continue
            m = phantom.finding_mask(finding, lung)
            tag = lung.replace(" ", "_")
            add(Instruction(finding, (lung,)), "", finding, [lung], m, f"{finding}_{tag}")
            if len(zones) < 4:
                add(Instruction(finding, tuple(zones)), "", finding, zones, m, f"{finding}_{tag}")
    for k, les in enumerate(phantom.lesions):
        if les.finding not in LESION_INFERENCE_TARGETS:
            continue
        others = {z for o in phantom.lesions if o.finding != les.finding for z in o.zones}
        if others & set(les.zones):
            continue
        ins = Instruction("opacity", les.zones, "lesion_inference")
        answer = ins.lesion_answer(les.finding, les.confident)
        add(ins, answer, les.finding, les.zones, les.mask, f"lesion{k}_{les.finding}")
    return pos, masks


@dataclass(frozen=True)
class PhantomFacts:
    """What :func:`negative_allowed` reads of a phantom, kept for a whole set instead of its pixels.

    Attributes:
        findings: the findings present, in vocabulary order.
        zones: the zones any lesion touches.
        where: ``(finding, region)`` for every lung and zone holding a pixel of that finding.
    """

    findings: tuple[str, ...]
    zones: frozenset[str]
    where: frozenset[tuple[str, str]]

    @classmethod
    def of(cls, phantom: Phantom) -> PhantomFacts:
        regions = {**phantom.lungs, **phantom.zones}
        where: set[tuple[str, str]] = set()
        for finding in phantom.findings:
            mask = phantom.finding_mask(finding)
            where.update((finding, r) for r, inside in regions.items() if (mask & inside).any())
        return cls(phantom.findings, frozenset(phantom.occupied_zones()), frozenset(where))


def negative_allowed(facts: PhantomFacts, ins: Instruction) -> bool:
    """Whether ``ins`` is a true negative on the phantom of ``facts``: its finding absent from the
    image (global), from every named region (basic), or no lesion of any finding in the named
    zones (lesion inference: its answer would name a type)."""
    if ins.kind == "global":
        return ins.finding not in facts.findings
    if ins.kind == "lesion_inference":
        return not set(ins.regions) & facts.zones
    return not any((ins.finding, r) in facts.where for r in ins.regions)


class _AllowedIndex:
    """:func:`negative_allowed` for every phantom of a set at once, as a boolean array: a set of
    N phantoms gets its negatives in O(N) array work per question, not O(N) Python calls."""

    def __init__(self, phantoms: Sequence[PhantomFacts]) -> None:
        self._phantoms = phantoms
        self._columns: dict[tuple[str, str], np.ndarray] = {}

    def _column(self, kind: str, key: str, region: str = "") -> np.ndarray:
        """Per phantom: finding ``key`` present (kind "finding"), a lesion in zone ``key``
        ("zone"), or finding ``key`` with a pixel in ``region`` ("where")."""
        name = (kind, f"{key}|{region}")
        if name not in self._columns:
            if kind == "finding":
                values = [key in ph.findings for ph in self._phantoms]
            elif kind == "zone":
                values = [key in ph.zones for ph in self._phantoms]
            else:
                values = [(key, region) in ph.where for ph in self._phantoms]
            self._columns[name] = np.asarray(values, bool)
        return self._columns[name]

    def __call__(self, ins: Instruction) -> np.ndarray:
        """A fresh boolean array: ``negative_allowed(phantom, ins)`` for each phantom."""
        hit = np.zeros(len(self._phantoms), bool)
        if ins.kind == "global":
            hit |= self._column("finding", ins.finding)
        elif ins.kind == "lesion_inference":
            for zone in ins.regions:
                hit |= self._column("zone", zone)
        else:
            for region in ins.regions:
                hit |= self._column("where", ins.finding, region)
        return ~hit


def matched_negatives(
    phantoms: Sequence[PhantomFacts],
    positives: Sequence[Sequence[tuple[Instruction, dict]]],
    groups: Sequence[str],
    sent_of: Sequence[dict[str, int]],
    rng: np.random.Generator,
    per_positive: int = NEGATIVES_PER_POSITIVE,
) -> list[list[dict]]:
    """``per_positive`` negatives per positive, each asking the positive's exact question of
    another phantom.

    Each negative goes to a distinct phantom, drawn at random, on which it is true
    (:func:`negative_allowed`) and which does not already hold that question; phantoms of the
    same group (split) first, then any. Every negative text is then asked ``per_positive`` times as
    often as a positive text, at every level, so no reading of the wording alone beats chance
    (``eval/text_shortcut.py``). A positive that fewer phantoms can answer "absent" (possible only
    in sets without normal studies) gets fewer negatives.

    Args:
        phantoms: the set's phantoms, as :class:`PhantomFacts`.
        positives: per phantom, :func:`positive_pairs`' ``(instruction, pair)`` list.
        groups: per phantom, its split; negatives stay within it when they can.
        sent_of: per phantom, finding -> 0-based sentence index (``sent_idx`` of a negative whose
            finding that report states elsewhere; None otherwise).
        rng: draws the phantoms.
        per_positive: negatives per positive.

    Returns:
        Per phantom, its negative pairs.
    """
    negatives: list[list[dict]] = [[] for _ in phantoms]
    asked: dict[str, list[int]] = {}  # question -> the phantoms already asked it
    allowed = _AllowedIndex(phantoms)
    split = np.asarray(groups)
    for i, pairs in enumerate(positives):
        for ins, _ in pairs:
            fits = allowed(ins)
            fits[asked.get(ins.text, [])] = False
            fits[i] = False
            fits = np.flatnonzero(fits)
            same, others = fits[split[fits] == groups[i]], fits[split[fits] != groups[i]]
            # within the split first, then any; distinct phantoms, drawn at random
            chosen = [int(j) for pool in (same, others) for j in rng.permutation(pool)][:per_positive]
            for j in chosen:
                asked.setdefault(ins.text, []).append(j)
                sent = sent_of[j].get(ins.finding)
                negatives[j].append(
                    pair_record(ins.text, ins.kind, ins.absent_answer(), ins.finding, ins.regions, sent, None)
                )
    return negatives


# --- a whole set ----------------------------------------------------------------------------


def scheduled_findings(index: int, rng: np.random.Generator) -> tuple[str, ...]:
    """Findings of study ``index``: every 8th study is normal, the others cycle through the seven
    findings (so any 8 consecutive studies cover all) plus, 40 % of the time, one random extra."""
    slot = index % 8
    if slot == 7:
        return ()
    out = [FINDINGS[slot]]
    if rng.random() < 0.4:
        out.append(str(rng.choice([f for f in FINDINGS if f != FINDINGS[slot]])))
    return tuple(out)


def set_phantom(seed: int, index: int, size: int = 1024) -> Phantom:
    """The ``index``-th phantom of the set drawn with ``seed``: what :func:`export_set` writes."""
    s = image_seed(seed, index)
    return generate_phantom(s, size=size, findings=scheduled_findings(index, np.random.default_rng(s)))


class SetPhantoms(Sequence[Phantom]):
    """The phantoms of a set, each drawn again when read (:func:`set_phantom`): a set of any
    size is written and handed back with one phantom in memory at a time (about 17 MB at 1024 px)."""

    def __init__(self, seed: int, count: int, size: int) -> None:
        self.seed, self.size, self._count = seed, size, count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Phantom: ...

    @overload
    def __getitem__(self, index: slice) -> list[Phantom]: ...

    def __getitem__(self, index: int | slice) -> Phantom | list[Phantom]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        if not -self._count <= index < self._count:
            raise IndexError(f"phantom {index} of a set of {self._count}")
        return set_phantom(self.seed, index % self._count, self.size)


def image_seed(seed: int, index: int) -> int:
    """Seed of the ``index``-th phantom of a set drawn with ``seed`` (independent streams)."""
    return int(np.random.SeedSequence([int(seed), int(index)]).generate_state(1)[0])


def study_ids(seed: int, index: int) -> tuple[str, str]:
    """``(study_id, subject_id)`` of the ``index``-th phantom of a set drawn with ``seed``.

    Unique per (seed, index), so two sets never share an id (``s<seed>n<index>``: results, masks
    and caches keyed by study cannot mix phantoms of two seeds), and at most 16 characters (DICOM
    ``StudyID`` / ``AccessionNumber``) for seeds below 10^9 and sets below 10^5 studies.

    Raises:
        PhantomError: a negative seed or index, or one too large for a 16-character id.
    """
    if not (0 <= int(seed) < PHANTOM_SEEDS and 0 <= int(index) < PHANTOM_SET_SIZE):
        raise PhantomError(
            f"phantom ids need 0 <= seed < {PHANTOM_SEEDS} and 0 <= index < {PHANTOM_SET_SIZE}, got {seed}, {index}"
        )
    return f"s{int(seed)}n{int(index):05d}", f"p{int(seed)}n{int(index):05d}"


def split_of(index: int) -> str:
    """train / val / test, 8:1:1 by index."""
    return {8: "val", 9: "test"}.get(index % 10, "train")


def export_set(
    out: Path,
    count: int,
    seed: int,
    size: int = 1024,
    dicom: bool = False,
    progress: Callable[[Iterable], Iterable] = lambda it: it,
) -> tuple[dict, SetPhantoms]:
    """Generate and write ``count`` phantoms under ``out`` (layout in the module docstring).

    Args:
        out: destination folder (created).
        count: number of studies (>= 1).
        seed: set seed; study ``i`` uses :func:`image_seed` ``(seed, i)``.
        size: image side in pixels.
        dicom: also write ``dicom/<stem>.dcm`` in the :func:`dicom_variant` of each study.
        progress: wraps the study iterator (e.g. ``tqdm``).

    Returns:
        ``(mimic_ils_json_dict, phantoms)``; the phantoms are drawn again when read
        (:class:`SetPhantoms`), so the set is never all in memory.
    """
    out = Path(out)
    gt = out / GT_DIR
    release: dict = {"train": {}, "val": {}, "test": {}}
    meta = []
    facts = []  # what the negatives need, not the pixels: one phantom in memory at a time
    reports, truth = [], {}
    positives: list[list[tuple[Instruction, dict]]] = []
    sents: list[dict[str, int]] = []
    for i in progress(range(count)):
        s = image_seed(seed, i)
        ph = set_phantom(seed, i, size)
        facts.append(PhantomFacts.of(ph))
        stem = f"phantom_{seed}_{i:05d}"
        study, subject = study_ids(seed, i)
        v12, v8 = quantize(ph.image)
        out.mkdir(parents=True, exist_ok=True)
        Image.fromarray(v8).save(out / f"{stem}.png", compress_level=3)  # faster than 6, slightly larger files
        variant = dicom_variant(i)
        if dicom:
            write_dicom(out / DICOM_DIR / f"{stem}.dcm", ph, v12, v8, variant, subject, study)
        label = np.zeros(ph.image.shape, np.uint8)
        for k, z in enumerate(ALL_ZONES):
            label[ph.zones[z]] = k + 1
        label[ph.heart] = 9
        (gt / "anatomy").mkdir(parents=True, exist_ok=True)
        Image.fromarray(label).save(gt / "anatomy" / f"{stem}.png")

        report = phantom_report(ph, np.random.default_rng([s, 0x5E907]))  # own stream: images unchanged
        reports.append({"study_id": study, "image_path": f"{stem}.png", "report": report.text})
        truth[study] = {
            "section_name": report.section_name,
            "section_text": report.section_text,
            "findings": [tuple_to_dict(t) for t in report.truth],
        }
        sent_of = {f: n - 1 for f in ph.findings if (n := report.sentence_of(f))}
        pos, masks = positive_pairs(ph, study, sent_of)
        positives.append(pos)
        sents.append(sent_of)
        lesion_meta = []
        for k, les in enumerate(ph.lesions):
            rel = f"{study}/lesion{k}_{les.finding}.png"
            masks[rel] = les.mask
            lesion_meta.append(
                {
                    "finding": les.finding,
                    "lung": les.lung,
                    "zones": list(les.zones),
                    "confident": les.confident,
                    "mask": rel,
                }
            )
        for rel, m in masks.items():
            save_mask(gt / MASK_DIR / rel, m)
        release[split_of(i)][study] = {
            "subject_id": subject,
            "dicom_id": stem,
            "image_path": f"{stem}.png",
            "section_name": report.section_name,
            "section_content": report.section_text,
            "instruction_answer_pairs": {"positive_pairs": [pair for _, pair in pos], "negative_pairs": []},
        }
        meta.append(
            {
                "study": study,
                "image": f"{stem}.png",
                "seed": s,
                "size": size,
                "view": ph.view,
                "ctr": round(ph.ctr, 4),
                "pixel_spacing_mm": ph.pixel_spacing_mm,
                "findings": list(ph.findings),
                "lesions": lesion_meta,
                "anatomy": f"anatomy/{stem}.png",
                "dicom": (
                    {
                        "path": f"{DICOM_DIR}/{stem}.dcm",
                        "photometric": variant.photometric,
                        "bits": variant.bits,
                        "modality": variant.modality,
                    }
                    if dicom
                    else None
                ),
            }
        )
    splits = [split_of(i) for i in range(count)]
    negatives = matched_negatives(facts, positives, splits, sents, np.random.default_rng([int(seed), 0x4E67]))
    for i, neg in enumerate(negatives):
        study = study_ids(seed, i)[0]
        pairs = release[splits[i]][study]["instruction_answer_pairs"]
        pairs["negative_pairs"] = neg
        for k, pair in enumerate(pairs["positive_pairs"] + neg):
            pair["pair_id"] = f"{study}_{k:03d}"
    gt.mkdir(parents=True, exist_ok=True)
    (gt / JSON_NAME).write_text(json.dumps(release, indent=1))
    (gt / META_NAME).write_text(json.dumps(meta, indent=1))
    (gt / REPORT_TRUTH_NAME).write_text(json.dumps(truth, indent=1))
    write_reports_csv(out / REPORTS_CSV, reports)
    return release, SetPhantoms(seed, count, size)


FINDING_COLORS = {
    f: c
    for f, c in zip(
        FINDINGS,
        ((255, 200, 0), (255, 64, 64), (64, 160, 255), (220, 80, 255), (255, 128, 0), (0, 230, 230), (0, 220, 120)),
        strict=True,
    )
}
"""Colour of each finding on contact sheets."""


def phantom_contact_sheet(
    phantoms: Iterable[Phantom], titles: list[str], ncols: int = 4, tile_size: int = 320
) -> np.ndarray:
    """Each phantom with its lesion masks outlined in their finding's colour, and a legend."""
    from monailabel_xflow.rendering import contact_sheet, overlay

    tiles = []
    for ph in phantoms:
        masks = [les.mask for les in ph.lesions]
        colors = [FINDING_COLORS[les.finding] for les in ph.lesions]
        tiles.append(overlay(ph.image, masks, colors=colors, outline=True, alpha=0.12))
    return contact_sheet(tiles, titles, ncols=ncols, tile_size=tile_size, legend=list(FINDING_COLORS.items()))
