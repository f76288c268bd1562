"""The MIMIC-ILS pipeline over many studies: stages, Algorithm 1, pairs, and the files written.

Layout of ``OUT`` (the phantom exporter's, so ``mimic-ils:OUT/ground-truth/mimic_ils.json``,
``xflow eval`` and ``xflow build`` read it unchanged, lung boxes included)::

    OUT/ground-truth/mimic_ils.json               MIMIC-ILS release JSON (splits -> studies -> pairs)
    OUT/ground-truth/lesion_mask/<study>/*.png    8-bit 0/255 masks (``seg_mask_path`` relative here)
    OUT/ground-truth/anatomy/<study>.png          label map: 1..8 zones (``ALL_ZONES`` order), 9 heart
    OUT/review/pairs.csv                          one row per pair, blank ``verdict``/``comment``
    OUT/review/findings.csv                       one row per reported finding: reported, grounded,
                                                  the box conditions, why no mask
    OUT/review/studies.csv                        one row per study: CTR, QC, counts
    OUT/summary.json                              counts and recall per finding
    OUT/work/studies/<study>.json                 one finished study (resume: done when made from the
                                                  same inputs, :func:`input_key`, without an error)

``image_path`` in the JSON is relative to ``OUT`` (the reader's fallback root).

Work is done per study by :func:`process_study` (pure: same inputs, same bytes), run in this
process, in a process pool (``workers``), or on a Dask cluster (``scheduler``); :func:`merge`
writes the JSON and sheets from whatever studies are finished, in study order, so every way of
running gives the same files. ``shard=(i, n)`` takes every n-th study from the i-th.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from monailabel_xflow.data.export import GT_DIR, JSON_NAME, MASK_DIR
from monailabel_xflow.data.mimic_ils import ReportedFinding
from monailabel_xflow.errors import InputError
from monailabel_xflow.ils import masks as alg
from monailabel_xflow.ils import pairs as rules
from monailabel_xflow.ils.stages import EXCLUDED_DETECTOR_LABELS, StageError, Stages, StudyImage, load_stages
from monailabel_xflow.vocabulary import ALL_ZONES, HEART

SPLITS = ("train", "val", "test")
WORK_DIR = "work/studies"
REVIEW_DIR = "review"


class PipelineError(InputError):
    """Bad pipeline input (unreadable image, unknown split, bad shard)."""


@dataclass(frozen=True)
class StudyInput:
    """One study: its frontal image and its structured report.

    Attributes:
        study: study id (unique; keys the JSON, names files).
        image: path of the frontal radiograph (PNG, JPEG or DICOM).
        findings: the report's findings (:func:`monailabel_xflow.ils.report.structure_report`).
        split: ``train`` | ``val`` | ``test``.
        subject_id: patient id, copied to the JSON.
        section_name, section_content: the report section the findings come from.
    """

    study: str
    image: Path
    findings: tuple[ReportedFinding, ...]
    split: str = "train"
    subject_id: str = ""
    section_name: str = ""
    section_content: str = ""


@dataclass(frozen=True)
class PipelineConfig:
    """What every worker needs to process a study (plain data, so it pickles to any worker).

    Attributes:
        out: the output folder.
        stages: stage configuration (:func:`~monailabel_xflow.ils.stages.load_stages`): a
            mapping, a YAML path, or None for the phantom stages.
        images_root: the images' folder (enables the phantom stages on a phantom set).
        thresholds: Algorithm 1's thresholds.
    """

    out: Path
    stages: Any = None
    images_root: Path | None = None
    thresholds: alg.Thresholds = alg.DEFAULT_THRESHOLDS
    refine: alg.RefineParams = field(default_factory=alg.RefineParams)


_STAGES: dict[str, Stages] = {}  # per worker process: stages are built once, then reused


def _stages_for(config: PipelineConfig) -> Stages:
    key = repr((config.stages, str(config.images_root)))
    if key not in _STAGES:
        _STAGES.clear()
        _STAGES[key] = load_stages(config.stages, config.images_root)
    return _STAGES[key]


def read_image(path: Path) -> np.ndarray:
    """The radiograph as uint8 ``(H, W)`` (the 8-bit ``x`` of the paper).

    8-bit grey PNG/JPEG files are taken as they are; anything else (DICOM, 16-bit, colour,
    NIfTI) goes through ``transforms.load_cxr`` (which imports MONAI: seconds per process) and
    is rounded to 8 bits. DICOMs are not histogram-equalised, as the paper requires.

    Raises:
        PipelineError: the file cannot be read as a radiograph.
    """
    path = Path(path)
    if path.suffix.lower() in (".png", ".jpg", ".jpeg"):
        try:
            with Image.open(path) as im:
                if im.mode == "L":
                    return np.asarray(im, dtype=np.uint8).copy()
        except OSError as err:
            raise PipelineError(f"{path}: cannot read the image: {err}") from err
    from monailabel_xflow.transforms import CXRLoadError, load_cxr

    try:
        image, _ = load_cxr(path)
    except CXRLoadError as err:
        raise PipelineError(f"{path}: {err}") from err
    return np.round(np.clip(image, 0, 1) * 255).astype(np.uint8)


def _anatomy_label(masks: Mapping[str, np.ndarray], heart: np.ndarray) -> np.ndarray:
    label = np.zeros(heart.shape, np.uint8)
    for k, zone in enumerate(ALL_ZONES):
        if zone in masks:
            label[masks[zone]] = k + 1
    label[heart] = 9
    return label


def _png_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def _write(path: Path, data: bytes) -> None:
    """Write atomically (a crash leaves no half file that a resume would trust)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


