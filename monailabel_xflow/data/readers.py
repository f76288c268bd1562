"""Evaluation-set readers: MIMIC-ILS, CheXlocalize and a plain folder format.

Every reader yields :class:`EvalCase` objects, one per question (image + instruction), and never
stops half-way on a bad entry: problems are collected in :attr:`ReadResult.problems` (each names
the entry) and the entry is left out; with ``strict=True`` the reader raises
:class:`DatasetError` listing them all instead.

Dataset specs understood by :func:`read_dataset` (and ``xflow eval --dataset``):

``mimic-ils:JSON[:ROOT]``
    MIMIC-ILS release JSON ``{"train"|"val"|"test": {study: {subject_id, dicom_id, image_path,
    ..., instruction_answer_pairs: {positive_pairs, negative_pairs}}}}``. ``image_path`` is
    relative to ``ROOT`` (a local MIMIC-CXR-JPG root; default: the JSON's folder, falling back to
    the folder above it, which is the phantom exporter's layout). Masks are read from
    ``lesion_mask/`` next to the JSON (``seg_mask_path`` is relative to it). One split is read
    (default ``test``); by default only ``basic`` and ``global`` questions (the XFlow evaluation),
    ``lesion_inference`` on request. Case id: ``pair_id`` (prefixed with the study key unless it
    already starts with it).
``chexlocalize:JSON:IMAGE_ROOT``
    CheXlocalize radiologist annotations: ``{image_id: {pathology: COCO RLE}}``. The six
    pathologies shared with XFlow are mapped (:data:`CHEXLOCALIZE_FINDINGS`), the others skipped;
    every question is chest level ("Segment the edema."); an RLE with no foreground is a negative.
    Images are looked up as ``IMAGE_ROOT/<image_id>.jpg`` or, CheXpert style,
    ``IMAGE_ROOT/patientX/studyY/viewZ_frontal.jpg`` for image id
    ``patientX_studyY_viewZ_frontal`` (``.png`` also accepted). Case id: ``<image_id>_<finding>``.
``folder:DIR``
    A user's own data: ``DIR/instructions.csv`` with columns ``image,mask,instruction`` (paths
    relative to ``DIR``; an empty ``mask`` cell = negative; masks are PNG, non-zero = lesion, at
    most :data:`MASK_MAX_LEVELS` grey levels) and
    an optional ``case_id`` column. Default case id: ``<image stem>__<instruction slug>``, e.g.
    ``img01__effusion_in_the_left_lung``.

Images may lie anywhere (a release rarely holds its images; the ILS pipeline writes paths such as
``../images/x.png``), but a ground-truth mask path stays inside its folder (``lesion_mask/``,
``DIR``) and a CheXlocalize image id inside ``IMAGE_ROOT``: a path that leads out (``..``, an
absolute path elsewhere) is a problem naming the entry, never read (links inside the folder are
followed).

Case ids are used as file names (``<case_id>.png``), so characters outside ``[A-Za-z0-9._-]``
are replaced by ``_``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow import rle as rle_codec
from monailabel_xflow.errors import InputError
from monailabel_xflow.instructions import Instruction, InstructionError, parse_instruction

__all__ = [
    "DatasetError",
    "EvalCase",
    "ReadResult",
    "CHEXLOCALIZE_FINDINGS",
    "read_mask_png",
    "read_mimic_ils",
    "read_chexlocalize",
    "read_folder",
    "read_dataset",
    "safe_case_id",
]

CHEXLOCALIZE_FINDINGS: dict[str, str] = {
    "Airspace Opacity": "opacity",
    "Atelectasis": "atelectasis",
    "Cardiomegaly": "cardiomegaly",
    "Consolidation": "consolidation",
    "Edema": "edema",
    "Pleural Effusion": "effusion",
}
"""CheXlocalize pathology name -> XFlow finding, for the six findings the two share."""

MIMIC_ILS_MASK_DIR = "lesion_mask"
MIMIC_ILS_KINDS = ("basic", "global", "lesion_inference")
FOLDER_CSV = "instructions.csv"
_IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class DatasetError(InputError):
    """A dataset that cannot be read (missing file, bad spec) or, with ``strict``, has problems."""


def safe_case_id(text: str) -> str:
    """A case id usable as a file name: characters outside ``[A-Za-z0-9._-]`` become ``_``."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(text)).strip("._") or "case"


