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

Heavy imports (torch, transformers, datasets) happen inside the functions.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monailabel_xflow.policy.base import MAX_CLICKS

log = logging.getLogger(__name__)

__all__ = [
    "DemoRecipe",
    "QUICK",
    "DEMO_VLM_SIZE",
    "DEMO_VLM_SPEC",
    "balanced_questions",
    "build_demo_vlm",
    "export_heldout",
    "train_demo",
    "main",
]

DEMO_VLM_SIZE = "demo"
DEMO_VLM_SPEC: dict[str, Any] = dict(
    # ~1.7 M parameters; 8 x 8 patches pooled 2 x 2 into 16 image tokens.
    image_size=128,
    patch_size=16,
    mm_tokens_per_image=16,
    vision=dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4),
    text=dict(
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=32,
        sliding_window=4096,
        layer_types=["full_attention", "full_attention"],
    ),
    lora_r=128,
    # output logits can then reach a margin of ~0.1 * 128 = 13 (see policy.configs.build_random_vlm)
    embedding_std=0.1,
)
"""The demo's Gemma3 size, registered as ``policy.configs.SIZES["demo"]`` when the recipe runs."""


@dataclass
class DemoRecipe:
    """Sizes and step counts of the recipe (the defaults are sized for a CPU).

    Attributes:
        seed: everything is drawn from it.
        train_studies: phantom studies generated for training (~30 questions each).
        phantom_size: phantom side in pixels (F_seg resizes to ``seg_image_size``, the policy to 128).
        seg_size: ``sam3_configs`` size of F_seg (``"tiny"`` / ``"small"``).
        seg_image_size: F_seg's square input in pixels (SAM3 itself: 1008).
        seg_steps / seg_batch: F_seg optimiser steps of the project trainer, encoder unfrozen, and
            prompts per step.
        seg_lr: F_seg learning rate (every layer alike: a random encoder has nothing to preserve).
        seg_focal_weight: focal-loss weight (the paper's 20 suits fine-tuning SAM3; from scratch
            it lets the decoder settle on "all background", as lesions cover a few percent of
            the image and the dice term that rewards foreground is outweighed).
        seg_eval: training components on which F_seg's box-prompted IoU is logged.
        sft_batch / sft_lr: policy SFT batch and peak learning rate (both policies).
        init_sft_steps / rev_sft_steps: SFT optimiser steps of π_init / π_rev. π_init trains on
            presence-balanced rows (:func:`balanced_presence`).
        aux_weight: weight of the auxiliary mask loss in π_init SFT (a probe with one channel used
            1.0; the per-finding loss is a mean over seven mostly empty channels).
        vision_steps / vision_batch / vision_lr: the vision-tower pre-training phase
            (:func:`~monailabel_xflow.training.vision_pretrain.pretrain_vision`: presence per
            finding and region, lesion cells per finding, on the training phantoms) before π_init
            SFT; 0 steps skips it (the tower is then trained from nothing during SFT).
        vision_from: a vision-pre-trained base folder (model + processor, e.g. ``work/vlm/pretrained``
            of an earlier run with the same phantoms) reused instead of running the phase.
        sft_vision_lr_scale: learning rate of the tower and projector in π_init SFT, relative to
            ``sft_lr`` (0 freezes them: π_init's adapter then carries no copy of the tower).
        rev_vision_lr_scale: the same for π_rev SFT (its observations are overlays the
            pre-training never showed, so its tower may need to move).
        rev_components: at most this many lesion components become π_rev trajectories.
        rev_stop_ratio: at most this many stop-only trajectories per clicking one in π_rev SFT
            (:func:`balanced_revisions`; 0: keep all).
        rev_box_noise: edge jitter of the oracle's starting boxes (the paper's 0.1 leaves ~3 in 4
            of this F_seg's first masks above the 0.7 stop threshold, so π_rev would learn
            "stop" and little else; the demo π_init's boxes are also coarser than the paper's).
        init_sft2_steps / init_sft2_lr: a second π_init SFT round (phase ``init-sft-2``) warm-started
            from the first's adapter, its schedule restarted at this peak rate (0 steps skips it).
            On the demo's frozen pre-trained tower the first round's loss has flattened while its
            presence answers are still poor; the second round is what makes them read the image.
        rl_steps_init / rl_steps_rev: GRPO steps (0 skips that phase). π_init's GRPO questions are
            drawn balanced over level × present/absent (:func:`balanced_questions`), as its SFT
            rows are: drawn at random, ~87 % of phantom questions are negatives and the reward
            would mostly teach "absent".
        rl_generations / rl_batch / rl_lr: GRPO group size, completions per step, learning rate.
        rl_temperature: sampling temperature of the GRPO rollouts (the paper's 1.0 makes most of
            the demo policy's 200-token Stage 1 samples ill-formed, so the group's rewards differ by
            format noise rather than by the decision).
        max_clicks: Stage 2 budget at training and inference.
        parallel: train F_seg in a second process while π_init trains (one thread each).
        init_from: a π_init adapter folder its SFT warm-starts from ("": from scratch), e.g. the
            committed demo's ``init/`` to correct it with a few hundred steps on other data; with
            ``init_sft_steps=0`` (and ``rl_steps_init=0``) the adapter is reused as it is.
        rev_from: a trained π_rev adapter folder reused as it is ("": π_rev SFT and GRPO run).
        threads: torch threads of the policy phases (1 on a machine shared with other jobs: OpenMP
            threads on oversubscribed cores slow an SFT step down far more than they help).
        seg_revision_clicks / seg_revision_prob: F_seg's revision-aware prompts
            (:class:`~monailabel_xflow.training.config.SegmenterTrainConfig` ``revision_clicks`` /
            ``revision_prob``): simulated Stage 2 turns with the previous logits as mask input.
        seg_init_from: a trained F_seg folder the segmenter phase fine-tunes ("": a random SAM3).
        segmenter_from: a trained F_seg folder (``save_pretrained``, e.g. the committed demo's
            ``segmenter/``) to reuse instead of training one; "" trains it. F_seg does not depend
            on the policies, so a policy-only change of the recipe need not retrain it.
    """

    seed: int = 0
    train_studies: int = 240
    phantom_size: int = 256
    seg_size: str = "tiny"
    seg_image_size: int = 336
    seg_steps: int = 4500
    seg_batch: int = 4
    seg_lr: float = 1e-3
    seg_focal_weight: float = 1.0
    seg_eval: int = 24
    sft_batch: int = 8
    sft_lr: float = 1e-3
    init_sft_steps: int = 2800
    init_sft2_steps: int = 0
    init_sft2_lr: float = 5e-4
    rev_sft_steps: int = 500
    aux_weight: float = 5.0
    vision_steps: int = 0
    vision_batch: int = 32
    vision_lr: float = 1e-3
    vision_from: str = ""
    sft_vision_lr_scale: float = 1.0
    rev_vision_lr_scale: float = 1.0
    rev_components: int = 600
    rev_box_noise: float = 0.25
    rl_steps_init: int = 4
    rl_steps_rev: int = 2
    rl_generations: int = 4
    rl_batch: int = 8
    rl_lr: float = 2e-5
    rl_temperature: float = 1.0
    max_clicks: int = MAX_CLICKS
    parallel: bool = True
    seg_revision_clicks: int = 0
    rev_stop_ratio: float = 0.0
    seg_revision_prob: float = 0.5
    seg_init_from: str = ""
    segmenter_from: str = ""
    init_from: str = ""
    rev_from: str = ""
    threads: int = 2