class _Timer:
    """Adds the seconds spent in each named step to a dict (the benchmark's per-stage figures)."""

    def __init__(self, into: dict[str, float] | None) -> None:
        self.into = into

    def __call__(self, name: str):
        import contextlib
        import time

        @contextlib.contextmanager
        def timed():
            t0 = time.perf_counter()
            yield
            if self.into is not None:
                self.into[name] = self.into.get(name, 0.0) + time.perf_counter() - t0

        return timed()


def analyse_study(
    inp: StudyInput,
    stages: Stages,
    thresholds: alg.Thresholds = alg.DEFAULT_THRESHOLDS,
    refine_params: alg.RefineParams = alg.RefineParams(),
    pixels: np.ndarray | None = None,
    timings: dict[str, float] | None = None,
) -> dict:
    """Run the stages, Algorithm 1 and the pair rules on one study, writing nothing.

    Args:
        timings: when given, seconds per step are added to it (``read``, ``anatomy``,
            ``healthy``, ``locations``, ``detector``, ``algorithm1``, ``pairs``).

    Returns:
        ``{"image", "organs", "location_masks", "outcomes", "pairs", "ctr", "qc", "detections"}``.
    """
    timed = _Timer(timings)
    with timed("read"):
        x = read_image(inp.image) if pixels is None else pixels
    image = StudyImage(inp.study, Path(inp.image), x)
    with timed("anatomy"):
        organs = stages.anatomy.organs(image)
    with timed("healthy"):
        x_hat = np.asarray(stages.healthy.healthy(image, organs.edit_region()))
    if x_hat.shape != x.shape:
        raise StageError(f"stage 'healthy' returned {x_hat.shape} for a {x.shape} image")
    x_ano = alg.anomaly_image(x, x_hat.astype(np.uint8))
    wanted = set(rules.LUNG_LABELS) | {HEART}
    for f in inp.findings:
        wanted.update(rules.reported_labels(f))
    with timed("locations"):
        loc = stages.locations.location_masks(image, x_hat, sorted(wanted))
    loc = {k: np.asarray(v, bool) for k, v in loc.items()}
    with timed("detector"):
        detections = [d for d in stages.detector.detect(image) if d.label.lower() not in EXCLUDED_DETECTOR_LABELS]
    with timed("pairs"):
        qc = rules.anatomy_disagreement({**organs.lungs(), HEART: organs.heart}, loc)
        ratio = rules.ctr(organs.right_lung, organs.left_lung, organs.heart)
    outcomes = []
    for f in inp.findings:
        o = rules.FindingOutcome(f, rules.reported_labels(f) if f.finding else ())
        if not f.present or f.finding is None:
            o.reason = "absent" if not f.present else "not one of the seven findings"
        elif f.finding == "cardiomegaly":
            if f.tentative:
                o.reason = "tentative cardiomegaly"
            else:
                o.mask, o.grounded = organs.heart, (HEART,)
        else:
            missing = [lab for lab in o.reported if lab not in loc]
            reported_masks = [loc[lab] for lab in o.reported if lab in loc]
            with timed("algorithm1"):
                o.result = alg.lesion_mask(
                    f.finding,
                    x,
                    x_ano,
                    reported_masks,
                    detections,
                    organs.right_lung,
                    organs.left_lung,
                    thresholds,
                    refine_params,
                )
            if o.result.generated:
                o.mask = o.result.mask
                o.grounded = rules.grounded_labels(o.reported, loc, o.mask)
            o.reason = o.result.why_not() + (f"; no anatomy mask for {missing}" if missing else "")
        outcomes.append(o)
    with timed("pairs"):
        rng = np.random.default_rng(zlib.crc32(inp.study.encode()))
        pairs = rules.study_pairs(inp.study, outcomes, loc, organs.heart, ratio, rng)
    return {
        "image": x,
        "organs": organs,
        "location_masks": loc,
        "outcomes": outcomes,
        "pairs": pairs,
        "ctr": ratio,
        "qc": qc,
        "detections": detections,
    }


