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

and, always, three trivial baselines that look at nothing but the question (:data:`BASELINES`):
``never-present`` (an empty mask for every question), ``always-present`` (the whole region the
instruction names, from the phantom's true anatomy: the lung, the zones, or the chest = lungs and
heart) and ``question-only`` (that whole region only when the question names two or more regions:
the phantom questions' one text shortcut, as a zone-level positive lists every zone its lesion
touches while a zone-level negative names one zone). A method is worth its compute only where it
beats them; where it merely matches ``question-only`` it answers from the text, not the image.

**Protocol.** Every choice (steps, variants, thresholds) is made on the *dev* seed
(:data:`DEV_SEED`); the *test* seed (:data:`TEST_SEED`, ``--test``) is run once, for the report,
with the models chosen on dev, and the summary records which split and seed it is. Every figure
comes with a bootstrap 95 % interval over phantoms (:mod:`monailabel_xflow.eval.bootstrap`: whole
images are resampled, so the questions of one image move together), every difference in the claims
table with its paired interval, and a claim reads "reproduced" only when that interval excludes 0
in the claimed direction.

**Integrity.** ``OUT/manifest.json`` records the split, seed, question count, phantom size, a
content hash of the phantoms and questions, and a content hash of each model; a rerun into an
``OUT`` made with another seed, count, size or data is refused (results and drawings are keyed by
case id, so reusing them would score other images), as is a test-split rerun with other models. A
prediction file the contact sheet needs and cannot find is an error, never drawn as empty.

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
from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Box, resize_mask
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.vocabulary import FINDINGS, LEVELS

__all__ = [
    "METHODS",
    "BASELINES",
    "METHOD_TITLES",
    "DEV_SEED",
    "TEST_SEED",
    "BenchmarkOutError",
    "SharedStage1",
    "stage1_identity",
    "GroundTruthReviser",
    "xflow_predictors",
    "baseline_predictors",
    "region_mask",
    "check_manifest",
    "run_benchmark",
    "write_summary",
    "stage2_effect",
    "interleaved",
]

log = logging.getLogger(__name__)

METHODS = ("rosalia", "stage1", "stage1+2", "oracle")
"""Every model method, in the order of the tables (Table 1 of the paper: the baseline first)."""

BASELINES = ("never-present", "always-present", "question-only")
"""The trivial baselines, in every table (they need no model and run in no time)."""

METHOD_TITLES = {
    "never-present": "Trivial: never present",
    "always-present": "Trivial: always present, whole region",
    "question-only": "Trivial: present, whole region, iff the question names ≥ 2 regions",
    "rosalia": "ROSALIA",
    "stage1": "XFlow Stage 1 only",
    "stage1+2": "XFlow Stage 1 + 2",
    "oracle": "XFlow + oracle clicks",
}

TRAIN_SEED = 0
"""The seed the demos' training phantoms are drawn with (never scored here)."""

DEV_SEED = 1000
"""The seed every choice is made on (the demos' held-out seed until the protocol existed)."""

TEST_SEED = 7301
"""The seed of the report: used once, with models chosen on :data:`DEV_SEED`, never for a choice."""

SPLITS = {"dev": DEV_SEED, "test": TEST_SEED}
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "xflow-phantom-benchmark/1"
BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 0

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
            for instr, text in zip(missing, texts, strict=False):
                self._remember(self.key(image, instr), text, share)
        return [self.stage1(image, i) for i in instructions]

    def _remember(self, key: tuple[str, str], text: str, seconds: float) -> None:
        self._texts[key], self.seconds[key] = text, seconds
        if self.store is not None:
            with self.store.open("a", encoding="utf-8") as fh:
                fh.write(
                    json.dumps(
                        {
                            "identity": self.identity,
                            "image": key[0],
                            "instruction": key[1],
                            "text": text,
                            "seconds": seconds,
                        }
                    )
                    + "\n"
                )


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
            fh.write(
                json.dumps({"case_id": case_id, "lesions": [rec.to_dict() for rec in trace.lesions]}, default=float)
                + "\n"
            )


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
        if path is not None:  # a hub id enters as its text
            _hash_files(digest, path)
    return digest.hexdigest()[:16]


