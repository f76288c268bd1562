"""The paper's comparison reproduced on phantoms: ROSALIA beside XFlow (``xflow benchmark phantom``).

One resumable run scores, on the same held-out phantom questions (drawn with a seed the demo
training never used, balanced over chest / lung / zone and positive / negative by
:func:`~monailabel_xflow.training.demo.export_heldout`):

- ``rosalia``: the one-shot baseline (``[SEG]`` token into SAM's mask decoder), when a ROSALIA
  model is given;
- ``stage1``: XFlow Stage 1 only (π_init boxes prompting F_seg);
- ``stage1+2``: XFlow with π_rev's click revision (the full workflow);
- ``oracle``: XFlow with π_rev replaced by the simulated user of Algorithm 1 holding the ground
  truth (:class:`GroundTruthReviser`), the upper bound of what revision can add to these Stage 1
  boxes and this F_seg.

Each method is an ordinary :func:`~monailabel_xflow.eval.evaluate.evaluate` run into ``OUT/<method>/``
(``results.jsonl``, ``report.json``, ``report.md``, plots, ``predictions/``), so an interrupted run
continues where it stopped and a retrained model's records are redone, never reused. The three XFlow
methods share one loaded model and one Stage 1 text per question (greedy decoding gives the same text
every time; :class:`SharedStage1` computes it once), so they differ only in what happens after Stage 1.
:func:`write_summary` then writes ``OUT/benchmark.md`` / ``benchmark.json`` (paper Table 1 and
Table 3 layouts, the effect of Stage 2 case by case, latency per question),
``OUT/findings.png``, ``OUT/levels.png`` and ``OUT/contact-sheet.png`` (the same cases side by side).

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.geometry import Box, resize_mask
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.vocabulary import FINDINGS, LEVELS

__all__ = [
    "METHODS", "METHOD_TITLES", "SharedStage1", "stage1_identity", "GroundTruthReviser", "xflow_predictors", "run_benchmark",
    "write_summary", "stage2_effect", "interleaved",
]

log = logging.getLogger(__name__)

METHODS = ("rosalia", "stage1", "stage1+2", "oracle")
"""Every method, in the order of the tables (Table 1 of the paper: the baseline first)."""

METHOD_TITLES = {
    "rosalia": "ROSALIA",
    "stage1": "XFlow Stage 1 only",
    "stage1+2": "XFlow Stage 1 + 2",
    "oracle": "XFlow + oracle clicks",
}

LATENCY_NAME = "latency.jsonl"
REVISIONS_NAME = "revisions.jsonl"
STAGE1_NAME = "stage1-texts.jsonl"
SUMMARY_MD = "benchmark.md"
SUMMARY_JSON = "benchmark.json"


# --- XFlow's methods ------------------------------------------------------------------------------


class SharedStage1:
    """A Stage 1 policy whose text for one (image, instruction) is computed once.

    Wraps π_init so that the Stage-1-only, Stage 1 + 2 and oracle runs of one benchmark see the
    same boxes (as the paper's ablation does) and the policy runs once per question. With a
    ``store`` the texts also outlive the process (one JSON line each, tagged with the model's
    ``identity``; lines of another model are ignored), so a resumed or repeated run of the same
    model does not generate them again.

    Args:
        policy: a ``Stage1Policy`` (``stage1(image, instruction) -> str``).
        store: JSON-lines file of computed texts, or None.
        identity: the model's identity (:func:`~monailabel_xflow.eval.evaluate.files_fingerprint`).

    Attributes:
        seconds: seconds the wrapped policy took per key (``(image digest, instruction text)``).
    """

    def __init__(self, policy: Any, store: Path | None = None, identity: str = "") -> None:
        self.policy = policy
        self.store = store
        self.identity = identity
        self._texts: dict[tuple[str, str], str] = {}
        self.seconds: dict[tuple[str, str], float] = {}
        self._load()

    def _load(self) -> None:
        """Read the texts the store holds (another process running other methods may be adding
        to it; a line it is still writing is skipped)."""
        if self.store is None or not self.store.is_file():
            return
        for line in self.store.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("identity") == self.identity:
                key = (r["image"], r["instruction"])
                self._texts.setdefault(key, r["text"])
                self.seconds.setdefault(key, float(r["seconds"]))

    @staticmethod
    def key(image: np.ndarray, instruction: Instruction) -> tuple[str, str]:
        return hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest(), instruction.text

    def stage1(self, image: np.ndarray, instruction: Instruction) -> str:
        key = self.key(image, instruction)
        if key not in self._texts:
            start = time.perf_counter()
            text = self.policy.stage1(image, instruction)
            self._remember(key, text, time.perf_counter() - start)
        return self._texts[key]

    def stage1_many(self, image: np.ndarray, instructions: Sequence[Instruction]) -> list[str]:
        """Texts of several instructions on one image; those not known yet are decoded together
        with the policy's ``stage1_many`` (one image prefix, batched decoding)."""
        missing = list({i.text: i for i in instructions if self.key(image, i) not in self._texts}.values())
        if missing:
            self._load()
            missing = [i for i in missing if self.key(image, i) not in self._texts]
        if len(missing) > 1 and hasattr(self.policy, "stage1_many"):
            start = time.perf_counter()
            texts = list(self.policy.stage1_many(image, missing))
            share = (time.perf_counter() - start) / len(missing)  # the batch's time, split evenly
            for instr, text in zip(missing, texts):
                self._remember(self.key(image, instr), text, share)
        return [self.stage1(image, i) for i in instructions]

    def _remember(self, key: tuple[str, str], text: str, seconds: float) -> None:
        self._texts[key], self.seconds[key] = text, seconds
        if self.store is not None:
            with self.store.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"identity": self.identity, "image": key[0], "instruction": key[1],
                                     "text": text, "seconds": seconds}) + "\n")


