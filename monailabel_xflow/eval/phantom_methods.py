"""The model methods of the phantom benchmark: XFlow's three and ROSALIA, each as ``predict(case)``.

- ``stage1``, ``stage1+2`` and ``oracle`` (:func:`xflow_predictors`) share one loaded XFlow and one
  Stage 1 text per question (:class:`SharedStage1`: greedy decoding gives the same text every
  time), so they differ only in what happens after Stage 1; ``oracle`` replaces π_rev by the
  simulated user of Algorithm 1 holding the ground truth (:class:`GroundTruthReviser`).
- ``rosalia`` (:func:`rosalia_predictor`): the one-shot baseline, the image encoded once per study.

Each predictor appends its per-question wall time to ``OUT/<method>/latency.jsonl`` and, after
Stage 2, what revision did to ``OUT/<method>/revisions.jsonl``. Heavy imports happen inside the
functions.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.eval.evaluate import Predictor
from monailabel_xflow.eval.phantom_manifest import stage1_identity
from monailabel_xflow.eval.phantom_protocol import LATENCY_NAME, REVISIONS_NAME, STAGE1_NAME, case_gt
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.base import Stage1Policy
from monailabel_xflow.policy.oracle import GroundTruthReviser

__all__ = ["SharedStage1", "GroundTruthReviser", "xflow_predictors", "rosalia_predictor"]


class SharedStage1:
    """A Stage 1 policy whose text for one (image, instruction) is computed once.

    Wraps π_init so that the Stage-1-only, Stage 1 + 2 and oracle runs of one benchmark see the
    same boxes (as the paper's ablation does) and the policy runs once per question. With a
    ``store`` the texts also outlive the process (one JSON line each, tagged with the model's
    ``identity``; lines of another model are ignored), so a resumed or repeated run of the same
    model does not generate them again.

    Args:
        policy: a ``Stage1Policy`` (``stage1(image, instruction) -> str``; its ``stage1_many`` is
            used when it has one).
        store: JSON-lines file of computed texts, or None.
        identity: the model's identity (:func:`~monailabel_xflow.eval.phantom_manifest.stage1_identity`).

    Attributes:
        seconds: seconds the wrapped policy took per key (``(image digest, instruction text)``).
    """

    def __init__(self, policy: Stage1Policy, store: Path | None = None, identity: str = "") -> None:
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
    def key(image: NDArray[Any], instruction: Instruction) -> tuple[str, str]:
        """The cache key of one question: ``(sha1 of the image's bytes, instruction text)``."""
        return hashlib.sha1(np.ascontiguousarray(image).tobytes()).hexdigest(), instruction.text

    def stage1(self, image: NDArray[np.float32], instruction: Instruction) -> str:
        """The Stage 1 text of one question, computed by the wrapped policy the first time only."""
        key = self.key(image, instruction)
        if key not in self._texts:
            start = time.perf_counter()
            text = self.policy.stage1(image, instruction)
            self._remember(key, text, time.perf_counter() - start)
        return self._texts[key]

    def stage1_many(self, image: NDArray[np.float32], instructions: Sequence[Instruction]) -> list[str]:
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


def xflow_predictors(config: str | Path, out: Path, cases: Sequence[EvalCase] = ()) -> tuple[dict[str, Predictor], str]:
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
    images: dict[Path, NDArray[np.float32]] = {}
    by_image: dict[Path, list[Instruction]] = {}
    for c in cases:
        by_image.setdefault(c.image_path, []).append(c.instruction)

    def image_of(case: EvalCase) -> NDArray[np.float32]:
        if case.image_path not in images:
            images.clear()  # questions come grouped by study: keep one image
            images[case.image_path] = load_cxr(case.image_path)[0]
        return images[case.image_path]

    def method(name: str) -> Predictor:
        timer = _Timed(out / name / LATENCY_NAME)
        revisions = _Revisions(out / name / REVISIONS_NAME)

        def predict(case: EvalCase) -> NDArray[Any]:
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
                result = flow.run(image, case.instruction, reviser=GroundTruthReviser(case_gt(case, image.shape)))
            seconds = result.trace.timings["total"]
            if cached:  # the policy's time was spent by an earlier method; count it here too
                seconds += shared.seconds[key] - result.trace.timings.get("stage1", 0.0)
            timer.add(case.case_id, seconds)
            if name != "stage1":
                revisions.add(case.case_id, result.trace)
            return result.mask

        return predict

    return {m: method(m) for m in ("stage1", "stage1+2", "oracle")}, identity


def rosalia_predictor(folder: str | Path, out: Path) -> tuple[Predictor, str]:
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

    def predict(case: EvalCase) -> NDArray[Any]:
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
