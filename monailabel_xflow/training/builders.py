"""Data builders: training examples for both policies, from MIMIC-ILS or phantoms alike.

Input is any list of :class:`~monailabel_xflow.data.readers.EvalCase` (the readers of
:mod:`monailabel_xflow.data.readers` turn MIMIC-ILS, CheXlocalize, folders and phantom sets into
them). Output is a Hugging Face ``datasets`` folder per kind, written in chunks so an
interrupted build resumes where it stopped, and sharded (``shard=(i, N)`` takes every N-th case
from the i-th) so N processes or machines build one set together. Rows (images by path):

* ``init-sft``: ``image, prompt, instruction, target, lesion_mask, finding_masks, case_id,
  finding, level, positive`` — ``prompt`` is the question in varied phrasing (each variant parses
  back to the same instruction), ``target`` the Stage 1 protocol text: lung boxes of the lungs
  asked about, presence, one lesion box per ground-truth component; ``finding_masks`` one PNG
  per finding of ``vocabulary.FINDINGS`` with all of the image's lesions of it ("" where it has
  none), gathered from every question about the image (targets of the auxiliary mask loss).
* ``rev-sft``: ``image, instruction, box, view, observations, targets, case_id`` — one
  Algorithm 1 trajectory (the oracle clicker with F_seg in the loop) per ground-truth component;
  ``observations[t]`` is the PNG of :func:`~monailabel_xflow.rendering.render_observation` of
  ``view`` at turn t and ``targets[t]`` the action taken on it, box and clicks in the view's
  coordinates (the whole image unless ``zoom``); ``error_masks[t]`` the PNG of
  :func:`error_map` on that view (what turn t's mask misses and spills; training targets only).
  Discarded trajectories are counted, not kept.
* ``init-rl``: ``image, prompt, instruction, gt_boxes, present, case_id``.
* ``rev-rl``: ``image, instruction, start_box, gt_mask, case_id`` — a starting state per
  component: a perturbed box and the component's mask (PNG).

On-policy revision kinds (``build(..., workflow=XFlow)``, :func:`onpolicy_trajectories`): the
starting boxes and masks are the workflow's own Stage 1 answer to each positive question, one
row per lesion box, revised by the oracle through the workflow's Stage 2 loop; a trajectory whose
clicks gained less than ``policy.oracle.PAYS`` becomes stop-only (issue 35).

Lung boxes come from a :class:`LungBoxes` source: the phantom anatomy label maps, or a JSON file
of boxes produced by any lung segmentation model (the paper used an off-the-shelf one).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.geometry import (
    FULL_VIEW,
    MIN_COMPONENT_PX,
    Box,
    Click,
    box_to_view,
    click_to_view,
    lesion_boxes,
    mask_to_box,
    resize_mask,
    view_pixels,
    zoom_view,
)
from monailabel_xflow.instructions import Instruction, phrasings
from monailabel_xflow.policy.targets import BuildError, init_target, revision_target
from monailabel_xflow.vocabulary import ALL_ZONES, LUNGS, ZONES

logger = logging.getLogger(__name__)

KINDS = ("init-sft", "rev-sft", "init-rl", "rev-rl")


# --- lung boxes -------------------------------------------------------------------------------


class LungBoxes:
    """Where the lung boxes of an image come from.

    Args:
        boxes_json: a JSON file ``{image file name or path: {"right lung": [x1, y1, x2, y2],
            "left lung": [...]}}`` with normalised boxes (e.g. from a lung segmentation model).
        anatomy_dir: a phantom set's ``ground-truth/anatomy`` folder of label maps (1..8 the zones
            in ``ALL_ZONES`` order: 1..4 right, 5..8 left). Used when ``boxes_json`` has no entry.
    """

    def __init__(self, boxes_json: str | Path | None = None, anatomy_dir: str | Path | None = None) -> None:
        self.table: dict[str, dict[str, Box]] = {}
        if boxes_json is not None:
            self.table = _read_lung_boxes(Path(boxes_json))
        self.anatomy_dir = Path(anatomy_dir) if anatomy_dir is not None else None
        self._cache: dict[str, dict[str, Box]] = {}

    @classmethod
    def for_dataset(cls, spec_root: str | Path, boxes_json: str | Path | None = None) -> LungBoxes:
        """Boxes for a dataset folder: its ``ground-truth/anatomy`` if it is a phantom set."""
        anatomy = Path(spec_root) / "ground-truth" / "anatomy"
        return cls(boxes_json, anatomy if anatomy.is_dir() else None)

    @classmethod
    def for_spec(cls, spec: str, boxes_json: str | Path | None = None) -> LungBoxes | None:
        """Boxes for the dataset of ``spec`` (``xflow build --dataset``): ``boxes_json``, and a
        phantom set's anatomy when the spec is the MIMIC-ILS JSON of one (``DIR/ground-truth/``);
        None when there are neither, so that init-sft is refused rather than built empty."""
        kind, _, rest = spec.partition(":")
        root = Path(rest.split(":")[0]).parent.parent if kind == "mimic-ils" and rest else None
        if root is not None and (root / "ground-truth" / "anatomy").is_dir():
            return cls.for_dataset(root, boxes_json)
        return cls(boxes_json) if boxes_json is not None else None

    def __call__(self, image_path: str | Path, name: str | None = None) -> dict[str, Box]:
        """The lung boxes of an image: from the JSON (by path, file name or stem), else from the
        anatomy map ``<name>.png`` (``name``: the MIMIC-ILS ``dicom_id``; default the file stem)."""
        path = Path(image_path)
        for key in (str(path), path.name, path.stem):
            if key in self.table:
                return self.table[key]
        name = name or path.stem
        if name not in self._cache and self.anatomy_dir is not None:
            label_file = self.anatomy_dir / f"{name}.png"
            if label_file.is_file():
                from PIL import Image

                label = np.asarray(Image.open(label_file))
                boxes = {}
                for lung in LUNGS:  # label k + 1 is zone ALL_ZONES[k] (data.export's layout)
                    box = mask_to_box(np.isin(label, [ALL_ZONES.index(z) + 1 for z in ZONES[lung]]))
                    if box is not None:
                        boxes[lung] = box
                self._cache[name] = boxes
        return self._cache.get(name, {})


def _read_lung_boxes(path: Path) -> dict[str, dict[str, Box]]:
    """``{image: {lung: box}}`` from a ``--lung-boxes`` file, every box checked.

    Raises:
        BuildError: not readable JSON of that shape, a lung name XFlow does not know, or a box that
            is not ``[x1, y1, x2, y2]`` normalised with ``0 <= x1 <= x2 <= 1`` (and so for y).
    """
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BuildError(f"--lung-boxes {path}: not readable UTF-8 JSON ({err})") from err
    if not isinstance(raw, dict):
        raise BuildError(f"--lung-boxes {path}: expected {{image: {{lung: [x1, y1, x2, y2]}}}}")
    table: dict[str, dict[str, Box]] = {}
    for image, lungs in raw.items():
        if not isinstance(lungs, dict) or not set(lungs) <= set(LUNGS):
            raise BuildError(f"--lung-boxes {path}: {image!r} must map {' / '.join(LUNGS)} to boxes")
        table[str(image)] = {}
        for lung, box in lungs.items():
            ok = isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)
            if not ok or not (0 <= box[0] <= box[2] <= 1 and 0 <= box[1] <= box[3] <= 1):
                raise BuildError(f"--lung-boxes {path}: {image!r} {lung}: {box!r} is not a normalised xyxy box")
            table[str(image)][lung] = (float(box[0]), float(box[1]), float(box[2]), float(box[3]))
    return table


# --- building -----------------------------------------------------------------------------------


@dataclass
class BuildReport:
    """What a build produced: rows written, cases rejected by reason, chunks reused on resume."""

    kind: str
    rows: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    chunks_written: int = 0
    chunks_reused: int = 0

    def reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def summary(self) -> str:
        why = ", ".join(f"{n} {r}" for r, n in sorted(self.rejected.items())) or "none"
        return (
            f"{self.kind}: {self.rows} rows ({self.chunks_written} chunks written, "
            f"{self.chunks_reused} reused); rejected: {why}"
        )


def _save_png(path: Path, array: np.ndarray) -> str:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array.astype(np.uint8) * 255 if array.dtype == bool else array).save(path)
    return str(path)


def finding_masks(cases: Sequence, out_dir: Path) -> dict[str, list[str]]:
    """Per image, one PNG per finding of ``FINDINGS``: the union of the masks of every positive
    question about that image and finding ("" where there is none).

    Args:
        cases: the questions (all those about an image must be among them for its union to be whole).
        out_dir: where the PNGs are written (``<image hash>_<finding>.png``).

    Returns:
        image path (str) -> list of ``len(FINDINGS)`` paths.
    """
    import hashlib

    from monailabel_xflow.vocabulary import FINDINGS

    unions: dict[str, dict[str, np.ndarray]] = {}
    for case in cases:
        per_finding = unions.setdefault(str(case.image_path), {})
        mask = case.load_mask() if case.positive else None
        if mask is None or not mask.any():
            continue
        have = per_finding.get(case.finding)
        if have is None:
            per_finding[case.finding] = mask.astype(bool)
        else:
            per_finding[case.finding] = have | resize_mask(mask, have.shape)
    paths: dict[str, list[str]] = {}
    for image, per_finding in unions.items():
        stem = hashlib.sha1(image.encode()).hexdigest()[:16]
        paths[image] = [
            _save_png(out_dir / f"{stem}_{f}.png", per_finding[f]) if f in per_finding else "" for f in FINDINGS
        ]
    return paths


def _rows_for_case(
    kind: str,
    case,
    out_dir: Path,
    lung_boxes: Callable[[Path], dict[str, Box]] | None,
    segmenter,
    clicker,
    rng: np.random.Generator,
    report: BuildReport,
    image_findings: dict[str, list[str]] | None = None,
    workflow: Any = None,
    zoom: bool = False,
    pays: float | None = None,
) -> list[dict[str, Any]]:
    ins: Instruction = case.instruction
    mask = case.load_mask()
    common = {"image": str(case.image_path), "instruction": ins.text, "case_id": case.case_id}
    if kind in ("init-sft", "init-rl"):
        prompt = str(rng.choice(phrasings(ins)))
        if kind == "init-rl":
            return [
                dict(
                    common,
                    prompt=prompt,
                    gt_boxes=[list(b) for b in lesion_boxes(mask)],
                    present=bool(lesion_boxes(mask)),
                )
            ]
        if lung_boxes is None:  # build() refuses init-sft without them
            raise BuildError("init-sft needs lung boxes")
        try:
            # an ILS set names its anatomy maps by dicom_id (two studies' images may share a name)
            boxes = (
                lung_boxes(case.image_path, case.meta.get("dicom_id"))
                if isinstance(lung_boxes, LungBoxes)
                else lung_boxes(case.image_path)
            )
            target = init_target(ins, mask, boxes)
        except BuildError as err:
            report.reject(str(err))
            return []
        lesion_png = (
            _save_png(out_dir / "masks" / f"{case.case_id}.png", mask) if mask is not None and mask.any() else None
        )
        return [
            dict(
                common,
                prompt=prompt,
                target=target,
                lesion_mask=lesion_png,
                finding_masks=(image_findings or {})[str(case.image_path)],
                finding=ins.finding,
                level=ins.level,
                positive=lesion_png is not None,
            )
        ]

    # Revision kinds: positives only, one example per ground-truth component.
    if mask is None or not mask.any():
        report.reject("negative case (no mask to revise)")
        return []
    from monailabel_xflow.geometry import connected_components
    from monailabel_xflow.policy.oracle import perturb_box
    from monailabel_xflow.transforms import load_cxr

    image, _ = load_cxr(case.image_path)
    if workflow is not None:  # on-policy: the workflow's own Stage 1 boxes, revised by the oracle
        trajectories = onpolicy_trajectories(workflow, image, case, resize_mask(mask, image.shape), clicker, pays)
        built = [
            _revision_row(kind, common, case.case_id, k, image, traj, target, out_dir, zoom)
            for k, (traj, target) in enumerate(trajectories)
        ]
        return _kept(built, report)
    comps = connected_components(resize_mask(mask, image.shape), min_area_px=MIN_COMPONENT_PX)
    if kind == "rev-rl":
        rows = []
        for k, comp in enumerate(comps):
            tight = mask_to_box(comp)
            if tight is None:  # a connected component is never empty
                continue
            box = perturb_box(tight, comp.shape, rng, clicker.box_noise, clicker.box_shift)
            rows.append(_rl_row(common, case.case_id, k, box, comp, out_dir))
        return rows
    from monailabel_xflow.workflow.revision import oracle_trajectory

    segmenter.set_image(image)
    revised: list[dict[str, Any] | None] = []
    for k, comp in enumerate(comps):
        traj = oracle_trajectory(segmenter, comp, clicker, rng, component_id=k)
        if traj.discarded:  # the reason's figures vary per case; count by kind
            report.reject("trajectory discarded (no IoU gain)")
            continue
        revised.append(_revision_row(kind, common, case.case_id, k, image, traj, comp, out_dir, zoom))
    return _kept(revised, report)


def _kept(rows: list[dict[str, Any] | None], report: BuildReport) -> list[dict[str, Any]]:
    """The rows built; a None (a first oracle click outside π_rev's zoomed view) is counted."""
    for _ in range(rows.count(None)):
        report.reject("first oracle click outside the zoomed view")
    return [r for r in rows if r is not None]


def _rl_row(common: dict[str, Any], case_id: str, k: int, box: Box, target: Any, out_dir: Path) -> dict[str, Any]:
    """A ``rev-rl`` starting state: the box and the component revised towards (PNG)."""
    return dict(
        common,
        case_id=f"{case_id}_c{k}",
        start_box=list(box),
        gt_mask=_save_png(out_dir / "masks" / f"{case_id}_c{k}.png", target),
    )


def _revision_row(
    kind: str,
    common: dict[str, Any],
    case_id: str,
    k: int,
    image: Any,
    traj: Any,
    target: Any,
    out_dir: Path,
    zoom: bool = False,
) -> dict[str, Any] | None:
    """A ``rev-sft`` row (each turn's observation PNG and the action taken on it) or, for
    ``rev-rl``, the trajectory's starting state.

    With ``zoom`` the observations show :func:`~monailabel_xflow.geometry.zoom_view` of the
    starting box (the row's ``view``, image-normalised xyxy), and the row's box and clicks are
    in the view's coordinates, as π_rev will read and write them
    (:func:`~monailabel_xflow.workflow.revision.revise_mask`). The conversation ends before an
    oracle click π_rev could not make (outside the view); None when that is the first one.
    """
    from monailabel_xflow.rendering import render_observation

    if kind == "rev-rl":
        return _rl_row(common, case_id, k, traj.initial_box, target, out_dir)
    view = zoom_view(traj.initial_box, image.shape) if zoom else FULL_VIEW
    observations: list[str] = []
    errors: list[str] = []
    targets: list[str] = []
    clicks: list[Click] = []
    rows_, cols_ = view_pixels(view, np.shape(image))
    for t, (observed, action) in enumerate(traj.turns()):
        shown = None if action is None else click_to_view(action, view)
        if action is not None and shown is None:
            break
        png = out_dir / "observations" / f"{case_id}_c{k}_t{t}.png"
        observations.append(_save_png(png, render_observation(image, observed, clicks, view)))
        errors.append(_save_png(out_dir / "errors" / png.name, error_map(observed[rows_, cols_], target[rows_, cols_])))
        targets.append(revision_target(shown))
        if action is not None:
            clicks.append(action)
    if not targets:
        return None
    return dict(
        common,
        case_id=f"{case_id}_c{k}",
        box=list(box_to_view(traj.initial_box, view)),
        view=list(view),
        observations=observations,
        error_masks=errors,
        targets=targets,
    )


def error_map(mask: np.ndarray, target: np.ndarray) -> np.ndarray:
    """What a revision should fix, as an RGB picture: red where ``target`` is missed, green
    where ``mask`` spills beyond it (0/255 uint8 ``(H, W, 3)``; blue unused).

    The targets of π_rev's auxiliary error loss (``rev_aux_weight``): never shown to the policy.
    """
    m, g = np.asarray(mask, bool), np.asarray(target, bool)
    out = np.zeros((*m.shape, 3), np.uint8)
    out[..., 0] = (g & ~m) * 255
    out[..., 1] = (m & ~g) * 255
    return out


def onpolicy_trajectories(
    workflow: Any, image: Any, case: Any, gt: Any, clicker: Any, pays: float | None = None
) -> list:
    """π_rev's training states as inference meets them: the workflow's own Stage 1 on ``case``
    (its lesion boxes and F_seg masks), each box revised by the oracle towards its ground-truth
    component through the workflow's own Stage 2 loop (pruning included).

    A trajectory whose clicks raised IoU by less than ``pays`` is kept as stop-only: on that mask
    clicking does not pay, and π_rev must learn to stop there as much as to click elsewhere. A box
    with no ground-truth component to revise towards (a negative-only target) is left out.

    Args:
        workflow: an :class:`~monailabel_xflow.workflow.xflow.XFlow` (its π_rev is not used).
        image: ``(H, W)`` float image in ``[0, 1]``.
        case: the question (its instruction is asked).
        gt: ``(H, W)`` bool ground truth at the image's size.
        clicker: the oracle's :class:`~monailabel_xflow.policy.oracle.OracleClicker`.
        pays: smallest IoU gain that counts as paying (default :data:`~monailabel_xflow.policy.oracle.PAYS`).

    Returns:
        ``[(trajectory, target component)]`` per Stage 1 lesion box with a target, in box order.
    """
    from monailabel_xflow import rle
    from monailabel_xflow.metrics import mask_iou
    from monailabel_xflow.policy.oracle import PAYS, GroundTruthReviser, OracleStep, Trajectory

    pays = PAYS if pays is None else pays
    reviser = GroundTruthReviser(np.asarray(gt, bool), clicker)
    result = workflow.run(image, case.instruction, reviser=reviser)
    out = []
    for les in result.trace.lesions:
        target = reviser.target(les.box)
        tight = mask_to_box(target)
        if tight is None:
            continue
        first = rle.decode(les.initial_mask).astype(bool)
        traj = Trajectory(les.index, tight, les.box, first, mask_iou(first, target))
        steps = []
        for s in les.steps:
            if s.action == "click" and s.click is not None and s.mask is not None:
                m = rle.decode(s.mask).astype(bool)
                steps.append(OracleStep(s.click, s.box, m, mask_iou(m, target)))
        if steps and steps[-1].iou - traj.initial_iou >= pays:
            traj.steps = steps
        out.append((traj, target))
    return out


def build(
    kind: str,
    cases: Sequence,
    out_dir: str | Path,
    *,
    lung_boxes: Callable[[Any], dict[str, Box]] | None = None,
    segmenter=None,
    clicker=None,
    shard: tuple[int, int] = (0, 1),
    seed: int = 0,
    chunk_size: int = 256,
    progress: bool = True,
    workflow: Any = None,
    zoom: bool = False,
    pays: float | None = None,
) -> BuildReport:
    """Build one kind of training set into ``out_dir`` (resumable, shardable).

    Args:
        kind: one of :data:`KINDS`.
        cases: the questions (``EvalCase``); this shard takes ``cases[i::N]``.
        out_dir: the set's folder; chunks go to ``out_dir/shard-i-of-N/chunk-KKKKK``.
        lung_boxes: image path -> lung boxes (``init-sft``); see :class:`LungBoxes`.
        segmenter: a ``PromptableSegmenter`` (``rev-sft``: F_seg in the oracle loop).
        clicker: an :class:`~monailabel_xflow.policy.oracle.OracleClicker` (defaults to the paper's).
        shard: ``(i, N)``.
        seed: phrasing and box perturbations are drawn per chunk from ``(seed, shard, chunk)``,
            so a resumed build writes the same rows as an uninterrupted one.
        chunk_size: cases per chunk (the unit of resumption).
        workflow: an ``XFlow`` for on-policy revision kinds: starting boxes and masks are its own
            Stage 1's, revised by the oracle (:func:`onpolicy_trajectories`), instead of perturbed
            true boxes. Its π_init must be the one π_rev will follow.
        zoom: ``rev-sft`` observations show the zoomed view π_rev will see at inference
            (``VLMPolicy(zoom=True)``; :func:`_revision_row`).
        pays: with ``workflow``, the smallest IoU gain of the oracle's clicks that makes a
            trajectory click (default :data:`~monailabel_xflow.policy.oracle.PAYS`); below it the
            trajectory is stop-only.

    Returns:
        A :class:`BuildReport`; its summary is logged.
    """
    import datasets
    from datasets import Dataset
    from tqdm.auto import tqdm

    from monailabel_xflow.policy.oracle import OracleClicker

    datasets.disable_progress_bars()  # one bar per build (ours), not one per chunk write

    if kind not in KINDS:
        raise BuildError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    i, n = shard
    if not (n >= 1 and 0 <= i < n):
        raise BuildError(f"shard must be i/N with 0 <= i < N, got {i}/{n}")
    if kind == "init-sft" and lung_boxes is None:
        raise BuildError("init-sft needs lung boxes (a phantom set's anatomy or --lung-boxes JSON)")
    if kind == "rev-sft" and segmenter is None and workflow is None:
        raise BuildError("rev-sft runs F_seg in the loop: give a segmenter")
    clicker = clicker or OracleClicker()
    mine = list(cases)[i::n]
    root = Path(out_dir) / f"shard-{i}-of-{n}"
    report = BuildReport(kind)
    image_findings = None
    if kind == "init-sft":  # from every question about this shard's images, whichever shard has it
        mine_images = {str(c.image_path) for c in mine}
        image_findings = finding_masks(
            [c for c in cases if str(c.image_path) in mine_images], Path(out_dir) / "finding-masks"
        )
    starts = range(0, len(mine), chunk_size)
    for k, start in enumerate(tqdm(starts, desc=f"building {kind} (shard {i}/{n})", disable=not progress)):
        where = root / f"chunk-{k:05d}"
        if (where / "dataset_info.json").is_file():
            report.chunks_reused += 1
            report.rows += Dataset.load_from_disk(str(where)).num_rows
            continue
        rng = np.random.default_rng([seed, i, k])
        rows = []
        for case in mine[start : start + chunk_size]:
            rows += _rows_for_case(
                kind,
                case,
                Path(out_dir),
                lung_boxes,
                segmenter,
                clicker,
                rng,
                report,
                image_findings,
                workflow,
                zoom,
                pays,
            )
        if rows:
            Dataset.from_list(rows).save_to_disk(str(where))
        else:  # an empty chunk still marks its cases as done
            where.mkdir(parents=True, exist_ok=True)
            (where / "dataset_info.json").write_text("{}")
        report.chunks_written += 1
        report.rows += len(rows)
    (Path(out_dir) / "build.json").write_text(json.dumps({"kind": kind, "shards": n}))
    logger.info(report.summary())
    return report


def load_built(out_dir: str | Path):
    """All chunks of all shards of a built set, concatenated into one ``datasets.Dataset``."""
    from datasets import Dataset, concatenate_datasets

    parts = [Dataset.load_from_disk(str(p.parent)) for p in sorted(Path(out_dir).glob("shard-*/chunk-*/state.json"))]
    if not parts:
        raise BuildError(f"{out_dir} holds no built chunks")
    return concatenate_datasets(parts)