def _inside(root: Path, rel: Any, what: str) -> Path:
    """``root / rel`` for a path (relative to ``root``, or absolute) that stays inside ``root``,
    read lexically, so links inside the dataset still work.

    Raises:
        DatasetError: ``rel`` is not text, or leads out of ``root`` (``..``, an absolute path
            elsewhere).
    """
    if not isinstance(rel, str) or not rel:
        raise DatasetError(f"{what} must be a non-empty path, got {rel!r}")
    norm = os.path.normpath(os.path.join(root, rel))  # an absolute rel stays itself
    base = os.path.normpath(root)
    if os.path.commonpath([os.path.abspath(norm), os.path.abspath(base)]) != os.path.abspath(base):
        raise DatasetError(f"{what} {rel!r} is not inside {root}")
    return Path(norm)


MASK_MAX_LEVELS = 16
"""A mask PNG with more grey levels than this is refused as an image, not a mask (label maps with
a few values are masks: non-zero = lesion)."""


def read_mask_png(path: str | Path) -> np.ndarray:
    """Read a mask image; returns bool (H, W), True where any channel is non-zero.

    Raises:
        DatasetError: the file cannot be read as an image.
    """
    from PIL import Image

    try:
        with Image.open(path) as im:
            arr = np.asarray(im)
    except (OSError, ValueError) as err:
        raise DatasetError(f"cannot read mask {path}: {err}") from err
    if arr.ndim == 3:  # RGB(A) masks: any colour channel counts, alpha does not
        arr = arr[..., :3].max(axis=-1) if arr.shape[-1] in (3, 4) else arr.max(axis=-1)
    levels = len(np.unique(arr))
    if levels > MASK_MAX_LEVELS:  # e.g. the image and mask columns swapped
        raise DatasetError(f"mask {path} has {levels} grey levels, so it looks like an image, not a mask")
    return arr > 0


@dataclass(frozen=True)
class EvalCase:
    """One evaluation question.

    Attributes:
        case_id: unique, file-name safe id (predictions are saved as ``<case_id>.png``).
        image_path: the radiograph.
        instruction: the question asked (its :attr:`level` and :attr:`finding` are read from it).
        positive: the finding is present at the asked location (a GT mask exists).
        mask_path: PNG of the GT mask (positives of MIMIC-ILS / folder sets).
        mask_loader: callable returning the GT mask (e.g. decoding an RLE); used when there is no
            ``mask_path``.
        meta: extra identifiers (``study``, ``subject_id``, ``source`` ...), not compared.
        truth_id: what identifies a ``mask_loader``'s mask (e.g. a hash of its RLE), so that a
            resumed evaluation notices a corrected one; files are identified by their stat.
    """

    case_id: str
    image_path: Path
    instruction: Instruction
    positive: bool
    mask_path: Path | None = None
    mask_loader: Callable[[], np.ndarray] | None = field(default=None, compare=False, repr=False)
    meta: dict[str, Any] = field(default_factory=dict, compare=False)
    truth_id: str = field(default="", compare=False)

    @property
    def level(self) -> str:
        """``chest`` | ``lung`` | ``zone``."""
        return self.instruction.level

    @property
    def finding(self) -> str:
        """One of the seven findings."""
        return self.instruction.finding

    def load_mask(self) -> np.ndarray | None:
        """The GT mask as bool (H, W) at its stored resolution, or ``None`` for a negative."""
        if self.mask_path is not None:
            return read_mask_png(self.mask_path)
        if self.mask_loader is not None:
            return np.asarray(self.mask_loader(), dtype=bool)
        return None


@dataclass
class ReadResult:
    """What a reader found.

    Attributes:
        cases: the valid cases, in file order.
        problems: one line per entry left out, naming it and why.
        skipped: entries left out on purpose (e.g. non-shared pathologies), by reason, counted.
    """

    cases: list[EvalCase]
    problems: list[str] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def finish(self, source: str, strict: bool) -> ReadResult:
        ids: dict[str, int] = {}
        for case in self.cases:
            ids[case.case_id] = ids.get(case.case_id, 0) + 1
        duplicates = sorted(i for i, n in ids.items() if n > 1)
        if duplicates:
            self.problems.append(f"duplicate case ids (all copies dropped): {', '.join(duplicates[:10])}")
            self.cases = [c for c in self.cases if ids[c.case_id] == 1]
        if strict and self.problems:
            raise DatasetError(_problem_text(source, self.problems))
        return self