def input_key(inp: StudyInput, config: PipelineConfig) -> str:
    """What a study's record is made from, as a short hash: its row (split, report section and
    findings, ids), its image file (path, size, modification time) and the settings that change
    its masks (stages, thresholds). A record made from other inputs is redone on resume and left
    out of the release until it is: a study moved to another split, an edited report, changed
    thresholds or another run's folder are never merged stale."""
    import dataclasses
    import hashlib

    image = Path(inp.image)
    try:
        st = image.stat()
        file: list[Any] = [str(image), st.st_size, st.st_mtime_ns]
    except OSError:
        file = [str(image)]
    stages = config.stages
    if isinstance(stages, (str, Path)) and Path(stages).is_file():
        stages = [str(stages), Path(stages).read_bytes().hex()]
    payload = {
        "study": dataclasses.asdict(inp),
        "image": file,
        "stages": stages,
        "thresholds": dataclasses.asdict(config.thresholds),
        "refine": dataclasses.asdict(config.refine),
    }
    return hashlib.sha256(json.dumps(payload, default=str, sort_keys=True).encode()).hexdigest()[:16]


def process_study(inp: StudyInput, config: PipelineConfig) -> dict:
    """Process one study and write its masks, anatomy map and result record under ``config.out``.

    Returns:
        The result record (also written to ``work/studies/<study>.json``): the study's JSON
        entry, its review rows and its per-finding outcome, or ``{"study", "error"}`` when the
        image cannot be read (the study is skipped, the error kept for the summary).
    """
    out = Path(config.out)
    record_path = out / WORK_DIR / f"{inp.study}.json"
    key = input_key(inp, config)
    try:
        res = analyse_study(inp, _stages_for(config), config.thresholds, config.refine)
    except PipelineError as err:
        failed: dict[str, Any] = {"study": inp.study, "split": inp.split, "error": str(err), "inputs": key}
        _write(record_path, json.dumps(failed).encode())
        return failed
    pairs: rules.Pairs = res["pairs"]
    qc_ok = not res["qc"]
    if qc_ok:
        for rel, m in sorted(pairs.masks.items()):
            _write(out / GT_DIR / MASK_DIR / rel, _png_bytes(np.where(m, 255, 0).astype(np.uint8)))
        _write(  # by study: two studies' images may share a file name (<study>/frontal.dcm)
            out / GT_DIR / "anatomy" / f"{inp.study}.png",
            _png_bytes(_anatomy_label(res["location_masks"], res["organs"].heart)),
        )
    entry = {
        "subject_id": inp.subject_id,
        "dicom_id": inp.study,  # names the anatomy map (training's lung boxes)
        "image_path": os.path.relpath(Path(inp.image).resolve(), out.resolve()),
        "section_name": inp.section_name,
        "section_content": inp.section_content,
        "instruction_answer_pairs": {
            "positive_pairs": pairs.positive if qc_ok else [],
            "negative_pairs": pairs.negative if qc_ok else [],
        },
    }
    findings = []
    for k, o in enumerate(res["outcomes"]):
        f = o.finding
        checks = o.result.checks if o.result else []
        findings.append(
            {
                "index": k,
                "entity": f.entity,
                "finding": f.finding,
                "present": f.present,
                "tentative": f.tentative,
                "sentence": f.sentence,
                "locations": list(f.locations),
                "reported": list(o.reported),
                "grounded": list(o.grounded),
                "generated": o.mask is not None and f.finding != "cardiomegaly",
                "mask_pixels": int(o.mask.sum()) if o.mask is not None else 0,
                "boxes": len(checks),
                "boxes_kept": len(o.result.kept) if o.result else 0,
                "box_checks": [
                    {
                        "anatomy_iou": round(c.anatomy_iou, 4),
                        "confidence": round(c.confidence, 4),
                        "signal": round(c.signal, 4),
                        "lung_iou": round(c.lung_iou, 4),
                        "failed": c.failed(),
                    }
                    for c in checks
                ],
                "reason": o.reason,
            }
        )
    record: dict[str, Any] = {
        "study": inp.study,
        "split": inp.split,
        "inputs": key,
        "image": str(inp.image),
        "entry": entry,
        "ctr": None if res["ctr"] is None else round(res["ctr"], 4),
        "qc": res["qc"],
        "detections": len(res["detections"]),
        "findings": findings,
    }
    _write(record_path, json.dumps(record).encode())
    return record