def _hash_files(digest: Any, path: Path, skip_suffixes: tuple[str, ...] = ()) -> None:
    """Feed the names (relative to ``path``) and bytes of a file or a folder's files to ``digest``
    (a folder's files ending in one of ``skip_suffixes`` left out)."""
    files = (
        sorted(f for f in path.rglob("*") if f.is_file() and not f.name.endswith(skip_suffixes))
        if path.is_dir()
        else [path]
    )
    for f in files:
        digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode())
        digest.update(hashlib.sha256(f.read_bytes()).digest())


def content_identity(*paths: str | Path) -> str:
    """A content hash of files and folders (names and bytes, not times): the same for a copy or a
    fresh checkout, new for any changed byte. A folder's Markdown files (its model card) are left
    out: documentation is not the model. A path that does not exist enters as its text."""
    digest = hashlib.sha256()
    for p in paths:
        p = Path(p)
        digest.update(str(p.name).encode())
        if p.exists():
            _hash_files(digest, p, skip_suffixes=(".md",))
        else:
            digest.update(f"absent:{p}".encode())
    return digest.hexdigest()[:16]


def xflow_content_identity(config: str | Path) -> str:
    """:func:`content_identity` of a models file and every local weight folder it names."""
    from monailabel_xflow.workflow.model_config import ModelConfig

    cfg = ModelConfig.load(config)
    paths: list[str | Path] = [config]
    for value in cfg.weights().values():
        _, path = cfg.locate(value)
        paths.append(path if path is not None else str(value))
    return content_identity(*paths)


def xflow_predictors(
    config: str | Path, out: Path, cases: Sequence[EvalCase] = ()
) -> tuple[dict[str, Callable[[EvalCase], np.ndarray]], str]:
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


# --- the trivial baselines ----------------------------------------------------------------------


def region_mask(instruction: Instruction, anatomy: np.ndarray) -> np.ndarray:
    """The whole region an instruction names, from a phantom's anatomy label map.

    Args:
        instruction: the question; its regions are lungs, zones or the heart, or none (chest level).
        anatomy: ``(H, W)`` uint8 label map of ``data.export`` (1..8 the zones in
            :data:`~monailabel_xflow.vocabulary.ALL_ZONES` order, 9 the heart, 0 elsewhere).

    Returns:
        ``(H, W)`` bool: the named lungs' zones, the named zones, the heart, or (no region: chest
        level) both lungs and the heart.
    """
    from monailabel_xflow.vocabulary import ALL_ZONES, HEART, ZONES

    labels: set[int] = set()
    for region in instruction.regions:
        if region == HEART:
            labels.add(len(ALL_ZONES) + 1)
        else:
            labels.update(ALL_ZONES.index(z) + 1 for z in ZONES.get(region, (region,)))
    if not labels:
        labels = set(range(1, len(ALL_ZONES) + 2))
    return np.isin(anatomy, sorted(labels))


def baseline_predictors() -> dict[str, tuple[Callable[[EvalCase], np.ndarray | None], str]]:
    """``{name: (predict, identity)}`` of :data:`BASELINES` on exported phantoms (the anatomy map
    beside the image: ``<image dir>/ground-truth/anatomy/<image name>``).

    Raises (from ``predict``):
        EvaluationError: the phantom's anatomy map is missing.
    """
    from monailabel_xflow.data.export import GT_DIR
    from monailabel_xflow.eval.evaluate import EvaluationError

    def always(case: EvalCase) -> np.ndarray:
        path = case.image_path.parent / GT_DIR / "anatomy" / case.image_path.name
        if not path.is_file():
            raise EvaluationError(f"no anatomy map {path} for the always-present baseline")
        from PIL import Image

        return region_mask(case.instruction, np.asarray(Image.open(path)))

    def question_only(case: EvalCase) -> np.ndarray | None:
        return always(case) if len(case.instruction.regions) >= 2 else None

    return {
        "never-present": (lambda case: None, "baseline:never-present/1"),
        "always-present": (always, "baseline:always-present/1"),
        "question-only": (question_only, "baseline:question-only/1"),
    }


# --- the output folder's manifest ------------------------------------------------------------------