class GroundTruthReviser:
    """π_rev replaced by the simulated user of Algorithm 1 that holds the question's ground truth.

    For each Stage 1 lesion box the oracle revises towards one GT component: the one with the most
    pixels inside the box, or, when the box holds none, the one whose centre lies nearest the box
    centre (the lesion the box was meant for). On a negative question (empty GT) the target is
    empty, so the oracle clicks negative on what was drawn. Clicks, τ = 0.7, T and the 25 px guard
    are :class:`~monailabel_xflow.policy.oracle.OracleClicker`'s.

    Args:
        gt: ``(H, W)`` bool ground truth of the question at the image's size.
        clicker: an ``OracleClicker`` (default: the paper's settings).
    """

    def __init__(self, gt: np.ndarray, clicker: Any = None) -> None:
        from monailabel_xflow.geometry import connected_components
        from monailabel_xflow.policy.oracle import OracleClicker

        self.gt = np.asarray(gt, bool)
        self.clicker = clicker if clicker is not None else OracleClicker()
        self.components = connected_components(self.gt)

    def target(self, box: Box) -> np.ndarray:
        """The GT component a lesion box (normalised xyxy) is revised towards (empty if none)."""
        if not self.components:
            return np.zeros_like(self.gt)
        h, w = self.gt.shape
        x1, y1, x2, y2 = box
        r0, r1 = int(np.floor(y1 * h)), int(np.ceil(y2 * h))
        c0, c1 = int(np.floor(x1 * w)), int(np.ceil(x2 * w))
        inside = [int(c[r0:r1, c0:c1].sum()) for c in self.components]
        if max(inside) > 0:
            return self.components[int(np.argmax(inside))]
        cy, cx = (y1 + y2) / 2 * h, (x1 + x2) / 2 * w
        dist = []
        for c in self.components:
            rows, cols = np.nonzero(c)
            dist.append((rows.mean() - cy) ** 2 + (cols.mean() - cx) ** 2)
        return self.components[int(np.argmin(dist))]

    def start(self, image: np.ndarray, instruction: Instruction, box: Box):
        from monailabel_xflow.policy.oracle import OracleRevisionPolicy

        return OracleRevisionPolicy(self.target(box), self.clicker).start(image, instruction, box)


def _gt_at(case: EvalCase, shape: tuple[int, int]) -> np.ndarray:
    """The case's GT mask at ``shape`` (all False on a negative)."""
    gt = case.load_mask()
    if gt is None:
        return np.zeros(shape, bool)
    gt = np.asarray(gt, bool)
    return gt if gt.shape == shape else resize_mask(gt, shape)