def _run_local(todo: Sequence[StudyInput], config: PipelineConfig, workers: int, progress) -> None:
    if workers <= 1:
        for inp in progress(todo):
            process_study(inp, config)
        return
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(process_study, inp, config) for inp in todo]
        for fut in progress(futures):
            fut.result()


def _run_dask(todo: Sequence[StudyInput], config: PipelineConfig, scheduler: Any, progress) -> None:
    """The same :func:`process_study` on a Dask cluster (``scheduler``: an address or a Client)."""
    from distributed import Client, as_completed

    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    try:
        futures = client.map(process_study, list(todo), config=config, pure=False)
        for fut in progress(as_completed(futures)):
            fut.result()
    finally:
        if client is not scheduler:
            client.close()


def run(
    inputs: Sequence[StudyInput],
    config: PipelineConfig,
    *,
    shard: tuple[int, int] = (0, 1),
    workers: int = 1,
    scheduler: Any = None,
    progress: Callable[[Iterable], Iterable] = lambda it: it,
) -> dict:
    """Process the studies not finished yet (this shard's), then :func:`merge` everything finished.

    Args:
        inputs: all studies (the same list on every shard).
        config: output folder, stages, thresholds.
        shard: ``(i, n)``: process studies ``i, i + n, ...`` of ``inputs``.
        workers: local processes (1: this process).
        scheduler: a Dask scheduler address or ``distributed.Client``; overrides ``workers``.
        progress: wraps the iterator of studies (e.g. ``tqdm``).

    Returns:
        The summary (:func:`merge`).

    Raises:
        PipelineError: bad shard, split, or repeated study ids.
        StageError: a stage is not configured (checked before any work).
    """
    i, n = shard
    if n < 1 or not 0 <= i < n:
        raise PipelineError(f"bad shard {i}/{n}: need 0 <= i < n")
    ids = [s.study for s in inputs]
    if len(set(ids)) != len(ids):
        raise PipelineError("study ids repeat: " + ", ".join(sorted({s for s in ids if ids.count(s) > 1})[:5]))
    bad = sorted({s.split for s in inputs} - set(SPLITS))
    if bad:
        raise PipelineError(f"unknown split(s) {bad}; use {', '.join(SPLITS)}")
    _stages_for(config)  # a missing stage fails here, before any work
    out = Path(config.out)
    keys = {s.study: input_key(s, config) for s in inputs}
    finished = _finished(out, keys)  # a failed study is tried again: its image may have been fixed
    todo = [s for k, s in enumerate(inputs) if k % n == i and s.study not in finished]
    if scheduler is not None:
        _run_dask(todo, config, scheduler, progress)
    else:
        _run_local(todo, config, workers, progress)
    return merge(out, [s.study for s in inputs], keys)