class BenchmarkOutError(InputError):
    """An ``--out`` folder that holds another benchmark (other seed, size, questions, data or
    test-split models) than the one asked for."""


def data_identity(heldout: Path, cases: Sequence[EvalCase]) -> str:
    """A content hash of the questions file and of every image and GT mask the cases use."""
    paths: list[Path] = [heldout]
    for c in cases:
        paths.append(c.image_path)
        if c.mask_path is not None:
            paths.append(c.mask_path)
    digest = hashlib.sha256()
    for p in dict.fromkeys(paths):
        digest.update(p.name.encode())
        digest.update(hashlib.sha256(p.read_bytes()).digest())
    return digest.hexdigest()[:16]


def check_manifest(out: Path, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """Refuse an ``out`` made for another benchmark; return the manifest to write.

    ``wanted`` holds ``split``, ``seed``, ``questions``, ``size`` (and, once the data exist,
    ``data``; once the models are known, ``models``: ``{name: content identity}``). A folder
    without a manifest is accepted only while it holds no phantoms and no results. The dev split
    accepts other models (their records are redone); the test split does not: it is scored once.

    Raises:
        BenchmarkOutError: what differs, and what to do.
    """
    path = out / MANIFEST_NAME
    if not path.is_file():
        if (out / "data").exists() or any((out / m / "results.jsonl").exists() for m in METHODS + BASELINES):
            raise BenchmarkOutError(
                f"{out} holds a benchmark without {MANIFEST_NAME} (made before the manifest "
                "existed, or by hand): its phantoms and results cannot be checked; use a new --out"
            )
        return {"format": MANIFEST_FORMAT, **wanted}
    stored = json.loads(path.read_text())
    for key in ("split", "seed", "questions", "size", "data"):
        if key in wanted and key in stored and stored[key] != wanted[key]:
            raise BenchmarkOutError(
                f"{out} was made with {key} {stored[key]!r}, this run asks {wanted[key]!r}: its "
                "phantoms and results are of another benchmark; use a new --out"
            )
    models = dict(stored.get("models", {}))
    for name, identity in wanted.get("models", {}).items():
        if name in models and models[name] != identity:
            if stored.get("split") == "test":
                raise BenchmarkOutError(
                    f"{out} is a test-split run scored with another {name} model ({models[name]}, "
                    f"now {identity}); the test seed is scored once, with the models chosen on "
                    f"the dev seed: compare models on --seed {DEV_SEED} instead"
                )
            log.warning("benchmark: %s model changed (%s -> %s); its records are redone", name, models[name], identity)
        models[name] = identity
    return {**stored, **{k: v for k, v in wanted.items() if k != "models"}, "models": models}


def _write_manifest(out: Path, manifest: Mapping[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1) + "\n")


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
    seed: int | None = None,
    phantom_size: int = 256,
    methods: Sequence[str] | None = None,
    progress: bool = True,
    plots: bool = True,
    split: str = "dev",
) -> dict[str, Any]:
    """Score every method and the trivial baselines on held-out phantom questions; write the summary.

    Args:
        out: the benchmark folder (``data/`` holds the phantoms; one folder per method;
            ``manifest.json`` says what it holds, see :func:`check_manifest`).
        model: XFlow models file (e.g. ``monailabel_xflow/demo/models.yaml``).
        rosalia: ROSALIA model folder (``RosaliaPredictor.from_pretrained``), or None to leave the
            ``rosalia`` row out.
        questions: held-out questions (split evenly over levels, then over positive/negative).
        seed: phantom seed; default the split's (:data:`DEV_SEED` or :data:`TEST_SEED`).
        phantom_size: phantom side in pixels (the demo trained on 256).
        methods: subset of :data:`METHODS` (default: all available); the baselines always run.
        progress: tqdm bars.
        plots: write the PNG plots and the contact sheet.
        split: ``"dev"`` (every choice is made here) or ``"test"`` (the report's run, once).

    Returns:
        The summary dict (also ``OUT/benchmark.json``).

    Raises:
        ValueError: an unknown method or split, ``rosalia`` asked for without a ROSALIA model, or
            the training seed.
        BenchmarkOutError: ``out`` holds another benchmark.
    """
    from monailabel_xflow.data.readers import read_mimic_ils
    from monailabel_xflow.eval.evaluate import evaluate
    from monailabel_xflow.training.demo import export_heldout

    out = Path(out)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    seed = SPLITS[split] if seed is None else int(seed)
    if seed == TRAIN_SEED:
        raise ValueError(f"seed {TRAIN_SEED} drew the demos' training phantoms; score held-out seeds only")
    wanted = list(methods) if methods else [m for m in METHODS if m != "rosalia" or rosalia is not None]
    unknown = [m for m in wanted if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if "rosalia" in wanted and rosalia is None:
        raise ValueError("method 'rosalia' needs a ROSALIA model (--rosalia CONFIG)")
    setup = {"split": split, "seed": seed, "questions": int(questions), "size": int(phantom_size)}
    _write_manifest(out, check_manifest(out, setup))
    heldout = export_heldout(out / "data", seed=seed, questions=questions, size=phantom_size, progress=progress)
    cases = interleaved(read_mimic_ils(heldout, split="test", kinds=("basic", "global")).cases)
    log.info("benchmark (%s split, seed %d): %d held-out questions from %s", split, seed, len(cases), heldout)
    identities = {}
    if "rosalia" in wanted:
        identities["rosalia"] = content_identity(rosalia)
    if any(m != "rosalia" for m in wanted):
        identities["xflow"] = xflow_content_identity(model)
    _write_manifest(out, check_manifest(out, {**setup, "data": data_identity(heldout, cases), "models": identities}))

    predictors: dict[str, tuple[Callable, str]] = dict(baseline_predictors())
    if "rosalia" in wanted:
        predict, identity = rosalia_predictor(rosalia, out)
        # the inference changed (no equalisation, the reference tokenisation): old records are redone
        predictors["rosalia"] = (predict, f"{identity}:inference-2")
    xflow_methods = [m for m in wanted if m != "rosalia"]
    if xflow_methods:
        fns, identity = xflow_predictors(model, out, cases)
        predictors.update({m: (fns[m], f"{identity}:{m}") for m in xflow_methods})
    for m in list(BASELINES) + wanted:
        fn, identity = predictors[m]
        (out / m).mkdir(parents=True, exist_ok=True)
        log.info("benchmark: %s", METHOD_TITLES[m])
        evaluate(
            cases,
            fn,
            out / m,
            predictor_id=identity,
            progress=progress and m not in BASELINES,
            save_predictions=m not in BASELINES,
            title=f"{METHOD_TITLES[m]} on {len(cases)} held-out phantom questions",
            plots=plots and m not in BASELINES,
        )
    return write_summary(out, list(BASELINES) + [m for m in METHODS if m in wanted], cases, plots=plots)


# --- the summary -------------------------------------------------------------------------------


def _records(folder: Path, cases: Sequence[EvalCase]) -> dict[str, dict[str, Any]]:
    from monailabel_xflow.eval.evaluate import load_results

    stored = load_results(folder)
    return {c.case_id: stored[c.case_id] for c in cases if "stats" in stored.get(c.case_id, {})}


def _iou(record: Mapping[str, Any]) -> float:
    from monailabel_xflow.metrics import SampleStats

    return SampleStats.from_dict(record["stats"]).iou


def stage2_effect(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]], tol: float = 1e-9
) -> dict[str, Any]:
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
    return {
        "n": len(shared),
        "changed": changed,
        "iou_up": up,
        "iou_down": down,
        "mean_iou_delta": float(np.mean(deltas)) if deltas else None,
        "presence_gained": gained,
        "presence_lost": lost,
    }


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