@dataclass
class _Timed:
    """Per-question wall time of a method, appended to ``OUT/<method>/latency.jsonl``."""

    path: Path

    def add(self, case_id: str, seconds: float) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"case_id": case_id, "seconds": seconds}) + "\n")


@dataclass
class _Revisions:
    """What Stage 2 did per question (``OUT/<method>/revisions.jsonl``): every lesion box's
    :class:`~monailabel_xflow.workflow.trace.LesionRecord` (initial mask, each click with its mask and
    F_seg's predicted IoU, how it ended), so revision rules can be studied without rerunning."""

    path: Path

    def add(self, case_id: str, trace: Any) -> None:
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"case_id": case_id, "lesions": [rec.to_dict() for rec in trace.lesions]},
                                default=float) + "\n")


def stage1_identity(cfg: Any) -> str:
    """A content hash of what a Stage 1 text depends on: π_init's weights (base + adapter, or the
    merged model) and the decoding length, not F_seg or π_rev.

    The Stage 1 text cache (``OUT/stage1-texts.jsonl``) is keyed by it, so a benchmark rerun after
    only F_seg or π_rev changed reuses the texts (greedy decoding gives the same text), while a
    retrained π_init, even copied elsewhere, is recognised by its bytes.

    Args:
        cfg: a :class:`~monailabel_xflow.workflow.model_config.ModelConfig`.
    """
    digest = hashlib.sha256(f"max_new_tokens={getattr(cfg, 'max_new_tokens', None)}".encode())
    for name in ("vlm_base", "init_adapter", "init_model"):
        value = getattr(cfg, name, None)
        if not value:
            continue
        _, path = cfg.locate(value)
        digest.update(f"{name}={value if path is None else ''}".encode())
        if path is None:  # a hub id: its text
            continue
        files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
        for f in files:
            digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
            digest.update(hashlib.sha256(f.read_bytes()).digest())
    return digest.hexdigest()[:16]


def xflow_predictors(config: str | Path, out: Path, cases: Sequence[EvalCase] = ()) -> tuple[dict[str, Callable[[EvalCase], np.ndarray]], str]:
    """Predictors of the three XFlow methods on one loaded model, and the model's identity.

    Args:
        config: a models file (``models.yaml``) naming π_init, π_rev and F_seg.
        out: the benchmark folder (latency files go to ``out/<method>/``).
        cases: the questions to come; the Stage 1 texts of all questions on one image are then
            decoded in one batch when the first of them is asked.

    Returns:
        ``({"stage1": f, "stage1+2": f, "oracle": f}, identity)`` with ``f(case) -> mask``. A
        method's recorded latency is its whole run for the question (Stage 1 counted in full, as
        measured when it was computed, even when another method computed it).

    Raises:
        ModelConfigError: the models cannot be loaded.
    """
    from monailabel_xflow.eval.evaluate import model_identity
    from monailabel_xflow.transforms.loading import load_cxr
    from monailabel_xflow.workflow.model_config import ModelConfig, load_models
    from monailabel_xflow.workflow.xflow import XFlow

    cfg = ModelConfig.load(config)
    loaded = load_models(cfg)
    identity = model_identity(str(config))
    shared = SharedStage1(loaded.stage1, out / STAGE1_NAME, stage1_identity(cfg))
    flow = XFlow(shared, loaded.reviser, loaded.segmenter, max_clicks=cfg.max_clicks, models=loaded.identities)
    images: dict[Path, np.ndarray] = {}
    by_image: dict[Path, list[Instruction]] = {}
    for c in cases:
        by_image.setdefault(c.image_path, []).append(c.instruction)

    def image_of(case: EvalCase) -> np.ndarray:
        if case.image_path not in images:
            images.clear()  # questions come grouped by study: keep one image
            images[case.image_path] = load_cxr(case.image_path)[0]
        return images[case.image_path]

    def method(name: str) -> Callable[[EvalCase], np.ndarray]:
        timer = _Timed(out / name / LATENCY_NAME)
        revisions = _Revisions(out / name / REVISIONS_NAME)

        def predict(case: EvalCase) -> np.ndarray:
            image = image_of(case)
            shared.stage1_many(image, by_image.get(case.image_path, [case.instruction]))
            key = SharedStage1.key(image, case.instruction)
            cached = key in shared.seconds
            if name == "stage1":
                result = flow.run(image, case.instruction, revise=False)
            elif name == "stage1+2":
                if loaded.reviser is None:
                    raise RuntimeError(f"{config} names no revision policy (rev_adapter): no Stage 2")
                result = flow.run(image, case.instruction)
            else:
                result = flow.run(image, case.instruction, reviser=GroundTruthReviser(_gt_at(case, image.shape)))
            seconds = result.trace.timings["total"]
            if cached:  # the policy's time was spent by an earlier method; count it here too
                seconds += shared.seconds[key] - result.trace.timings.get("stage1", 0.0)
            timer.add(case.case_id, seconds)
            if name != "stage1":
                revisions.add(case.case_id, result.trace)
            return result.mask

        return predict

    return {m: method(m) for m in ("stage1", "stage1+2", "oracle")}, identity