def _finished(out: Path, keys: Mapping[str, str]) -> set[str]:
    """The studies of ``keys`` whose record is made from the same inputs and holds no error."""
    done = set()
    for study, key in keys.items():
        path = out / WORK_DIR / f"{study}.json"
        if path.is_file():
            with contextlib.suppress(OSError, ValueError):
                rec = json.loads(path.read_text())
                if rec.get("inputs") == key and not rec.get("error"):
                    done.add(study)
    return done


PAIR_COLUMNS = (
    "study",
    "image",
    "pair_id",
    "type",
    "target",
    "instruction",
    "answer",
    "location",
    "mask",
    "sentence",
    "verdict",
    "comment",
)
FINDING_COLUMNS = (
    "study",
    "index",
    "entity",
    "finding",
    "present",
    "tentative",
    "sentence",
    "reported",
    "grounded",
    "generated",
    "mask_pixels",
    "boxes",
    "boxes_kept",
    "reason",
    "verdict",
    "comment",
)
STUDY_COLUMNS = ("study", "split", "image", "ctr", "qc", "detections", "positive_pairs", "negative_pairs", "error")


def _csv(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("; ".join(map(str, v)) if isinstance(v, (list, tuple)) else v) for k, v in row.items()})
    return buf.getvalue().encode()