def _ci(c: Mapping[str, Any] | None, digits: int = 3, sign: bool = False) -> str:
    """``value [low, high]`` of an :func:`~monailabel_xflow.eval.bootstrap.interval`."""
    if not c or c.get("value") is None:
        return "—"
    fmt = f"{{:{'+' if sign else ''}.{digits}f}}"
    if c.get("low") is None:
        return fmt.format(c["value"])
    return f"{fmt.format(c['value'])} [{fmt.format(c['low'])}, {fmt.format(c['high'])}]"


CLAIMS = (
    # (claim, the paper's figures, metric, a, b): the claim is that a - b > 0
    ("XFlow segments better than ROSALIA (gIoU, Table 1)", "0.703 vs 0.621", "giou", "stage1+2", "rosalia"),
    ("XFlow segments better than ROSALIA (cIoU, Table 1)", "0.731 vs 0.688", "ciou", "stage1+2", "rosalia"),
    ("XFlow decides presence better than ROSALIA (F1, Table 1)", "0.961 vs 0.945", "f1", "stage1+2", "rosalia"),
    (
        "ROSALIA's masks have more excess components than XFlow's (ΔC, Table 3)",
        "+5.63 vs +1.71",
        "delta_c",
        "rosalia",
        "stage1+2",
    ),
    ("... the same, on the positives every method drew", "—", "delta_c_all_drew", "rosalia", "stage1+2"),
    ("ROSALIA's masks have more specks than XFlow's (Table 3)", "5.57 vs 1.69", "specks", "rosalia", "stage1+2"),
    ("Stage 2 adds to Stage 1 (gIoU, Table 2)", "+0.010", "giou", "stage1+2", "stage1"),
    ("Stage 2 makes masks cleaner (Stage 1 ΔC − Stage 1 + 2 ΔC)", "—", "delta_c", "stage1", "stage1+2"),
    ("XFlow's presence beats always answering present (F1)", "—", "f1", "stage1+2", "always-present"),
    ("ROSALIA's presence beats always answering present (F1)", "—", "f1", "rosalia", "always-present"),
    ("XFlow segments better than drawing the whole region (gIoU)", "—", "giou", "stage1+2", "always-present"),
    (
        "XFlow's zone-level presence beats reading the question alone (zone F1)",
        "—",
        "zone/f1",
        "stage1+2",
        "question-only",
    ),
    ("ROSALIA segments better than drawing the whole region (gIoU)", "—", "giou", "rosalia", "always-present"),
    ("Oracle clicks add to Stage 1 (gIoU; headroom for revision, not a paper claim)", "—", "giou", "oracle", "stage1"),
)
"""The claims table: paired differences with bootstrap intervals over phantoms."""