QUICK = DemoRecipe(
    train_studies=8,
    seg_steps=2,
    seg_batch=2,
    seg_eval=2,
    sft_batch=2,
    init_sft_steps=2,
    rev_sft_steps=2,
    vision_steps=2,
    vision_batch=4,
    rev_components=12,
    rev_box_noise=0.1,
    rl_steps_init=1,
    rl_steps_rev=1,
    rl_generations=2,
    rl_batch=2,
)
"""A toy scale that runs the whole recipe in a few minutes on a busy CPU, learning nothing (smoke checks)."""


# --- models -------------------------------------------------------------------------------------


def _register_demo_size() -> None:
    from monailabel_xflow.policy import configs as gemma3_configs

    gemma3_configs.SIZES.setdefault(DEMO_VLM_SIZE, DEMO_VLM_SPEC)


def build_demo_vlm(path: str | Path, seed: int = 0) -> Path:
    """Write the random demo-size Gemma3 base (weights + processor) to ``path/base``.

    Returns:
        The ``base`` folder.
    """
    from monailabel_xflow.policy.configs import build_random_vlm

    _register_demo_size()
    return build_random_vlm(path, size=DEMO_VLM_SIZE, seed=seed, adapters=False).base


# --- data ---------------------------------------------------------------------------------------


def _export(out: Path, count: int, seed: int, size: int, progress: bool, desc: str) -> Path:
    """Export a phantom set once (a ``done`` marker makes reruns reuse it); returns its JSON."""
    from tqdm.auto import tqdm

    from monailabel_xflow.data.export import GT_DIR, JSON_NAME, export_set

    marker = out / ".done"
    if not marker.is_file():
        export_set(out, count, seed, size=size, progress=lambda it: tqdm(it, desc=desc, disable=not progress))
        marker.write_text(json.dumps({"count": count, "seed": seed, "size": size}))
    return out / GT_DIR / JSON_NAME


def balanced_revisions(rows, stop_ratio: float, seed: int = 0):
    """``rev-sft`` trajectories with the stop-only ones capped at ``stop_ratio`` per clicking one.

    With a segmenter whose box masks are already good, most oracle trajectories are a single
    "stop" turn (225 of 298 with the revision-aware demo F_seg), and π_rev trained on them stops at
    once on every question. Capping them keeps "stop" a learned decision (every clicking
    trajectory still ends in one) while the click turns stop being a minority.

    Args:
        rows: a ``datasets.Dataset`` with a ``targets`` list column (one protocol text per turn).
        stop_ratio: stop-only trajectories kept per trajectory with clicks (<= 0: keep all).
        seed: which stop-only trajectories are kept.
    """
    import numpy as np

    if stop_ratio <= 0:
        return rows
    turns = np.asarray([len(t) for t in rows["targets"]])
    clicking, stop_only = np.flatnonzero(turns > 1), np.flatnonzero(turns == 1)
    keep = min(len(stop_only), int(round(stop_ratio * len(clicking))))
    chosen = np.random.default_rng(seed).permutation(stop_only)[:keep]
    return rows.select(sorted(np.concatenate([clicking, chosen]).tolist()))