def rosalia_predictor(folder: str | Path, out: Path) -> tuple[Callable[[EvalCase], np.ndarray], str]:
    """``predict(case)`` of a ROSALIA model folder (:class:`monailabel_xflow.rosalia.predictor.RosaliaPredictor`)
    and its identity (a fingerprint of the folder's files).

    The image is encoded once per study (``set_image``); the recorded latency of a question is its
    ``predict`` plus its share of that encoding.
    """
    from monailabel_xflow.eval.evaluate import files_fingerprint
    from monailabel_xflow.rosalia.predictor import RosaliaPredictor
    from monailabel_xflow.transforms.loading import load_cxr

    model = RosaliaPredictor.from_pretrained(folder, device="cpu")
    timer = _Timed(out / "rosalia" / LATENCY_NAME)
    current: dict[str, Any] = {}

    def predict(case: EvalCase) -> np.ndarray:
        encode = 0.0
        if current.get("path") != case.image_path:
            image, _ = load_cxr(case.image_path)
            start = time.perf_counter()
            model.set_image(image)
            encode = time.perf_counter() - start
            current.update(path=case.image_path, encode=encode, shared=False)
        start = time.perf_counter()
        mask, _, _ = model.predict(case.instruction)
        seconds = time.perf_counter() - start
        if not current["shared"]:  # the encoding counts once, with the study's first question
            seconds += current["encode"]
            current["shared"] = True
        timer.add(case.case_id, seconds)
        return mask

    return predict, files_fingerprint(folder)


# --- the run -----------------------------------------------------------------------------------


def interleaved(cases: Sequence[EvalCase]) -> list[EvalCase]:
    """The questions in round-robin order over the (level, positive) strata, each stratum in its
    own order, so that any prefix of the run (an interrupted benchmark) stays balanced."""
    strata: dict[tuple[str, bool], list[EvalCase]] = {}
    for c in cases:
        strata.setdefault((c.level, bool(c.positive)), []).append(c)
    queues = [strata[k] for k in sorted(strata)]
    order: list[EvalCase] = []
    for k in range(max((len(q) for q in queues), default=0)):
        order += [q[k] for q in queues if k < len(q)]
    return order