def verdict(diff: Mapping[str, Any]) -> str:
    """ "reproduced" when the interval of a - b lies above 0, "reversed" below, else "not shown"."""
    if diff.get("low") is None:
        return "—"
    if diff["low"] > 0:
        return "reproduced"
    if diff["high"] < 0:
        return "reversed"
    return "not shown (CI includes 0)"


def bootstrap_summary(
    out: Path,
    methods: Sequence[str],
    cases: Sequence[EvalCase],
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """Every figure of the summary with a bootstrap 95 % interval over phantoms, and the claims.

    Only questions every method scored enter (so differences are paired); the positives every
    model method drew a mask on (the baselines aside) give ``delta_c_all_drew``.

    Returns:
        ``{"n", "n_images", "replicates", "seed", "all_drew": {"n", "n_positive"}, "methods":
        {m: {metric: interval}}, "findings": {m: {finding: interval of gIoU}}, "claims": [...]}``.
    """
    from monailabel_xflow.eval.bootstrap import Scored, interval, metrics, resample_weights

    records = {m: _records(out / m, cases) for m in methods}
    common = [c for c in cases if all(c.case_id in records[m] for m in methods)]
    groups = [str(c.image_path) for c in common]
    scored = {m: Scored.from_records([records[m][c.case_id] for c in common], groups) for m in methods}
    first = next(iter(scored.values()))
    models = [m for m in methods if m not in BASELINES]
    all_drew = first.positive.copy()
    for m in models:
        all_drew &= scored[m].drawn
    weights = resample_weights(first.group, replicates, seed)
    ones = np.ones((1, len(common)))

    def figures(m: str, w: np.ndarray) -> dict[str, np.ndarray]:
        f = metrics(scored[m], w)
        f["delta_c_all_drew"] = metrics(scored[m], w, subset=all_drew)["delta_c"]
        return f

    point = {m: {k: float(v[0]) for k, v in figures(m, ones).items()} for m in methods}
    boot = {m: figures(m, weights) for m in methods}
    result: dict[str, Any] = {
        "n": len(common),
        "n_images": int(first.group.max()) + 1 if len(common) else 0,
        "unit": "phantom",
        "replicates": replicates,
        "seed": seed,
        "all_drew": {"n": int(all_drew.sum()), "n_positive": int(first.positive.sum()), "methods": models},
        "methods": {m: {k: interval(boot[m][k], point[m][k]) for k in point[m]} for m in methods},
        "findings": {},
        "claims": [],
    }
    for m in methods:
        per = {}
        for finding in FINDINGS:
            subset = np.asarray([c.finding == finding for c in common])
            if subset.any():
                per[finding] = interval(
                    metrics(scored[m], weights, subset)["giou"], float(metrics(scored[m], ones, subset)["giou"][0])
                )
        result["findings"][m] = per
    for claim, paper, metric, a, b in CLAIMS:
        if a in methods and b in methods:
            diff = interval(boot[a][metric] - boot[b][metric], point[a][metric] - point[b][metric])
            result["claims"].append(
                {
                    "claim": claim,
                    "paper": paper,
                    "metric": metric,
                    "a": a,
                    "b": b,
                    "difference": diff,
                    "verdict": verdict(diff),
                }
            )
    return result


def write_summary(
    out: str | Path, methods: Sequence[str], cases: Sequence[EvalCase], plots: bool = True
) -> dict[str, Any]:
    """``OUT/benchmark.md`` and ``benchmark.json`` from the methods' records, plus the figures.

    Every table carries bootstrap 95 % intervals over phantoms (:func:`bootstrap_summary`); the
    split and seed come from ``OUT/manifest.json``.

    Args:
        out: the benchmark folder holding ``<method>/report.json`` and ``results.jsonl``.
        methods: the methods to put side by side, in table order (baselines included).
        cases: the questions (for the case-by-case comparisons and the contact sheet).
        plots: also write ``levels.png``, ``findings.png`` and ``contact-sheet.png``.

    Raises:
        EvaluationError: a prediction the contact sheet draws is missing.
    """
    out = Path(out)
    manifest = json.loads((out / MANIFEST_NAME).read_text()) if (out / MANIFEST_NAME).is_file() else {}
    reports = {m: json.loads((out / m / "report.json").read_text()) for m in methods}
    records = {m: _records(out / m, cases) for m in methods}
    ids = {c.case_id for c in cases}
    boot = bootstrap_summary(out, methods, cases)
    protocol = {
        "split": manifest.get("split"),
        "seed": manifest.get("seed"),
        "dev_seed": DEV_SEED,
        "test_seed": TEST_SEED,
        "train_seed": TRAIN_SEED,
        "size": manifest.get("size"),
        "data": manifest.get("data"),
        "models": manifest.get("models", {}),
    }
    summary: dict[str, Any] = {"questions": len(cases), "protocol": protocol, "methods": {}, "bootstrap": boot}
    for m in methods:
        r = reports[m]
        summary["methods"][m] = {
            "title": METHOD_TITLES[m],
            "average": r["average"],
            "levels": r["levels"],
            "noise": r["noise"],
            "findings": {f: e["average"] for f, e in r["findings"].items()},
            "latency": _latency(out / m, ids),
            "n_scored": r["n_scored"],
            "errors": len(r["errors"]),
            "ci": boot["methods"][m],
        }
    effects = {}
    for a, b in (("stage1", "stage1+2"), ("stage1", "oracle")):
        if a in records and b in records:
            effects[f"{a} -> {b}"] = stage2_effect(records[a], records[b])
    summary["revision"] = effects

    split = protocol["split"] or "unrecorded"
    lines = [
        f"# ROSALIA beside XFlow on {len(cases)} held-out phantom questions ({split} split, seed {protocol['seed']})",
        "",
        "Generated by `xflow benchmark phantom` (monailabel_xflow/eval/phantom_benchmark.py); the "
        "hand-written conclusions are in README.md.",
        "",
        f"Protocol: choices are made on the dev seed ({DEV_SEED}); the test seed ({TEST_SEED}) is scored once "
        f"for the report; the demos trained on seed {TRAIN_SEED}. Every figure: value [bootstrap 95 % interval], "
        f"{boot['replicates']} resamplings of the {boot['n_images']} phantoms (questions of one phantom move "
        f"together), {boot['n']} questions every method scored. Levels averaged with equal weight.",
        "",
        "## Segmentation, presence and mask noise (paper Tables 1 and 3)",
        "",
        "ΔC = components(pred) − components(GT) over positives; specks = components < 0.1 % of the image "
        f"(8-connectivity). ΔC (all drew): over the {boot['all_drew']['n']} of {boot['all_drew']['n_positive']} "
        "positives on which every model method drew a mask.",
        "",
        "| Method | gIoU | cIoU | F1 | N-Acc | ΔC | ΔC (all drew) | Specks |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in methods:
        c = boot["methods"][m]
        all_drew = "—" if m in BASELINES else _ci(c["delta_c_all_drew"], 2, True)  # a subset the models chose
        lines.append(
            f"| {METHOD_TITLES[m]} | {_ci(c['giou'])} | {_ci(c['ciou'])} | {_ci(c['f1'])} | {_ci(c['n_acc'])} | "
            f"{_ci(c['delta_c'], 2, True)} | {all_drew} | {_ci(c['specks'], 2)} |"
        )
    gt_noise = reports[methods[0]]["noise"] if methods else None
    if gt_noise:
        lines.append(f"| Ground truth | — | — | — | — | — | — | {_f(gt_noise['gt_specks'], 2)} |")
    for key, label in (("giou", "gIoU"), ("f1", "presence F1"), ("n_acc", "N-Acc")):
        lines += [
            "",
            f"## {label} per level",
            "",
            "| Method | " + " | ".join(LEVELS) + " |",
            "|---|" + "---|" * len(LEVELS),
        ]
        for m in methods:
            c = boot["methods"][m]
            lines.append(f"| {METHOD_TITLES[m]} | " + " | ".join(_ci(c.get(f"{lv}/{key}")) for lv in LEVELS) + " |")
    lines += [
        "",
        "## gIoU per finding (equal-weight average over the levels it is asked at)",
        "",
        "| Finding | " + " | ".join(METHOD_TITLES[m] for m in methods) + " |",
        "|---|" + "---|" * len(methods),
    ]
    for f in FINDINGS:
        lines.append(f"| {f} | " + " | ".join(_ci(boot["findings"][m].get(f)) for m in methods) + " |")
    if boot["claims"]:
        lines += [
            "",
            "## The paper's claims: paired differences (a − b) with bootstrap 95 % intervals",
            "",
            "A claim reads *reproduced* only when the interval lies above 0.",
            "",
            "| Claim | Paper | a − b | Difference | Verdict |",
            "|---|---|---|---|---|",
        ]
        for c in boot["claims"]:
            lines.append(
                f"| {c['claim']} | {c['paper']} | {METHOD_TITLES[c['a']]} − {METHOD_TITLES[c['b']]} | "
                f"{_ci(c['difference'], 3, True)} | {c['verdict']} |"
            )
    if effects:
        lines += [
            "",
            "## What revision changed, question by question",
            "",
            "| Revision | Questions | Masks changed | IoU up | IoU down | Mean IoU change (positives) | "
            "Presence gained / lost | gIoU change [95 % interval] |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, e in effects.items():
            a, b = name.split(" -> ")
            claim = next((c for c in boot["claims"] if (c["a"], c["b"], c["metric"]) == (b, a, "giou")), None)
            lines.append(
                f"| {METHOD_TITLES[a]} → {METHOD_TITLES[b]} | {e['n']} | {e['changed']} | {e['iou_up']} | "
                f"{e['iou_down']} | {_f(e['mean_iou_delta'], 4)} | {e['presence_gained']} / {e['presence_lost']} | "
                f"{_ci(claim['difference'], 3, True) if claim else '—'} |"
            )
    lat = {m: summary["methods"][m]["latency"] for m in methods if summary["methods"][m]["latency"]}
    if lat:
        base = lat.get("stage1+2")
        lines += [
            "",
            "## Latency per question (this machine, CPU, as measured during the run; a measurement, "
            "not an estimate: no interval)",
            "",
            "| Method | Questions timed | Mean s | Median s | Mean ÷ XFlow Stage 1 + 2 |",
            "|---|---|---|---|---|",
        ]
        for m, v in lat.items():
            ratio = _f(v["mean_s"] / base["mean_s"], 2) if base else "—"
            lines.append(f"| {METHOD_TITLES[m]} | {v['n']} | {_f(v['mean_s'], 2)} | {_f(v['median_s'], 2)} | {ratio} |")
    figures = []
    if plots:
        drawn = [m for m in methods if m not in BASELINES]
        figures = _plots(out, summary, methods) + [_contact_sheet(out, drawn, cases, records)]
        lines += ["", "## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures]
    (out / SUMMARY_MD).write_text("\n".join(lines) + "\n")
    (out / SUMMARY_JSON).write_text(json.dumps(summary, indent=1, default=float))
    return summary


def _bounds(ci: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """``(low, high)`` of an interval, or None."""
    return None if not ci or ci.get("low") is None else (ci["low"], ci["high"])


def _plots(out: Path, summary: Mapping[str, Any], methods: Sequence[str]) -> list[Path]:
    """``levels.png`` (gIoU, F1, N-Acc per level) and ``findings.png`` (gIoU and F1 per finding),
    with the bootstrap 95 % intervals as error bars (gIoU only per finding)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from monailabel_xflow.eval.evaluate import _grouped_bars

    titles = [METHOD_TITLES[m] for m in methods]
    written = []
    groups = list(LEVELS) + ["average"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for ax, (key, label) in zip(axes, (("giou", "gIoU"), ("f1", "presence F1"), ("n_acc", "N-Acc")), strict=True):
        series, intervals = {}, {}
        for m, t in zip(methods, titles, strict=True):
            s = summary["methods"][m]
            series[t] = [(s["average"] if g == "average" else s["levels"].get(g, {})).get(key) for g in groups]
            intervals[t] = [_bounds(s.get("ci", {}).get(key if g == "average" else f"{g}/{key}")) for g in groups]
        _grouped_bars(ax, groups, series, intervals=intervals)
        ax.set_title(label)
        ax.set_ylim(0, 1)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    written.append(out / "levels.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    boot_findings = summary.get("bootstrap", {}).get("findings", {})
    for ax, (key, label) in zip(axes, (("giou", "gIoU"), ("f1", "presence F1")), strict=True):
        intervals = (
            {
                t: [_bounds(boot_findings.get(m, {}).get(f)) for f in FINDINGS]
                for m, t in zip(methods, titles, strict=True)
            }
            if key == "giou"
            else None
        )
        _grouped_bars(
            ax,
            list(FINDINGS),
            {
                t: [summary["methods"][m]["findings"].get(f, {}).get(key) for f in FINDINGS]
                for m, t in zip(methods, titles, strict=True)
            },
            rotation=20,
            intervals=intervals,
        )
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


def _contact_sheet(
    out: Path, methods: Sequence[str], cases: Sequence[EvalCase], records: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> Path:
    """Rows: questions; columns: the GT, then each method's mask (red) over the GT outline (green).

    Raises:
        EvaluationError: a method has no record or no prediction file for a drawn question.
    """
    from PIL import Image

    from monailabel_xflow.eval.evaluate import EvaluationError
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
            record = records[m].get(case.case_id)
            if record is None or not png.is_file():
                raise EvaluationError(
                    f"{METHOD_TITLES[m]} has no {'prediction file ' + str(png) if record else 'scored record'} "
                    f"for {case.case_id}: rerun the benchmark (it predicts what is missing); "
                    "a missing prediction is never drawn as empty"
                )
            pred = np.asarray(Image.open(png)) > 0
            pred = pred if pred.shape == image.shape else resize_mask(pred, image.shape)
            tiles.append(overlay(overlay(image, [gt], colors=[GT_COLOUR], alpha=0.0), [pred], colors=[PRED_COLOUR]))
            score = f"IoU {_iou(record):.2f}" if case.positive else ("empty" if not pred.any() else "drawn")
            titles.append(f"{METHOD_TITLES[m]} {score}")
    sheet = contact_sheet(
        tiles,
        titles,
        ncols=1 + len(methods),
        tile_size=200,
        legend=[("ground truth", GT_COLOUR), ("prediction", PRED_COLOUR)],
    )
    path = out / "contact-sheet.png"
    Image.fromarray(sheet).save(path, optimize=True)
    return path