def _problem_text(source: str, problems: Sequence[str], limit: int = 25) -> str:
    shown = "\n  ".join(problems[:limit])
    more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
    return f"{source}: {len(problems)} problem(s):\n  {shown}{more}"


def _load_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise DatasetError(f"cannot read {path}: {err}") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError(f"{path} is not valid UTF-8 JSON: {err}") from err


# --- MIMIC-ILS ---------------------------------------------------------------------------------


def read_mimic_ils(
    json_path: str | Path,
    image_root: str | Path | None = None,
    *,
    split: str = "test",
    mask_root: str | Path | None = None,
    kinds: Iterable[str] = ("basic", "global"),
    strict: bool = False,
) -> ReadResult:
    """Read one split of a MIMIC-ILS release JSON (format in the module docstring).

    Args:
        json_path: the release JSON.
        image_root: root ``image_path`` is relative to (default: the JSON's folder, then the one
            above it).
        split: ``train`` | ``val`` | ``test``.
        mask_root: folder ``seg_mask_path`` is relative to (default ``<json folder>/lesion_mask``).
        kinds: instruction types to keep.
        strict: raise :class:`DatasetError` on any problem instead of collecting it.

    Raises:
        DatasetError: unreadable JSON, unknown split, or (``strict``) any problem.
    """
    json_path = Path(json_path)
    data = _load_json(json_path)
    if not isinstance(data, dict):
        raise DatasetError(
            f"{json_path}: expected an object keyed by split (train/val/test), got {type(data).__name__}"
        )
    if split not in data:
        raise DatasetError(f"{json_path}: no split {split!r} (has {sorted(data)})")
    if not isinstance(data[split], dict):
        raise DatasetError(
            f"{json_path}: split {split!r} must be an object keyed by study, got {type(data[split]).__name__}"
        )
    roots = [Path(image_root)] if image_root is not None else [json_path.parent, json_path.parent.parent]
    mask_root = Path(mask_root) if mask_root is not None else json_path.parent / MIMIC_ILS_MASK_DIR
    kinds = set(kinds)
    result = ReadResult([])
    for study, entry in data[split].items():
        where = f"study {study}"
        if not isinstance(entry, dict) or "image_path" not in entry or "instruction_answer_pairs" not in entry:
            result.problems.append(f"{where}: needs image_path and instruction_answer_pairs")
            continue
        if not isinstance(entry["image_path"], str) or not entry["image_path"]:
            result.problems.append(f"{where}: image_path must be a non-empty path, got {entry['image_path']!r}")
            continue
        image = next((r / entry["image_path"] for r in roots if (r / entry["image_path"]).is_file()), None)
        if image is None:
            result.problems.append(
                f"{where}: image {entry['image_path']!r} not found under {', '.join(map(str, roots))}"
            )
            continue
        pairs = entry["instruction_answer_pairs"]
        if not isinstance(pairs, dict):
            result.problems.append(f"{where}: instruction_answer_pairs must be an object")
            continue
        for positive, key in ((True, "positive_pairs"), (False, "negative_pairs")):
            listed = pairs.get(key) or []
            if not isinstance(listed, list):
                result.problems.append(f"{where}: {key} must be a list")
                continue
            for n, pair in enumerate(listed):
                if not isinstance(pair, dict):
                    result.problems.append(f"{where} {key}[{n}]: a pair must be an object")
                    continue
                case = _mimic_case(pair, positive, study, entry, image, mask_root, kinds, result, f"{where} {key}[{n}]")
                if case is not None:
                    result.cases.append(case)
    return result.finish(str(json_path), strict)


