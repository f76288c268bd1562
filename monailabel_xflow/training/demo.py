"""The demo model: a small XFlow trained on phantom radiographs, with this project's own trainers.

Real XFlow weights cannot be fetched everywhere; the demo makes the app and ``xflow segment`` do
their job out of the box, on synthetic phantoms only (it is **not** for clinical images). The
recipe (``xflow train demo``, or ``python -m monailabel_xflow.training.demo``) runs every step a
real training runs, at a size a CPU trains:

1. **Data**: a phantom training set (:func:`~monailabel_xflow.data.export.export_set`, 256 px)
   read as MIMIC-ILS questions; every split of it is training data (the held-out evaluation set
   is drawn with a different seed, :func:`export_heldout`).
2. **F_seg** (in a second process, while π_init trains): a randomly initialised
   ``Sam3TrackerModel`` of reduced size and a 336 px input
   (:func:`~monailabel_xflow.segmenter.configs.build_random_sam3`), trained end to end with the project
   trainer (:func:`~monailabel_xflow.training.segmenter.finetune_segmenter`: SAM 2 loss, jittered
   box + click prompts). At 336 px a step costs ~1/10 of one at SAM3's 1008 px, which is what
   makes a from-scratch encoder trainable on a CPU.
3. **Base VLM**: a randomly initialised ``Gemma3ForConditionalGeneration`` of :data:`DEMO_VLM_SPEC`'s size
   (128 px images, patch 16, 16 image tokens; 128-wide vision and text) with the offline
   tokenizer of :mod:`~monailabel_xflow.policy.configs` (single-digit tokens, protocol tags).
3b. **Vision pre-training** (``vision_steps > 0``): the base's tower and projector trained alone
   on every ``init-sft`` question, presence per finding and region plus lesion cells per finding
   (:mod:`~monailabel_xflow.training.vision_pretrain`), the stand-in for MedGemma's pretrained
   image encoder; the policies start from that base (``sft_vision_lr_scale`` 0 keeps it frozen
   in π_init SFT).
4. **π_init SFT** on ``init-sft`` rows (:mod:`~monailabel_xflow.training.builders`),
   presence-balanced (:func:`balanced_presence`: phantom questions are ~13 % positive), with
   :func:`~monailabel_xflow.training.sft.train_sft` and the auxiliary mask loss **on**, one
   channel per finding (without it a from-scratch VLM ignores the image); LoRA rank
   = text width, so the adapter can move the random language model anywhere; vision tower trained.
5. **π_rev SFT** on ``rev-sft`` rows (oracle trajectories with the fine-tuned F_seg in the loop),
   warm-started from π_init.
6. **GRPO**, short: ``init-rl`` then ``rev-rl`` with
   :func:`~monailabel_xflow.training.grpo.train_grpo` (F_seg frozen in the loop).
7. **Packaging**: ``OUT/model/`` holds ``base/`` (model + processor), ``init/`` and ``rev/``
   (peft adapters), ``segmenter/`` (Hugging Face ``save_pretrained``), ``models.yaml`` (Stage 1 + 2),
   ``models-stage1.yaml`` (Stage 1 only, for the ablation), ``recipe.json`` and the model card
   ``README.md``. ``--install`` copies it to :data:`monailabel_xflow.workflow.model_config.DEMO_DIR`.

Everything is drawn from ``--seed``: phantoms, initial weights, prompts, data order.
Intermediate outputs live under ``OUT/work`` and are reused when the recipe is rerun with the
same settings (delete the folder to start afresh).

The recipe's parts, one module each: its settings (:mod:`~monailabel_xflow.training.demo_recipe`),
its data and balancing (:mod:`~monailabel_xflow.training.demo_data`), its phases
(:mod:`~monailabel_xflow.training.demo_phases`) and the packaging with the model card
(:mod:`~monailabel_xflow.training.demo_package`); this module runs them (:func:`train_demo`), owns
the command line (:func:`build_parser`, :func:`run`) and re-exports their public names. Heavy
imports (torch, transformers, datasets) happen inside the functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.training.demo_data import (
    balanced_presence,
    balanced_questions,
    balanced_revisions,
    export_heldout,
    export_phantoms,
    training_cases,
)
from monailabel_xflow.training.demo_package import model_card, package
from monailabel_xflow.training.demo_phases import (
    DemoRun,
    Phases,
    base_vlm_phase,
    data_phase,
    finish_segmenter_phase,
    init_sft_phase,
    package_phase,
    rev_sft_phase,
    rl_phase,
    set_threads,
    start_segmenter_phase,
)
from monailabel_xflow.training.demo_recipe import (
    DEMO_VLM_SIZE,
    DEMO_VLM_SPEC,
    QUICK,
    DemoRecipe,
    build_demo_vlm,
    recipe_fingerprint,
)

log = logging.getLogger(__name__)

__all__ = [
    "DemoRecipe",
    "QUICK",
    "DEMO_VLM_SIZE",
    "DEMO_VLM_SPEC",
    "balanced_questions",
    "balanced_presence",
    "balanced_revisions",
    "build_demo_vlm",
    "export_heldout",
    "export_phantoms",
    "training_cases",
    "recipe_fingerprint",
    "package",
    "model_card",
    "train_demo",
    "build_parser",
    "run",
    "main",
]


def train_demo(out: str | Path, recipe: DemoRecipe | None = None, progress: bool = True) -> Path:
    """Run the whole recipe into ``out`` and return the packaged model folder ``out/model``.

    The phases, in order: data -> F_seg (in parallel with the policy when ``recipe.parallel``)
    -> base VLM -> π_init SFT -> π_rev trajectories and SFT -> GRPO -> package. Each finished
    phase is recorded in ``out/work/phases.json`` and skipped when the recipe is rerun unchanged.

    Args:
        out: working folder (``out/work`` intermediate outputs, ``out/model`` the result).
        recipe: sizes and steps (default :class:`DemoRecipe`).
        progress: show progress bars.

    Returns:
        ``out/model``, loadable with ``ModelConfig.from_file(out/model/models.yaml)``.
    """
    recipe = recipe or DemoRecipe()
    out = Path(out)
    (out / "work").mkdir(parents=True, exist_ok=True)
    set_threads(recipe.threads)
    total_start = time.perf_counter()
    run = DemoRun(
        recipe, out, progress, Phases(out / "work", recipe_fingerprint(recipe)), np.random.default_rng(recipe.seed)
    )

    json_path, cases = data_phase(run)
    pending = start_segmenter_phase(run, json_path)
    base_vlm_phase(run)
    init_sft = init_sft_phase(run, json_path, cases)
    seg_info = finish_segmenter_phase(run, pending)
    rev_sft, rev_cases, clicker = rev_sft_phase(run, cases, init_sft)
    init_final, rev_final = rl_phase(run, cases, rev_cases, init_sft, rev_sft, clicker)
    return package_phase(run, init_final, rev_final, seg_info, total_start)


# --- command line -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xflow train demo",
        description="Train the demo XFlow (small F_seg, π_init, π_rev) on phantoms: SFT then a short GRPO "
        "phase, about 30 min on two CPU cores. Trained on synthetic phantoms; not for clinical images.",
    )
    p.add_argument("--out", type=Path, default=Path("demo-run"), help="working folder (default ./demo-run)")
    p.add_argument("--seed", type=int, default=0, help="seed of everything (default 0)")
    p.add_argument("--quick", action="store_true", help="toy scale (seconds): checks the recipe, learns nothing")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a DemoRecipe field, e.g. --set init_sft_steps=300 (repeatable)",
    )
    p.add_argument(
        "--install", action="store_true", help="copy the result to the package's demo folder (monailabel_xflow/demo/)"
    )
    p.add_argument(
        "--heldout",
        type=Path,
        default=None,
        metavar="DIR",
        help="also export the 200-question held-out evaluation set there (seed + 1000)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _recipe_from_args(args: argparse.Namespace) -> DemoRecipe:
    base = QUICK if args.quick else DemoRecipe()
    values: dict[str, Any] = {"seed": args.seed}
    types = {f.name: type(getattr(base, f.name)) for f in dataclasses.fields(DemoRecipe)}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or key not in types:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of {sorted(types)}")
        if types[key] is bool:
            values[key] = value.strip().lower() in ("1", "true", "yes", "on")
        else:
            values[key] = types[key](value)
    recipe = dataclasses.replace(base, **values)
    reused = {
        "segmenter_from": ("config.json", "model.safetensors"),
        "seg_init_from": ("config.json", "model.safetensors"),
        "init_from": ("adapter_config.json",),
        "vision_from": ("config.json",),
        "rev_from": ("adapter_config.json",),
    }
    for key, names in reused.items():  # fail now, not after minutes of training
        folder = getattr(recipe, key)
        missing = [n for n in names if folder and not (Path(folder) / n).is_file()]
        if missing:
            raise ValueError(f"--set {key}={folder}: no {missing[0]} there")
    return recipe


def main(argv: Sequence[str] | None = None) -> int:
    """``xflow train demo``: run the recipe; exit 0 on success, 2 for bad arguments."""
    return run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The recipe for parsed :func:`build_parser` arguments (``xflow train demo`` registers that parser)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        recipe = _recipe_from_args(args)
    except ValueError as err:
        print(f"xflow train demo: {err}", file=sys.stderr)
        return 2
    model = train_demo(args.out, recipe, progress=not args.no_progress)
    if args.heldout is not None:
        path = export_heldout(args.heldout, seed=recipe.seed + 1000, progress=not args.no_progress)
        print(f"held-out set: mimic-ils:{path}")
    if args.install:
        from monailabel_xflow.workflow.model_config import DEMO_DIR

        if DEMO_DIR.exists():
            shutil.rmtree(DEMO_DIR)
        shutil.copytree(model, DEMO_DIR)
        print(f"installed to {DEMO_DIR}")
    print(json.dumps({"model": str(model), "models_file": str(model / "models.yaml")}))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