def run_benchmark(
    out: str | Path,
    model: str | Path,
    *,
    rosalia: str | Path | None = None,
    questions: int = 300,
    seed: int = 1000,
    phantom_size: int = 256,
    methods: Sequence[str] | None = None,
    progress: bool = True,
    plots: bool = True,
) -> dict[str, Any]:
    """Score every method on the held-out phantom questions and write the summary.

    Args:
        out: the benchmark folder (``data/`` holds the phantoms; one folder per method).
        model: XFlow models file (e.g. ``monailabel_xflow/demo/models.yaml``).
        rosalia: ROSALIA model folder (``RosaliaPredictor.from_pretrained``), or None to leave the
            ``rosalia`` row out.
        questions: held-out questions (split evenly over levels, then over positive/negative).
        seed: phantom seed (the demo trains on seed 0; 1000 is its held-out seed).
        phantom_size: phantom side in pixels (the demo trained on 256).
        methods: subset of :data:`METHODS` (default: all available).
        progress: tqdm bars.
        plots: write the PNG plots and the contact sheet.

    Returns:
        The summary dict (also ``OUT/benchmark.json``).

    Raises:
        ValueError: an unknown method, or ``rosalia`` asked for without a ROSALIA model.
    """
    from monailabel_xflow.data.readers import read_mimic_ils
    from monailabel_xflow.eval.evaluate import evaluate
    from monailabel_xflow.training.demo import export_heldout

    out = Path(out)
    wanted = list(methods) if methods else [m for m in METHODS if m != "rosalia" or rosalia is not None]
    unknown = [m for m in wanted if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if "rosalia" in wanted and rosalia is None:
        raise ValueError("method 'rosalia' needs a ROSALIA model (--rosalia CONFIG)")
    heldout = export_heldout(out / "data", seed=seed, questions=questions, size=phantom_size, progress=progress)
    cases = interleaved(read_mimic_ils(heldout, split="test", kinds=("basic", "global")).cases)
    log.info("benchmark: %d held-out questions from %s", len(cases), heldout)

    predictors: dict[str, tuple[Callable, str]] = {}
    if "rosalia" in wanted:
        predictors["rosalia"] = rosalia_predictor(rosalia, out)
    xflow_methods = [m for m in wanted if m != "rosalia"]
    if xflow_methods:
        fns, identity = xflow_predictors(model, out, cases)
        predictors.update({m: (fns[m], f"{identity}:{m}") for m in xflow_methods})
    for m in wanted:  # the table order, whatever order they were asked in
        fn, identity = predictors[m]
        (out / m).mkdir(parents=True, exist_ok=True)
        log.info("benchmark: %s", METHOD_TITLES[m])
        evaluate(cases, fn, out / m, predictor_id=identity, progress=progress, save_predictions=True,
                 title=f"{METHOD_TITLES[m]} on {len(cases)} held-out phantom questions", plots=plots)
    return write_summary(out, [m for m in METHODS if m in wanted], cases, plots=plots)


# --- the summary -------------------------------------------------------------------------------


def _records(folder: Path, cases: Sequence[EvalCase]) -> dict[str, dict[str, Any]]:
    from monailabel_xflow.eval.evaluate import load_results

    stored = load_results(folder)
    return {c.case_id: stored[c.case_id] for c in cases if "stats" in stored.get(c.case_id, {})}


def _iou(record: Mapping[str, Any]) -> float:
    from monailabel_xflow.metrics import SampleStats

    return SampleStats.from_dict(record["stats"]).iou


def stage2_effect(before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]],
                  tol: float = 1e-9) -> dict[str, Any]:
    """What a revision did, question by question (records of two methods on the same cases).

    A mask counts as changed when any of its pixel counts differs. IoU up / down is counted over
    positive questions only (IoU is undefined on negatives); presence flips count every question.

    Returns:
        ``{"n": questions in both, "changed", "iou_up", "iou_down", "mean_iou_delta"
        (positives), "presence_gained", "presence_lost"}``.
    """
    shared = [k for k in before if k in after]
    changed = up = down = gained = lost = 0
    deltas = []
    for k in shared:
        a, b = before[k]["stats"], after[k]["stats"]
        if a != b:
            changed += 1
        if (a["pred_area"] > 0) != (b["pred_area"] > 0):
            gained += b["pred_area"] > 0
            lost += a["pred_area"] > 0
        if a["gt_area"] > 0:
            d = _iou(after[k]) - _iou(before[k])
            deltas.append(d)
            up += d > tol
            down += d < -tol
    return {"n": len(shared), "changed": changed, "iou_up": up, "iou_down": down,
            "mean_iou_delta": float(np.mean(deltas)) if deltas else None,
            "presence_gained": gained, "presence_lost": lost}


def _latency(folder: Path, case_ids: set[str]) -> dict[str, float] | None:
    path = folder / LATENCY_NAME
    if not path.is_file():
        return None
    last: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            last[r["case_id"]] = float(r["seconds"])  # the latest run of a redone case
    values = [v for k, v in last.items() if k in case_ids]
    if not values:
        return None
    return {"n": len(values), "mean_s": float(np.mean(values)), "median_s": float(np.median(values))}


def _f(v: Any, digits: int = 3) -> str:
    return "—" if v is None or (isinstance(v, float) and v != v) else f"{v:.{digits}f}"