def _mimic_case(pair, positive, study, entry, image, mask_root, kinds, result, where) -> EvalCase | None:
    kind = pair.get("type")
    if kind not in MIMIC_ILS_KINDS:  # "Global", "basic ", missing: a typo, not a choice
        result.problems.append(f"{where}: type {kind!r} is none of {', '.join(MIMIC_ILS_KINDS)}")
        return None
    if kind not in kinds:
        result.skip(f"type {kind}")
        return None
    try:
        ins = parse_instruction(pair["instruction"])
    except (KeyError, InstructionError) as err:
        result.problems.append(f"{where}: bad instruction: {err}")
        return None
    if ins.kind != kind:
        result.problems.append(f"{where}: instruction {pair['instruction']!r} reads as {ins.kind}, pair says {kind}")
        return None
    mask_path = None
    if positive:
        seg = pair.get("seg", True)
        if not seg or (isinstance(seg, str) and seg.strip().lower() in ("false", "no", "0")):  # "false" is text
            result.skip("positive without mask (seg false)")
            return None
        rel = pair.get("seg_mask_path")
        if not rel:
            result.problems.append(f"{where}: positive pair without seg_mask_path")
            return None
        try:
            mask_path = _inside(mask_root, rel, "seg_mask_path")
        except DatasetError as err:
            result.problems.append(f"{where}: {err}")
            return None
        if not mask_path.is_file():
            result.problems.append(f"{where}: mask {mask_path} not found")
            return None
    pair_id = str(pair["pair_id"]) if pair.get("pair_id") not in (None, "") else where  # 0 is an id
    case_id = safe_case_id(pair_id if pair_id.startswith(study) else f"{study}_{pair_id}")
    meta = {
        "source": "mimic-ils",
        "study": study,
        "subject_id": str(entry.get("subject_id", "")),
        "dicom_id": entry.get("dicom_id"),
        "target": pair.get("target"),
        "pair_id": pair_id,
    }
    return EvalCase(case_id, image, ins, positive, mask_path, None, meta)


# --- CheXlocalize ------------------------------------------------------------------------------


def _chexlocalize_image(root: Path, image_id: str) -> Path | None:
    parts = image_id.split("_")
    candidates = [root / image_id]
    if len(parts) >= 3 and parts[0].startswith("patient") and parts[1].startswith("study"):
        candidates.append(root / parts[0] / parts[1] / "_".join(parts[2:]))
    for base in candidates:
        for suffix in _IMAGE_SUFFIXES:
            path = base.with_name(base.name + suffix)
            if path.is_file():
                return path
    return None


def read_chexlocalize(json_path: str | Path, image_root: str | Path, *, strict: bool = False) -> ReadResult:
    """Read CheXlocalize ground-truth segmentations (format in the module docstring).

    Args:
        json_path: ``{image_id: {pathology: {"size": [H, W], "counts": ...}}}``.
        image_root: folder holding the images.
        strict: raise :class:`DatasetError` on any problem instead of collecting it.
    """
    json_path, image_root = Path(json_path), Path(image_root)
    data = _load_json(json_path)
    if not isinstance(data, dict):
        raise DatasetError(f"{json_path}: expected an object keyed by image id")
    result = ReadResult([])
    for image_id, by_pathology in data.items():
        if not isinstance(by_pathology, dict):
            result.problems.append(f"image {image_id}: expected an object keyed by pathology")
            continue
        try:
            _inside(image_root, image_id, "image id")
        except DatasetError as err:
            result.problems.append(f"image {image_id}: {err}")
            continue
        image = _chexlocalize_image(image_root, image_id)
        if image is None:
            result.problems.append(f"image {image_id}: not found under {image_root}")
            continue
        for pathology, encoded in by_pathology.items():
            finding = CHEXLOCALIZE_FINDINGS.get(pathology)
            if finding is None:
                result.skip(f"pathology {pathology}")
                continue
            try:
                rle_codec.validate(encoded)
                positive = rle_codec.area(encoded) > 0
            except rle_codec.RLEError as err:
                result.problems.append(f"image {image_id}, {pathology}: bad RLE: {err}")
                continue
            ins = Instruction(finding, (), "global")
            loader = (lambda e=encoded: rle_codec.decode(e)) if positive else None
            result.cases.append(
                EvalCase(
                    safe_case_id(f"{image_id}_{finding}"),
                    image,
                    ins,
                    positive,
                    None,
                    loader,
                    {
                        "source": "chexlocalize",
                        "image_id": image_id,
                        "pathology": pathology,
                        "subject_id": image_id.split("_")[0],
                    },
                    hashlib.sha256(json.dumps(encoded, sort_keys=True).encode()).hexdigest()[:16],
                )
            )
    return result.finish(str(json_path), strict)


