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

The parts, one module each: what is compared and where ``OUT`` keeps it
(:mod:`~monailabel_xflow.eval.phantom_protocol`), the model methods
(:mod:`~monailabel_xflow.eval.phantom_methods`), the trivial baselines
(:mod:`~monailabel_xflow.eval.phantom_baselines`), the manifest and content identities
(:mod:`~monailabel_xflow.eval.phantom_manifest`), the bootstrap intervals and claims
(:mod:`~monailabel_xflow.eval.phantom_statistics`), the Markdown / JSON summary
(:mod:`~monailabel_xflow.eval.phantom_report`) and the figures
(:mod:`~monailabel_xflow.eval.phantom_plots`); this module runs them (:func:`run_benchmark`) and
re-exports their public names. Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.eval.evaluate import Predictor
from monailabel_xflow.eval.phantom_baselines import baseline_predictors, region_mask
from monailabel_xflow.eval.phantom_manifest import (
    BenchmarkOutError,
    check_manifest,
    content_identity,
    data_identity,
    stage1_identity,
    write_manifest,
    xflow_content_identity,
)
from monailabel_xflow.eval.phantom_methods import GroundTruthReviser, SharedStage1, rosalia_predictor, xflow_predictors
from monailabel_xflow.eval.phantom_plots import contact_cases
from monailabel_xflow.eval.phantom_protocol import (
    BASELINES,
    DEV_SEED,
    METHOD_TITLES,
    METHODS,
    SPENT_TEST_SEEDS,
    SPLITS,
    TEST_SEED,
    TRAIN_SEED,
)
from monailabel_xflow.eval.phantom_report import write_summary
from monailabel_xflow.eval.phantom_statistics import CLAIMS, bootstrap_summary, stage2_effect, verdict

__all__ = [
    "METHODS",
    "BASELINES",
    "METHOD_TITLES",
    "TRAIN_SEED",
    "DEV_SEED",
    "TEST_SEED",
    "SPLITS",
    "CLAIMS",
    "BenchmarkOutError",
    "SharedStage1",
    "stage1_identity",
    "GroundTruthReviser",
    "xflow_predictors",
    "rosalia_predictor",
    "baseline_predictors",
    "region_mask",
    "content_identity",
    "xflow_content_identity",
    "data_identity",
    "check_manifest",
    "interleaved",
    "run_benchmark",
    "write_summary",
    "bootstrap_summary",
    "stage2_effect",
    "verdict",
    "contact_cases",
]

log = logging.getLogger(__name__)


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
        ValueError: an unknown method or split, ``rosalia`` asked for without a ROSALIA model, the
            training seed, or a test seed on the dev split.
        BenchmarkOutError: ``out`` holds another benchmark.
    """
    from monailabel_xflow.data.readers import read_mimic_ils
    from monailabel_xflow.eval.evaluate import evaluate
    from monailabel_xflow.training.demo_data import export_heldout

    out = Path(out)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {list(SPLITS)}")
    seed = SPLITS[split] if seed is None else int(seed)
    if seed == TRAIN_SEED:
        raise ValueError(f"seed {TRAIN_SEED} drew the demos' training phantoms; score held-out seeds only")
    if split == "dev" and seed in (TEST_SEED, *SPENT_TEST_SEEDS):
        raise ValueError(f"seed {seed} is a test seed; make dev choices on other seeds (--test reproduces a report)")
    wanted = list(methods) if methods else [m for m in METHODS if m != "rosalia" or rosalia is not None]
    unknown = [m for m in wanted if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(METHODS)}")
    if "rosalia" in wanted and rosalia is None:
        raise ValueError("method 'rosalia' needs a ROSALIA model (--rosalia CONFIG)")
    setup = {"split": split, "seed": seed, "questions": int(questions), "size": int(phantom_size)}
    write_manifest(out, check_manifest(out, setup))
    heldout = export_heldout(out / "data", seed=seed, questions=questions, size=phantom_size, progress=progress)
    cases = interleaved(read_mimic_ils(heldout, split="test", kinds=("basic", "global")).cases)
    log.info("benchmark (%s split, seed %d): %d held-out questions from %s", split, seed, len(cases), heldout)
    identities = {}
    if rosalia is not None and "rosalia" in wanted:
        identities["rosalia"] = content_identity(rosalia)
    if any(m != "rosalia" for m in wanted):
        identities["xflow"] = xflow_content_identity(model)
    write_manifest(out, check_manifest(out, {**setup, "data": data_identity(heldout, cases), "models": identities}))

    predictors: dict[str, tuple[Predictor, str]] = dict(baseline_predictors())
    if rosalia is not None and "rosalia" in wanted:
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