def balanced_presence(rows, seed: int = 0, by: Sequence[str] = ("level", "finding")):
    """``init-sft`` rows with the positives repeated until they are as many as the negatives,
    within each stratum of the ``by`` columns.

    Balancing the pooled rows is not enough: phantom chest-level questions are ~18 % positive,
    lung-level ~12 %, so pooled balancing left chest questions ~58 % positive in training and the
    model answered "present" to 91 % of held-out chest negatives. Balancing per (level, finding)
    makes every question kind a coin toss a priori, so presence has to come from the image.

    Args:
        rows: a ``datasets.Dataset`` with a boolean ``positive`` column (and the ``by`` columns).
        seed: shuffles the result.
        by: columns whose value combinations are balanced separately (empty: pooled). A stratum
            without positives or negatives is kept as it is.
    """
    import numpy as np

    flags = np.asarray(rows["positive"], bool)
    keys = list(zip(*(rows[c] for c in by), strict=False)) if by else [()] * len(flags)
    strata: dict[tuple, list[int]] = {}
    for k, key in enumerate(keys):
        strata.setdefault(tuple(key), []).append(k)
    chosen: list[np.ndarray] = []
    changed = False
    for members in strata.values():
        idx = np.asarray(members)
        pos, neg = idx[flags[idx]], idx[~flags[idx]]
        if len(pos) == 0 or len(neg) <= len(pos):
            chosen.append(idx)
            continue
        changed = True
        chosen += [neg, np.resize(pos, len(neg))]  # every positive, cycled to the negatives' count
    if not changed:
        return rows
    # flatten_indices: a shuffled view is slow to read row by row during training
    return rows.select(np.concatenate(chosen)).shuffle(seed=seed).flatten_indices()