def write_summary(out: str | Path, methods: Sequence[str], cases: Sequence[EvalCase], plots: bool = True) -> dict[str, Any]:
    """``OUT/benchmark.md`` and ``benchmark.json`` from the methods' reports, plus the figures.

    Args:
        out: the benchmark folder holding ``<method>/report.json`` and ``results.jsonl``.
        methods: the methods to put side by side, in table order.
        cases: the questions (for the case-by-case comparisons and the contact sheet).
        plots: also write ``levels.png``, ``findings.png`` and ``contact-sheet.png``.
    """
    from monailabel_xflow.training.demo import eval_table

    out = Path(out)
    reports = {m: json.loads((out / m / "report.json").read_text()) for m in methods}
    records = {m: _records(out / m, cases) for m in methods}
    ids = {c.case_id for c in cases}
    summary: dict[str, Any] = {"questions": len(cases), "methods": {}}
    for m in methods:
        r = reports[m]
        summary["methods"][m] = {
            "title": METHOD_TITLES[m], "average": r["average"], "levels": r["levels"], "noise": r["noise"],
            "findings": {f: e["average"] for f, e in r["findings"].items()},
            "latency": _latency(out / m, ids), "n_scored": r["n_scored"], "errors": len(r["errors"]),
        }
    effects = {}
    for a, b in (("stage1", "stage1+2"), ("stage1", "oracle")):
        if a in records and b in records:
            effects[f"{a} -> {b}"] = stage2_effect(records[a], records[b])
    summary["revision"] = effects

    lines = [f"# ROSALIA beside XFlow on {len(cases)} held-out phantom questions", "",
             "Generated by `xflow benchmark phantom` (monailabel_xflow/eval/phantom_benchmark.py); the "
             "hand-written conclusions are in README.md.", "",
             "## Segmentation and presence (paper Table 1 layout; levels averaged with equal weight)", "",
             eval_table({METHOD_TITLES[m]: out / m for m in methods}),
             "## Mask noise over the positive questions (paper Table 3 layout)", "",
             "ΔC = components(pred) − components(GT); specks = components < 0.1 % of the image "
             "(8-connectivity).", "",
             "| Method | ΔC | Specks | Specks outside GT | Speck area % of mask |", "|---|---|---|---|---|"]
    gt_noise = None
    for m in methods:
        n = reports[m]["noise"]
        gt_noise = gt_noise or n
        lines.append(f"| {METHOD_TITLES[m]} | {_f(n['delta_c'], 2)} | {_f(n['specks'], 2)} | "
                     f"{_f(n['specks_outside_gt'], 2)} | {_f(n['speck_area_pct'], 2)} |")
    if gt_noise:
        lines.append(f"| Ground truth | — | {_f(gt_noise['gt_specks'], 2)} | — | {_f(gt_noise['gt_speck_area_pct'], 2)} |")
    lines += ["", "## gIoU per finding (equal-weight average over the levels it is asked at)", "",
              "| Finding | " + " | ".join(METHOD_TITLES[m] for m in methods) + " |", "|---|" + "---|" * len(methods)]
    for f in FINDINGS:
        cells = [_f(summary["methods"][m]["findings"].get(f, {}).get("giou")) for m in methods]
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    if effects:
        lines += ["", "## What revision changed, question by question", "",
                  "| Revision | Questions | Masks changed | IoU up | IoU down | Mean IoU change (positives) | "
                  "Presence gained / lost |", "|---|---|---|---|---|---|---|"]
        for name, e in effects.items():
            a, b = name.split(" -> ")
            lines.append(f"| {METHOD_TITLES[a]} → {METHOD_TITLES[b]} | {e['n']} | {e['changed']} | {e['iou_up']} | "
                         f"{e['iou_down']} | {_f(e['mean_iou_delta'], 4)} | {e['presence_gained']} / {e['presence_lost']} |")
    lat = {m: summary["methods"][m]["latency"] for m in methods if summary["methods"][m]["latency"]}
    if lat:
        base = lat.get("stage1+2")
        lines += ["", "## Latency per question (this machine, CPU, as measured during the run)", "",
                  "| Method | Questions timed | Mean s | Median s | Mean ÷ XFlow Stage 1 + 2 |", "|---|---|---|---|---|"]
        for m, v in lat.items():
            ratio = _f(v["mean_s"] / base["mean_s"], 2) if base else "—"
            lines.append(f"| {METHOD_TITLES[m]} | {v['n']} | {_f(v['mean_s'], 2)} | {_f(v['median_s'], 2)} | {ratio} |")
    figures = []
    if plots:
        figures = _plots(out, summary, methods) + [_contact_sheet(out, methods, cases, records)]
        lines += ["", "## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures]
    (out / SUMMARY_MD).write_text("\n".join(lines) + "\n")
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=1, default=float))
    return summary