def recall_by_finding(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pipeline recall per lung finding: reported present findings that got a mask (Table 8).

    Returns:
        ``{finding: {"reported": n, "generated": k, "recall": k / n}}`` (recall None when n = 0)
        plus ``"mean"`` (the unweighted mean over findings with any report, as the paper's average).
    """
    counts: dict[str, list[int]] = {f: [0, 0] for f in rules.LUNG_FINDINGS}
    for rec in records:
        if rec.get("error") or rec.get("qc"):
            continue
        for f in rec["findings"]:
            if f["present"] and f["finding"] in counts:
                counts[f["finding"]][0] += 1
                counts[f["finding"]][1] += bool(f["generated"])
    out: dict[str, dict[str, Any]] = {
        f: {"reported": n, "generated": k, "recall": k / n if n else None} for f, (n, k) in counts.items()
    }
    seen = [v["recall"] for v in out.values() if v["reported"]]
    out["mean"] = {
        "reported": sum(v["reported"] for v in out.values()),
        "generated": sum(v["generated"] for v in out.values()),
        "recall": float(np.mean(seen)) if seen else None,
    }
    return out


def merge(out: str | Path, order: Sequence[str] | None = None, keys: Mapping[str, str] | None = None) -> dict:
    """Write the MIMIC-ILS JSON, the review sheets and the summary from the finished studies.

    Args:
        out: the output folder.
        order: study ids in the order to write them (default: sorted); unfinished ones are left out.
        keys: each study's :func:`input_key`; a record made from other inputs is left out.

    Returns:
        The summary also written to ``summary.json``.
    """
    out = Path(out)
    work = out / WORK_DIR
    paths = {p.stem: p for p in work.glob("*.json")} if work.is_dir() else {}
    order = [s for s in (order if order is not None else sorted(paths)) if s in paths]
    records = [json.loads(paths[s].read_text()) for s in order]
    if keys is not None:
        records = [r for r in records if r.get("inputs") == keys.get(r["study"])]
    release: dict[str, dict] = {s: {} for s in SPLITS}
    pair_rows, finding_rows, study_rows = [], [], []
    for rec in records:
        row = {
            "study": rec["study"],
            "split": rec["split"],
            "image": rec.get("image", ""),
            "error": rec.get("error", ""),
        }
        if rec.get("error"):
            study_rows.append(row)
            continue
        entry = rec["entry"]
        pairs = entry["instruction_answer_pairs"]
        if not rec["qc"]:
            release[rec["split"]][rec["study"]] = entry
        study_rows.append(
            {
                **row,
                "ctr": rec["ctr"],
                "qc": rec["qc"] or "pass",
                "detections": rec["detections"],
                "positive_pairs": len(pairs["positive_pairs"]),
                "negative_pairs": len(pairs["negative_pairs"]),
            }
        )
        for pair in pairs["positive_pairs"] + pairs["negative_pairs"]:
            pair_rows.append(
                {
                    "study": rec["study"],
                    "image": entry["image_path"],
                    "mask": pair["seg_mask_path"] or "",
                    "sentence": pair["sent_idx"],
                    **{k: pair[k] for k in ("pair_id", "type", "target", "instruction", "answer", "location")},
                }
            )
        for f in rec["findings"]:
            finding_rows.append({"study": rec["study"], **f})
    gt = out / GT_DIR
    _write(gt / JSON_NAME, json.dumps(release, indent=1).encode())
    _write(out / REVIEW_DIR / "pairs.csv", _csv(pair_rows, PAIR_COLUMNS))
    _write(out / REVIEW_DIR / "findings.csv", _csv(finding_rows, FINDING_COLUMNS))
    _write(out / REVIEW_DIR / "studies.csv", _csv(study_rows, STUDY_COLUMNS))
    n_pos = sum(len(e["instruction_answer_pairs"]["positive_pairs"]) for s in release.values() for e in s.values())
    n_neg = sum(len(e["instruction_answer_pairs"]["negative_pairs"]) for s in release.values() for e in s.values())
    summary = {
        "studies": len(records),
        "written": sum(len(s) for s in release.values()),
        "qc_dropped": sum(1 for r in records if not r.get("error") and r["qc"]),
        "errors": sum(1 for r in records if r.get("error")),
        "failed": {r["study"]: r["error"] for r in records if r.get("error")},
        "positive_pairs": n_pos,
        "negative_pairs": n_neg,
        "recall": recall_by_finding(records),
    }
    _write(out / "summary.json", json.dumps(summary, indent=1).encode())
    return summary


# --- inputs from a report table ------------------------------------------------------------

REPORT_COLUMNS = {
    "study": ("study_id", "study"),
    "image": ("image", "image_path", "path"),
    "report": ("report", "report_text", "text"),
}
"""Accepted column names of a reports CSV (first found wins); ``split`` and ``subject_id`` optional."""


def _column(fields: Sequence[str], key: str, table: Path) -> str | None:
    found = next((c for c in REPORT_COLUMNS[key] if c in fields), None)
    if found is None and key != "study":
        raise PipelineError(
            f"{table}: no {key} column (one of {', '.join(REPORT_COLUMNS[key])}); has {', '.join(fields)}"
        )
    return found


MAX_REPORT_CHARS = 20_000
"""Longest report read (a radiology report is a few thousand characters; structuring a 125 kB one
took minutes)."""
_SWALLOWED_ROW = re.compile(r"\n[^,\n\"]{1,80},[^,\n\"]+\.(?:png|jpe?g|dcm|nii(?:\.gz)?)\s*,", re.IGNORECASE)


def read_reports(
    table: str | Path,
    images_root: str | Path,
    structure: Callable[[str], Sequence[ReportedFinding]],
    choose: Callable[[str], Any] | None = None,
    default_split: str = "train",
) -> tuple[list[StudyInput], list[str]]:
    """Studies of a reports CSV, each report structured into findings.

    Args:
        table: CSV with a study id (``study_id``), image path (``image``, relative to
            ``images_root``, or absolute) and report text (``report``) column (aliases in
            :data:`REPORT_COLUMNS`); optional ``split`` and ``subject_id``. One image per study:
            later rows of a study already read are skipped.
        images_root: folder the image paths are relative to.
        structure: section text -> findings (the structurer); a ``ValueError`` (e.g.
            ``ReportStructuringError``) skips the study with that reason.
        choose: report text -> the section to structure (:func:`monailabel_xflow.ils.report.choose_section`):
            an object with ``name`` and ``text``, or a ``(name, text)`` pair; ``None`` or a
            ``ValueError`` (``SectionNotFound``) when the report has none, and the study is skipped
            with that reason. None: the whole text, named "report".
        default_split: split of rows without a ``split`` cell.

    Returns:
        ``(studies, skipped)``: ``skipped`` has one line per row left out, naming it and why.

    Raises:
        PipelineError: the table cannot be read or lacks a column.
    """
    table, images_root = Path(table), Path(images_root)
    csv.field_size_limit(max(csv.field_size_limit(), 16 << 20))  # an over-long report is one row's problem
    try:
        with table.open(newline="", encoding="utf-8-sig") as handle:
            reader = csv.DictReader(handle)
            fields = list(reader.fieldnames or ())
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise PipelineError(f"cannot read {table}: {err}") from err
    study_col, image_col, report_col = (_column(fields, k, table) for k in ("study", "image", "report"))
    studies: list[StudyInput] = []
    skipped: list[str] = []
    seen: dict[str, str] = {}  # file-safe id -> the study id that took it
    for line, row in enumerate(rows, start=2):
        image_rel = (row.get(image_col) or "").strip()
        study = (row.get(study_col) or "").strip() if study_col else Path(image_rel).stem
        where = f"{table.name} line {line} ({study or '?'})"
        if not study:
            skipped.append(f"{where}: no study id")
            continue
        taken = seen.get(safe_study_id(study))
        if taken == study:
            skipped.append(
                f"{where}: the study already has an image (one frontal image per study; list the frontal one first)"
            )
            continue
        if taken is not None:
            skipped.append(
                f"{where}: study id {study!r} names the same files as {taken!r} ({safe_study_id(study)!r}); "
                "make the ids differ in letters or digits"
            )
            continue
        image = images_root / image_rel
        if not image_rel or not image.is_file():
            skipped.append(f"{where}: image {image_rel!r} not found under {images_root}")
            continue
        text = row.get(report_col) or ""
        if len(text) > MAX_REPORT_CHARS:
            skipped.append(f"{where}: report of {len(text):,} characters; at most {MAX_REPORT_CHARS:,} are read")
            continue
        swallowed = _SWALLOWED_ROW.search(text)
        if swallowed:  # an unclosed quote runs the cell on into the next rows
            skipped.append(
                f"{where}: the report holds what looks like another row ({swallowed.group(0).strip()!r}): "
                "an unclosed quote? Rows after it were read into this report"
            )
            continue
        try:
            section = ("report", text) if choose is None else choose(text)
        except ValueError as err:
            skipped.append(f"{where}: {err}")
            continue
        if section is not None and not isinstance(section, tuple):
            section = (section.name, section.text)
        if not section or not str(section[1]).strip():
            skipped.append(f"{where}: no findings, impression or last paragraph to structure")
            continue
        name, content = section[0], section[1]
        split = (row.get("split") or "").strip() or default_split
        try:
            findings = tuple(structure(content))
        except ValueError as err:  # e.g. an LLM structurer's answer that failed validation
            skipped.append(f"{where}: the report could not be structured: {err}")
            continue
        seen[safe_study_id(study)] = study
        studies.append(
            StudyInput(
                safe_study_id(study),
                image,
                findings,
                split,
                (row.get("subject_id") or "").strip(),
                str(name),
                str(content),
            )
        )
    return studies, skipped


def safe_study_id(text: str) -> str:
    """A study id usable as a file name (:func:`monailabel_xflow.data.readers.safe_case_id`)."""
    from monailabel_xflow.data.readers import safe_case_id

    return safe_case_id(text)