def balanced_questions(cases: Sequence, count: int, rng) -> list:
    """About ``count`` questions drawn evenly from each level × present/absent stratum (without
    replacement while a stratum lasts), in a random order.

    Args:
        cases: ``EvalCase`` questions.
        count: how many to draw in all.
        rng: a ``numpy.random.Generator``.
    """
    strata: dict[tuple[str, bool], list] = {}
    for c in cases:
        strata.setdefault((c.level, bool(c.positive)), []).append(c)
    if not strata:
        return []
    per = -(-count // len(strata))  # ceil
    chosen = []
    for key in sorted(strata):
        pool = strata[key]
        chosen += [pool[k] for k in rng.permutation(len(pool))[:per]]
    return [chosen[k] for k in rng.permutation(len(chosen))]


def training_cases(json_path: Path):
    """Every basic and global question of every split of a phantom set (all of it is training)."""
    from monailabel_xflow.data.readers import read_mimic_ils

    cases = []
    for split in ("train", "val", "test"):
        cases += read_mimic_ils(json_path, split=split, kinds=("basic", "global")).cases
    return cases


def export_heldout(
    out: str | Path, seed: int = 1000, questions: int = 200, size: int = 256, progress: bool = True
) -> Path:
    """A held-out evaluation set: ``questions`` phantom questions, balanced over levels.

    Phantoms are drawn with ``seed`` (use one the training never used); the questions are split as
    evenly as possible over the chest / lung / zone levels and, within a level, over positives and
    negatives. They are written, all in the ``test`` split, to ``OUT/ground-truth/heldout.json``
    beside the set's own ``mimic_ils.json`` (so masks resolve the same way).

    Returns:
        The JSON path; evaluate with ``xflow eval --dataset mimic-ils:PATH``.
    """
    import numpy as np

    from monailabel_xflow.instructions import parse_instruction

    out = Path(out)
    studies = max(4, questions // 6)
    json_path = _export(out, studies, seed, size, progress, "held-out phantoms")
    release = json.loads(json_path.read_text())
    rng = np.random.default_rng(seed)
    pools: dict[tuple[str, bool], list[tuple[str, dict]]] = {}
    for split in release.values():
        for study, entry in split.items():
            for sign, key in ((True, "positive_pairs"), (False, "negative_pairs")):
                for pair in entry["instruction_answer_pairs"][key]:
                    if pair["type"] not in ("basic", "global"):
                        continue
                    level = parse_instruction(pair["instruction"]).level
                    pools.setdefault((level, sign), []).append((study, pair))
    levels = ("chest", "lung", "zone")
    chosen: list[tuple[str, dict]] = []
    for i, level in enumerate(levels):
        n_level = questions // 3 + (1 if i < questions % 3 else 0)
        for j, sign in enumerate((True, False)):
            pool = pools.get((level, sign), [])
            want = n_level // 2 + (n_level % 2 if j == 0 else 0)
            if len(pool) < want:
                raise ValueError(
                    f"held-out set too small: {len(pool)} {level} {'positives' if sign else 'negatives'} for {want}"
                )
            chosen += [pool[k] for k in sorted(rng.choice(len(pool), want, replace=False))]
    entries = {s: e for split in release.values() for s, e in split.items()}
    test: dict[str, dict] = {}
    for study, pair in chosen:
        entry = test.setdefault(
            study, dict(entries[study], instruction_answer_pairs={"positive_pairs": [], "negative_pairs": []})
        )
        entry["instruction_answer_pairs"]["positive_pairs" if pair["seg"] else "negative_pairs"].append(pair)
    heldout = json_path.parent / "heldout.json"
    heldout.write_text(json.dumps({"train": {}, "val": {}, "test": test}, indent=1))
    return heldout


# --- the recipe ---------------------------------------------------------------------------------


def _fingerprint(recipe: DemoRecipe) -> dict[str, Any]:
    """What a work folder's finished phases depend on: the recipe, the policy's size and its
    tokenizer (which the code builds, so an edited prompt corpus must not reuse old phases)."""
    import hashlib

    from monailabel_xflow.policy.configs import build_tokenizer

    tokenizer = build_tokenizer().backend_tokenizer.to_str()
    fingerprint = {
        "recipe": dataclasses.asdict(recipe),
        "vlm": DEMO_VLM_SPEC,
        "tokenizer": hashlib.sha256(tokenizer.encode()).hexdigest()[:16],
    }
    return json.loads(json.dumps(fingerprint))  # as phases.json stores it (tuples as lists)


class _Phases:
    """Runs named phases once each, logs their duration, and skips those already done."""

    def __init__(self, work: Path, fingerprint: dict[str, Any]) -> None:
        self.work = work
        self.state_file = work / "phases.json"
        state = json.loads(self.state_file.read_text()) if self.state_file.is_file() else {}
        if state.get("fingerprint") != fingerprint:  # other settings: nothing can be reused
            state = {"fingerprint": fingerprint, "done": {}}
        self.state = state
        self.times: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs) -> Any:
        if name in self.state["done"]:
            log.info("demo: %s already done, reusing %s", name, self.work)
            self.times[name] = self.state["done"][name]["seconds"]
            return self.state["done"][name].get("result")
        log.info("demo: %s ...", name)
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        seconds = time.perf_counter() - start
        self.times[name] = seconds
        log.info("demo: %s done in %.1f s", name, seconds)
        self.state["done"][name] = {"seconds": seconds, "result": result}
        self.state_file.write_text(json.dumps(self.state, indent=1, default=str))
        return result


def _set_threads(n: int = 2) -> None:
    import os

    import torch

    torch.set_num_threads(max(1, min(n, os.cpu_count() or 1)))


def _exit_with_parent(parent_pid: int) -> None:
    """In a worker process: exit as soon as ``parent_pid`` is gone (killed recipe, no orphan)."""
    import os
    import threading

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(2)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def segmenter_phase(
    work: str,
    json_path: str,
    recipe: DemoRecipe,
    progress: bool = True,
    threads: int | None = None,
    parent_pid: int | None = None,
) -> dict[str, Any]:
    """F_seg: a random reduced-size SAM3 tracker, trained on the training phantoms' lesions.

    The project trainer, end to end (``recipe.seg_steps`` steps); the result is
    ``work/segmenter``. Runs in a separate process when the recipe is parallel (hence plain
    arguments and a dict result).
    """
    import numpy as np

    from monailabel_xflow.segmenter.configs import build_random_sam3
    from monailabel_xflow.segmenter.loading import load_segmenter
    from monailabel_xflow.training.config import load_config
    from monailabel_xflow.training.segmenter import box_prompted_iou, finetune_segmenter, samples_from_cases

    if threads:
        _set_threads(threads)
    if parent_pid is not None:
        _exit_with_parent(parent_pid)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    start_time = time.perf_counter()
    work_dir = Path(work)
    seg_dir = work_dir / "segmenter"
    seed = recipe.seed
    cases = [c for c in training_cases(Path(json_path)) if c.positive]
    samples = samples_from_cases(cases, progress=progress)
    # one sample per lesion component: lung-, zone- and chest-level questions repeat masks
    unique = {}
    for s in samples:
        unique.setdefault((s.image[::8, ::8].tobytes(), s.mask.tobytes()), s)
    samples = list(unique.values())
    if recipe.seg_init_from:
        start = Path(recipe.seg_init_from)
    else:
        start = build_random_sam3(work_dir / "sam3-random", recipe.seg_size, seed, recipe.seg_image_size)
    cfg = load_config(
        "segmenter",
        max_steps=recipe.seg_steps,
        effective_batch=recipe.seg_batch,
        learning_rate=recipe.seg_lr,
        focal_weight=recipe.seg_focal_weight,
        encoder_lr_scale=1.0,
        layer_decay=1.0,
        grad_clip=1.0,
        seed=seed,
        revision_clicks=recipe.seg_revision_clicks,
        revision_prob=recipe.seg_revision_prob,
    )
    result = finetune_segmenter(start, samples, seg_dir, cfg, progress=progress)
    held = samples[:: max(1, len(samples) // recipe.seg_eval)][: recipe.seg_eval]
    iou = box_prompted_iou(load_segmenter(str(seg_dir)), held)
    log.info("demo: F_seg box-prompted IoU on %d training components: %.3f", len(held), iou)
    return {
        "samples": len(samples),
        "steps": result["steps"],
        "loss_first_last": [float(np.mean(result["losses"][:20])), float(np.mean(result["losses"][-20:]))],
        "box_prompted_iou_train": iou,
        "seconds": time.perf_counter() - start_time,
    }


def reuse_segmenter(source: str | Path, seg_dir: Path) -> dict[str, Any]:
    """Copy a trained F_seg into ``seg_dir`` (recipe field ``segmenter_from``).

    Returns:
        The phase record: the source, and the source's own segmenter record when it sits in a
        packaged demo (``../recipe.json``), so the model card keeps its training figures.

    Raises:
        FileNotFoundError: ``source`` holds no ``config.json`` / ``model.safetensors``.
    """
    source = Path(source)
    for name in ("config.json", "model.safetensors"):
        if not (source / name).is_file():
            raise FileNotFoundError(f"segmenter_from: {source / name} does not exist")
    _copy_files(source, seg_dir, ("config.json", "model.safetensors"))
    info: dict[str, Any] = {}
    recipe_json = source.parent / "recipe.json"
    if recipe_json.is_file():
        info = dict(json.loads(recipe_json.read_text()).get("segmenter", {}))
    info.update(reused_from=str(source), seconds=0.0)
    return info


def reuse_vision(source: str | Path, dest: Path) -> dict[str, Any]:
    """Copy a vision-pre-trained base into ``dest`` (recipe field ``vision_from``).

    Returns:
        The phase record: the source's own ``xflow_vision.json`` (its figures and duration) and
        where it came from.

    Raises:
        FileNotFoundError: ``source`` holds no ``config.json``.
    """
    source = Path(source)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"vision_from: {source / 'config.json'} does not exist")
    _copy_files(source, dest)
    record = source / "xflow_vision.json"
    info: dict[str, Any] = json.loads(record.read_text()) if record.is_file() else {}
    info.update(reused_from=str(source))
    return info


@dataclass
class _DemoRun:
    """One invocation of the recipe: its settings, folders and phase log, shared by the phases.

    ``rng`` (seeded with ``recipe.seed``) is drawn from in a fixed order (the π_rev questions,
    then the ``init-rl`` questions) so a rerun picks the same questions.
    """

    recipe: DemoRecipe
    out: Path
    progress: bool
    phases: _Phases
    rng: Any

    @property
    def work(self) -> Path:
        return self.out / "work"

    @property
    def built(self) -> Path:
        return self.work / "built"

    @property
    def runs(self) -> Path:
        return self.work / "runs"

    @property
    def seg_dir(self) -> Path:
        return self.work / "segmenter"

    @property
    def base(self) -> Path:
        """The base VLM every policy phase starts from: the random one, or its vision-pre-trained
        copy when the recipe pre-trains the tower."""
        return self.work / "vlm" / ("pretrained" if self.recipe.vision_steps > 0 else "base")

    def build(self, kind: str, subset: Sequence, **kw) -> dict:
        """Builder rows of ``kind`` into ``work/built/<kind>``; returns the row and reject counts."""
        from monailabel_xflow.training import builders

        report = builders.build(kind, subset, self.built / kind, seed=self.recipe.seed, progress=self.progress, **kw)
        return {"rows": report.rows, "rejected": report.rejected}

    def sft(
        self, stage: str, steps: int, data: Any, dest: Path, init_from: Path | None, aux: float, lr: float | None = None
    ) -> dict:
        """SFT of the base VLM's ``stage`` adapter into ``dest`` (peak rate ``lr``, default
        ``recipe.sft_lr``); returns steps and first/last loss."""
        from monailabel_xflow.training.config import load_config
        from monailabel_xflow.training.sft import train_sft

        r = self.recipe
        cfg = load_config(
            stage,
            max_steps=steps,
            effective_batch=r.sft_batch,
            learning_rate=r.sft_lr if lr is None else lr,
            lora_r=DEMO_VLM_SPEC["lora_r"],
            lora_alpha=DEMO_VLM_SPEC["lora_r"],
            vision_lr_scale=r.sft_vision_lr_scale if stage == "init-sft" else r.rev_vision_lr_scale,
            aux_mask_loss_weight=aux,
            seed=r.seed,
        )
        s = train_sft(
            stage, data, self.base, dest, cfg, init_from=init_from, per_device_batch=r.sft_batch, progress=self.progress
        )
        return {
            "steps": s["steps"],
            "first_loss": s["losses"][0] if s["losses"] else None,
            "last_loss": s["losses"][-1] if s["losses"] else None,
        }

    def rl(self, stage: str, steps: int, data_cases: Sequence, start: Path, dest: Path, clicker: Any) -> dict:
        """Build ``stage``'s rows, then GRPO from adapter ``start`` into ``dest`` (F_seg in the loop
        for ``rev-rl``); returns steps and reward."""
        from monailabel_xflow.training.config import load_config
        from monailabel_xflow.training.grpo import train_grpo

        r = self.recipe
        self.build(stage, data_cases, clicker=clicker)
        cfg = load_config(
            stage,
            max_steps=steps,
            effective_batch=r.rl_batch,
            num_generations=r.rl_generations,
            learning_rate=r.rl_lr,
            temperature=r.rl_temperature,
            max_clicks=r.max_clicks,
            seed=r.seed,
        )
        s = train_grpo(
            stage,
            self.built / stage,
            self.base,
            dest,
            start,
            cfg,
            segmenter=str(self.seg_dir) if stage == "rev-rl" else None,
            max_new_tokens=200 if stage == "init-rl" else 48,
            per_device_batch=r.rl_batch,
            progress=self.progress,
        )
        return {"steps": s["steps"], "reward": s["reward"]}


@dataclass
class _PendingSegmenter:
    """F_seg training running in a worker process (``pool`` runs ``future``)."""

    pool: Any
    future: Any


def data_phase(run: _DemoRun) -> tuple[str, list]:
    """Phase ``phantoms``: export the training phantoms (once per work folder).

    Returns:
        ``(json_path, cases)``: the ``mimic_ils.json`` path and its questions, every split.
    """
    r = run.recipe
    json_path = run.phases.run(
        "phantoms",
        lambda: str(
            _export(run.work / "phantoms", r.train_studies, r.seed, r.phantom_size, run.progress, "training phantoms")
        ),
    )
    cases = training_cases(Path(json_path))
    log.info("demo: %d training questions from %d phantoms", len(cases), r.train_studies)
    return json_path, cases


def start_segmenter_phase(run: _DemoRun, json_path: str) -> _PendingSegmenter | None:
    """Phase ``segmenter``: copy ``recipe.segmenter_from``, or train F_seg into ``work/segmenter``.

    With ``recipe.parallel`` the training runs in a second process while the policy trains
    (two independent jobs on two cores) and this returns it pending, for
    :func:`finish_segmenter_phase`; otherwise the phase is done on return (None).
    """
    r = run.recipe
    if "segmenter" not in run.phases.state["done"] and r.segmenter_from:
        run.phases.run("segmenter", reuse_segmenter, r.segmenter_from, run.seg_dir)
    if "segmenter" in run.phases.state["done"]:
        return None
    if not r.parallel:
        run.phases.run("segmenter", segmenter_phase, str(run.work), json_path, r, run.progress)
        return None
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    future = pool.submit(segmenter_phase, str(run.work), json_path, r, run.progress, 1, os.getpid())
    _set_threads(1)
    return _PendingSegmenter(pool, future)


def finish_segmenter_phase(run: _DemoRun, pending: _PendingSegmenter | None) -> dict[str, Any]:
    """Wait for a pending F_seg process (recorded as phase ``segmenter``); return the phase's record."""
    if pending is not None:
        run.phases.run("segmenter", pending.future.result)
        pending.pool.shutdown()
        _set_threads(run.recipe.threads)
    return run.phases.state["done"]["segmenter"]["result"]


def base_vlm_phase(run: _DemoRun) -> Path:
    """Phase ``base-vlm``: the random demo-size Gemma 3 in ``work/vlm/base``; returns that folder."""
    run.phases.run("base-vlm", lambda: str(build_demo_vlm(run.work / "vlm", run.recipe.seed)))
    return run.work / "vlm" / "base"


def vision_pretrain_phase(run: _DemoRun) -> None:
    """Phase ``vision-pretrain``: the random base's tower and projector pre-trained on every
    ``init-sft`` row (:mod:`~monailabel_xflow.training.vision_pretrain`) into ``work/vlm/pretrained``,
    which the policy phases then start from (``run.base``). Skipped at ``vision_steps == 0``."""
    from monailabel_xflow.training import builders
    from monailabel_xflow.training.vision_pretrain import pretrain_vision

    r = run.recipe
    if r.vision_steps <= 0:
        return
    if r.vision_from:
        run.phases.run("vision-pretrain", reuse_vision, r.vision_from, run.base)
        return
    run.phases.run(
        "vision-pretrain",
        pretrain_vision,
        run.work / "vlm" / "base",
        builders.load_built(run.built / "init-sft"),
        run.base,
        r.vision_steps,
        batch=r.vision_batch,
        lr=r.vision_lr,
        seed=r.seed,
        progress=run.progress,
    )


def init_sft_phase(run: _DemoRun, json_path: str, cases: Sequence) -> Path:
    """Phases ``build init-sft`` and ``init-sft``: π_init's rows (lung boxes from the phantoms'
    lung masks), presence-balanced, then SFT with the auxiliary mask loss.

    ``recipe.init_from`` warm-starts the SFT, or, with ``init_sft_steps == 0``, is π_init as it is.

    Returns:
        π_init's adapter folder.
    """
    from monailabel_xflow.training import builders

    r = run.recipe
    lungs = builders.LungBoxes.for_dataset(Path(json_path).parent.parent)
    run.phases.run("build init-sft", run.build, "init-sft", cases, lung_boxes=lungs)
    vision_pretrain_phase(run)
    init_sft = run.runs / "init-sft"
    balanced = balanced_presence(builders.load_built(run.built / "init-sft"), r.seed)
    warm = Path(r.init_from) if r.init_from else None
    if warm is not None and r.init_sft_steps == 0:  # π_init reused as it is (e.g. an F_seg-only change)
        log.info("demo: π_init reused from %s", warm)
        init_sft = warm
    else:
        run.phases.run("init-sft", run.sft, "init-sft", r.init_sft_steps, balanced, init_sft, warm, r.aux_weight)
    if r.init_sft2_steps > 0:
        second = run.runs / "init-sft-2"
        run.phases.run(
            "init-sft-2",
            run.sft,
            "init-sft",
            r.init_sft2_steps,
            balanced,
            second,
            init_sft,
            r.aux_weight,
            r.init_sft2_lr,
        )
        init_sft = second
    return init_sft


def rev_sft_phase(run: _DemoRun, cases: Sequence, init_sft: Path) -> tuple[Path, list, Any]:
    """Phases ``build rev-sft`` and ``rev-sft``: oracle trajectories with the trained F_seg in the
    loop on ``recipe.rev_components`` lung-level questions, stop-balanced, then π_rev SFT
    warm-started from π_init.

    ``recipe.rev_from`` is π_rev as it is (no build, no SFT). When every trajectory is discarded
    (an F_seg that does not improve with clicks) π_rev starts from π_init's adapter.

    Returns:
        ``(rev_sft, rev_cases, clicker)``: π_rev's adapter folder, the questions drawn and the
        oracle clicker (``rev-rl`` reuses both).
    """
    from monailabel_xflow.policy.oracle import OracleClicker
    from monailabel_xflow.training import builders

    r = run.recipe
    positives = [c for c in cases if c.positive and c.level == "lung"]  # one question per lesion set
    rev_cases = [positives[k] for k in sorted(run.rng.permutation(len(positives))[: r.rev_components])]
    clicker = OracleClicker(box_noise=r.rev_box_noise)

    def build_rev() -> dict:
        from monailabel_xflow.segmenter.loading import load_segmenter

        return run.build("rev-sft", rev_cases, segmenter=load_segmenter(str(run.seg_dir)), clicker=clicker)

    if r.rev_from:  # a trained π_rev is reused as it is (its own SFT and GRPO are not redone)
        log.info("demo: π_rev reused from %s", r.rev_from)
        return Path(r.rev_from), rev_cases, clicker
    run.phases.run("build rev-sft", build_rev)
    try:
        rows = builders.load_built(run.built / "rev-sft")
    except builders.BuildError:  # every trajectory discarded: an F_seg that clicks cannot improve
        log.warning(
            "demo: no π_rev trajectory was kept (F_seg does not improve with clicks); "
            "π_rev starts from π_init's SFT adapter without revision SFT"
        )
        return init_sft, rev_cases, clicker
    rev_sft = run.runs / "rev-sft"
    rev_rows = balanced_revisions(rows, r.rev_stop_ratio, r.seed)
    run.phases.run("rev-sft", run.sft, "rev-sft", r.rev_sft_steps, rev_rows, rev_sft, init_sft, 0.0)
    return rev_sft, rev_cases, clicker


def rl_phase(
    run: _DemoRun, cases: Sequence, rev_cases: Sequence, init_sft: Path, rev_sft: Path, clicker: Any
) -> tuple[Path, Path]:
    """Phases ``init-rl`` and ``rev-rl``: short GRPO of each policy from its SFT adapter (skipped
    at 0 steps; ``rev-rl`` also when π_rev was reused).

    Returns:
        ``(init_final, rev_final)``: the adapters to package.
    """
    r = run.recipe
    init_final, rev_final = init_sft, rev_sft
    if r.rl_steps_init > 0:
        rl_cases = balanced_questions(cases, 4 * r.rl_batch * r.rl_steps_init, run.rng)
        run.phases.run("init-rl", run.rl, "init-rl", r.rl_steps_init, rl_cases, init_sft, run.runs / "init-rl", clicker)
        init_final = run.runs / "init-rl"
    if r.rl_steps_rev > 0 and not r.rev_from:
        run.phases.run("rev-rl", run.rl, "rev-rl", r.rl_steps_rev, rev_cases, rev_sft, run.runs / "rev-rl", clicker)
        rev_final = run.runs / "rev-rl"
    return init_final, rev_final


def package_phase(
    run: _DemoRun, init_final: Path, rev_final: Path, seg_info: dict[str, Any], total_start: float
) -> Path:
    """Package the base, both adapters and F_seg into ``out/model`` with the phases' durations
    (an F_seg trained in parallel is listed apart: waiting for it is not its duration)."""
    model = run.out / "model"
    seconds = dict(run.phases.times)
    if run.recipe.parallel:
        seconds.pop("segmenter", None)
        seconds["total"] = sum(seconds.values())
        seconds["segmenter (ran in parallel with init-sft)"] = float(seg_info.get("seconds", 0.0))
    else:
        seconds["total"] = sum(seconds.values())
    log.info("demo: this invocation took %.1f min", (time.perf_counter() - total_start) / 60)
    package(
        model,
        run.base,
        init_final,
        rev_final,
        run.seg_dir,
        run.recipe,
        {"phases_seconds": seconds, "segmenter": seg_info, "done": run.phases.state["done"]},
    )
    log.info("demo: model written to %s (%.1f min in all)", model, seconds["total"] / 60)
    return model


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
    import numpy as np

    recipe = recipe or DemoRecipe()
    out = Path(out)
    (out / "work").mkdir(parents=True, exist_ok=True)
    _set_threads(recipe.threads)
    total_start = time.perf_counter()
    run = _DemoRun(
        recipe, out, progress, _Phases(out / "work", _fingerprint(recipe)), np.random.default_rng(recipe.seed)
    )

    json_path, cases = data_phase(run)
    pending = start_segmenter_phase(run, json_path)
    base_vlm_phase(run)
    init_sft = init_sft_phase(run, json_path, cases)
    seg_info = finish_segmenter_phase(run, pending)
    rev_sft, rev_cases, clicker = rev_sft_phase(run, cases, init_sft)
    init_final, rev_final = rl_phase(run, cases, rev_cases, init_sft, rev_sft, clicker)
    return package_phase(run, init_final, rev_final, seg_info, total_start)


_ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def _copy_files(src: Path, dest: Path, names: Sequence[str] | None = None) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and (names is None or f.name in names):
            shutil.copy2(f, dest / f.name)


def package(
    model: Path, base: Path, init: Path, rev: Path, segmenter: Path, recipe: DemoRecipe, info: dict[str, Any]
) -> None:
    """Assemble the model folder: weights, the two models files, ``recipe.json``, the model card."""
    if model.exists():
        shutil.rmtree(model)
    _copy_files(base, model / "base")
    _copy_files(init, model / "init", _ADAPTER_FILES)
    _copy_files(rev, model / "rev", _ADAPTER_FILES)
    _copy_files(segmenter, model / "segmenter", ("config.json", "model.safetensors"))
    common = f"segmenter: ./segmenter\nmax_clicks: {recipe.max_clicks}\nmax_new_tokens: 200\ndevice: cpu\n"
    header = (
        "# XFlow demo model: trained on synthetic phantoms only; not for clinical images.\n"
        "# Rebuild with `xflow train demo` (monailabel_xflow/training/demo.py).\n"
    )
    (model / "models.yaml").write_text(header + "vlm_base: ./base\ninit_adapter: ./init\nrev_adapter: ./rev\n" + common)
    (model / "models-stage1.yaml").write_text(
        header + "# Stage 1 only (no revision policy): the ablation of the evaluation report.\n"
        "vlm_base: ./base\ninit_adapter: ./init\n" + common
    )
    (model / "recipe.json").write_text(
        json.dumps({"recipe": dataclasses.asdict(recipe), **info}, indent=1, default=str)
    )
    (model / "README.md").write_text(model_card(recipe, info))


def model_card(recipe: DemoRecipe, info: dict[str, Any]) -> str:
    """The model card written beside the weights."""
    seconds = info.get("phases_seconds", {})
    times = "\n".join(f"| {k} | {v / 60:.1f} |" for k, v in seconds.items())
    seg = info.get("segmenter", {})
    vision = info.get("done", {}).get("vision-pretrain", {}).get("result") or {}
    if recipe.vision_steps > 0:
        held = vision.get("held_out_after", {})
        base_how = (
            f"random initialisation (seed {recipe.seed}); then the vision tower and projector pre-trained "
            f"{recipe.vision_steps} steps × {recipe.vision_batch} images, lr {recipe.vision_lr}, on presence per "
            "finding and region and lesion cells per finding (`training/vision_pretrain.py`; held-out balanced "
            f"presence accuracy {held.get('balanced_accuracy', float('nan')):.3f})"
        )
    else:
        base_how = f"random initialisation (seed {recipe.seed})"

    def tower(scale: float) -> str:
        return "tower frozen (the base's)" if scale <= 0 else f"tower trained at {scale} × lr"

    return f"""# XFlow demo model (synthetic phantoms only)

**Demo model trained on synthetic phantoms; not for clinical images.** It exists so that the
MONAI Label app and `xflow segment` work out of the box where the real XFlow weights are not
available. Its answers on real radiographs are meaningless.

| part | architecture | how it was trained |
|---|---|---|
| `base/` | `Gemma3ForConditionalGeneration`, 128 px images, 16 image tokens, 128-wide 4-layer vision, 128-wide 2-layer text; offline tokenizer | {base_how} |
| `init/` | π_init: peft LoRA r={DEMO_VLM_SPEC["lora_r"]} on the language model; {tower(recipe.sft_vision_lr_scale)} | SFT {recipe.init_sft_steps} steps on presence-balanced questions, batch {recipe.sft_batch}, lr {recipe.sft_lr}, per-finding auxiliary mask loss {recipe.aux_weight} (training only, not saved); GRPO {recipe.rl_steps_init} steps, lr {recipe.rl_lr} |
| `rev/` | π_rev: same form; {tower(recipe.rev_vision_lr_scale)} | SFT {recipe.rev_sft_steps} steps on oracle trajectories ({recipe.rev_components} lesion components, at most {recipe.rev_stop_ratio or "all"} stop-only per clicking one), warm-started from π_init SFT; GRPO {recipe.rl_steps_rev} steps with the IoU-gain reward |
| `segmenter/` | `Sam3TrackerModel`, size "{recipe.seg_size}" of `sam3_configs`, {recipe.seg_image_size} px input | random initialisation; {recipe.seg_steps} steps × {recipe.seg_batch} prompts of the project trainer, end to end, lr {recipe.seg_lr}, focal weight {recipe.seg_focal_weight} (box-prompted IoU on training lesions: {seg.get("box_prompted_iou_train", float("nan")):.3f}) |

Training data: {recipe.train_studies} phantom studies ({recipe.phantom_size} px) drawn with seed {recipe.seed}
(`monailabel_xflow.data.export.export_set`). Rebuild: `xflow train demo --seed {recipe.seed} --out DIR`.

Minutes per phase (as measured on the machine that built it):

| phase | minutes |
|---|---|
{times}

Use: `models.yaml` (Stage 1 + Stage 2), `models-stage1.yaml` (Stage 1 only).
Evaluation: `reports/phantom-benchmark/` in the repository.
"""


# --- evaluation summary -------------------------------------------------------------------------


def eval_table(reports: dict[str, str | Path]) -> str:
    """A Markdown table comparing ``xflow eval`` reports (e.g. Stage 1 only vs Stage 1 + 2).

    Args:
        reports: ``{row name: xflow eval --out folder}`` (each holds ``report.json``).

    Returns:
        One row per report and level (chest, lung, zone, equal-weight average): gIoU, cIoU, F1,
        N-Acc, as in the paper's Table 1.
    """

    def f(v: Any) -> str:
        return "—" if v is None else f"{v:.3f}"

    lines = ["| Model | Level | Pos | Neg | gIoU | cIoU | F1 | N-Acc |", "|---|---|---|---|---|---|---|---|"]
    for name, folder in reports.items():
        report = json.loads((Path(folder) / "report.json").read_text())
        for level, s in report["levels"].items():
            lines.append(
                f"| {name} | {level} | {s['n_positive']} | {s['n_negative']} | {f(s['giou'])} | "
                f"{f(s['ciou'])} | {f(s['f1'])} | {f(s['n_acc'])} |"
            )
        a = report["average"]
        lines.append(
            f"| **{name}** | **average** | | | **{f(a['giou'])}** | **{f(a['ciou'])}** | **{f(a['f1'])}** | "
            f"{f(a['n_acc'])} |"
        )
    return "\n".join(lines) + "\n"


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