def _plots(out: Path, summary: Mapping[str, Any], methods: Sequence[str]) -> list[Path]:
    """``levels.png`` (gIoU, F1, N-Acc per level) and ``findings.png`` (gIoU and F1 per finding)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from monailabel_xflow.eval.evaluate import _grouped_bars

    titles = [METHOD_TITLES[m] for m in methods]
    written = []
    groups = list(LEVELS) + ["average"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for ax, (key, label) in zip(axes, (("giou", "gIoU"), ("f1", "presence F1"), ("n_acc", "N-Acc"))):
        series = {}
        for m, t in zip(methods, titles):
            s = summary["methods"][m]
            series[t] = [(s["average"] if g == "average" else s["levels"].get(g, {})).get(key) for g in groups]
        _grouped_bars(ax, groups, series)
        ax.set_title(label)
        ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    written.append(out / "levels.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for ax, (key, label) in zip(axes, (("giou", "gIoU"), ("f1", "presence F1"))):
        _grouped_bars(ax, list(FINDINGS), {t: [summary["methods"][m]["findings"].get(f, {}).get(key) for f in FINDINGS]
                                           for m, t in zip(methods, titles)}, rotation=20)
        ax.set_ylabel(label)
        ax.set_ylim(0, 1)
    axes[0].set_title("Per finding (equal-weight average over levels)")
    axes[0].legend(fontsize=7, ncol=len(methods), loc="upper center")
    fig.tight_layout()
    written.append(out / "findings.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)
    return written


GT_COLOUR = (40, 220, 40)
PRED_COLOUR = (240, 60, 60)


def contact_cases(cases: Sequence[EvalCase], per_level: int = 3) -> list[EvalCase]:
    """The questions of the contact sheet: per level, positives of different findings, then one
    negative; deterministic (the first eligible in case order)."""
    chosen: list[EvalCase] = []
    for level in LEVELS:
        seen: set[str] = set()
        for c in cases:
            if c.level == level and c.positive and c.finding not in seen and len(seen) < per_level - 1:
                seen.add(c.finding)
                chosen.append(c)
        neg = next((c for c in cases if c.level == level and not c.positive), None)
        if neg is not None:
            chosen.append(neg)
    return chosen


def _contact_sheet(out: Path, methods: Sequence[str], cases: Sequence[EvalCase],
                   records: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> Path:
    """Rows: questions; columns: the GT, then each method's mask (red) over the GT outline (green)."""
    from PIL import Image

    from monailabel_xflow.rendering import contact_sheet, overlay
    from monailabel_xflow.transforms.loading import load_cxr

    tiles, titles = [], []
    for case in contact_cases(cases):
        image, _ = load_cxr(case.image_path)
        gt = _gt_at(case, image.shape)
        tiles.append(overlay(image, [gt], colors=[GT_COLOUR]))
        titles.append(f"{case.level}: {case.finding}" + ("" if case.positive else " (absent)"))
        for m in methods:
            png = out / m / "predictions" / f"{case.case_id}.png"
            pred = np.asarray(Image.open(png)) > 0 if png.is_file() else np.zeros(image.shape, bool)
            pred = pred if pred.shape == image.shape else resize_mask(pred, image.shape)
            tiles.append(overlay(overlay(image, [gt], colors=[GT_COLOUR], alpha=0.0), [pred], colors=[PRED_COLOUR]))
            record = records[m].get(case.case_id)
            score = ""
            if record is not None:
                score = f"IoU {_iou(record):.2f}" if case.positive else ("empty" if not pred.any() else "drawn")
            titles.append(f"{METHOD_TITLES[m]} {score}")
    sheet = contact_sheet(tiles, titles, ncols=1 + len(methods), tile_size=200,
                          legend=[("ground truth", GT_COLOUR), ("prediction", PRED_COLOUR)])
    path = out / "contact-sheet.png"
    Image.fromarray(sheet).save(path, optimize=True)
    return path