# --- folder ------------------------------------------------------------------------------------


def _slug(ins: Instruction) -> str:
    text = ins.text.lower().removeprefix("segment the ").rstrip(".")
    return re.sub(r"[^a-z0-9]+", "_", text).strip("_")


def read_folder(folder: str | Path, *, strict: bool = False) -> ReadResult:
    """Read ``DIR/instructions.csv`` (``image,mask,instruction[,case_id]``; format above).

    Raises:
        DatasetError: missing CSV or columns, or (``strict``) any problem.
    """
    folder = Path(folder)
    table = folder / FOLDER_CSV
    if not table.is_file():
        raise DatasetError(f"{folder}: no {FOLDER_CSV} (columns image,mask,instruction)")
    result = ReadResult([])
    try:
        _read_folder_rows(folder, table, result)
    except UnicodeDecodeError as err:
        raise DatasetError(f"{table} is not UTF-8 ({err.reason} at byte {err.start}): save it as UTF-8") from err
    return result.finish(str(table), strict)


def _read_folder_rows(folder: Path, table: Path, result: ReadResult) -> None:
    with table.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        missing = {"image", "mask", "instruction"} - set(reader.fieldnames or ())
        if missing:
            raise DatasetError(f"{table}: missing column(s) {sorted(missing)}; need image,mask,instruction")
        for line, row in enumerate(reader, start=2):
            where = f"{table.name} line {line}"
            image_rel = (row.get("image") or "").strip()
            mask_rel = (row.get("mask") or "").strip()
            image = folder / image_rel
            try:
                mask = _inside(folder, mask_rel, "mask") if mask_rel else None
            except DatasetError as err:
                result.problems.append(f"{where}: {err}")
                continue
            if not image_rel or not image.is_file():
                result.problems.append(f"{where}: image {image_rel!r} not found")
                continue
            try:
                ins = parse_instruction(row.get("instruction") or "")
            except InstructionError as err:
                result.problems.append(f"{where}: bad instruction: {err}")
                continue
            if mask is not None and not mask.is_file():
                result.problems.append(f"{where}: mask {mask_rel!r} not found")
                continue
            case_id = safe_case_id((row.get("case_id") or "").strip() or f"{Path(image_rel).stem}__{_slug(ins)}")
            result.cases.append(
                EvalCase(case_id, image, ins, mask is not None, mask, None, {"source": "folder", "line": line})
            )


# --- specs -------------------------------------------------------------------------------------

DATASET_SPECS = "mimic-ils:JSON[:ROOT] | chexlocalize:JSON:IMAGE_ROOT | folder:DIR"


def read_dataset(
    spec: str, *, split: str = "test", strict: bool = False, kinds: Iterable[str] = ("basic", "global")
) -> ReadResult:
    """Read a dataset given as ``KIND:ARGS`` (:data:`DATASET_SPECS`; details in the module doc).

    Args:
        spec: e.g. ``mimic-ils:/data/mimic_ils.json:/data/mimic-cxr-jpg``.
        split: MIMIC-ILS split.
        strict: raise on any problem.
        kinds: MIMIC-ILS instruction types to keep.

    Raises:
        DatasetError: unknown kind or wrong number of arguments, and whatever the reader raises.
    """
    kind, _, rest = spec.partition(":")
    args = rest.split(":") if rest else []
    if kind == "mimic-ils" and len(args) in (1, 2):
        return read_mimic_ils(args[0], args[1] if len(args) == 2 else None, split=split, strict=strict, kinds=kinds)
    if kind == "chexlocalize" and len(args) == 2:
        return read_chexlocalize(args[0], args[1], strict=strict)
    if kind == "folder" and len(args) == 1:
        return read_folder(args[0], strict=strict)
    raise DatasetError(f"bad dataset spec {spec!r}; expected {DATASET_SPECS}")
