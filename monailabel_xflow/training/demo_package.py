"""Packaging the demo model: ``OUT/model/`` with the weights (``base/``, ``init/``, ``rev/``,
``segmenter/``), the two models files, ``recipe.json`` and the model card.

The models files' header names ``monailabel_xflow/training/demo.py``, where the recipe runs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from monailabel_xflow.training.demo_recipe import DEMO_VLM_SPEC, DemoRecipe

__all__ = ["ADAPTER_FILES", "SEGMENTER_FILES", "copy_files", "package", "model_card"]


ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The files of a peft adapter folder that are packaged."""

SEGMENTER_FILES = ("config.json", "model.safetensors")
"""The files of a ``save_pretrained`` F_seg folder that are packaged."""


def copy_files(src: Path, dest: Path, names: Sequence[str] | None = None) -> None:
    """Copy the files directly in ``src`` (those named ``names``, or all) into ``dest`` (created)."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.is_file() and (names is None or f.name in names):
            shutil.copy2(f, dest / f.name)


def package(
    model: Path, base: Path, init: Path, rev: Path, segmenter: Path, recipe: DemoRecipe, info: dict[str, Any]
) -> None:
    """Assemble the model folder: weights, the two models files, ``recipe.json``, the model card.

    Args:
        model: the folder written (replaced if it exists).
        base: the base VLM folder (model + processor), copied whole.
        init, rev: π_init's and π_rev's adapter folders.
        segmenter: F_seg's ``save_pretrained`` folder.
        recipe: the settings recorded in ``recipe.json`` and the card.
        info: the run's record (``phases_seconds``, ``segmenter``, ``done``), also in ``recipe.json``.

    Raises:
        ValueError: an unknown ``recipe.click_refinement`` or ``recipe.rev_click_refinement``.
    """
    from monailabel_xflow.segmenter.refine import refinement_for

    for name in (recipe.click_refinement, recipe.rev_click_refinement):
        refinement_for(name)  # an unknown name fails before anything is replaced
    if model.exists():
        shutil.rmtree(model)
    copy_files(base, model / "base")
    copy_files(init, model / "init", ADAPTER_FILES)
    copy_files(rev, model / "rev", ADAPTER_FILES)
    copy_files(segmenter, model / "segmenter", SEGMENTER_FILES)
    common = f"segmenter: ./segmenter\nmax_clicks: {recipe.max_clicks}\nmax_new_tokens: 200\ndevice: cpu\n"
    if recipe.click_refinement != "none":
        common += f"click_refinement: {recipe.click_refinement}\n"
    if recipe.presence_bias:
        common += f"stage1_presence_bias: {recipe.presence_bias:g}\n"
    header = (
        "# XFlow demo model: trained on synthetic phantoms only; not for clinical images.\n"
        "# Rebuild with `xflow train demo` (monailabel_xflow/training/demo.py).\n"
    )
    view = f"revision_view: {'zoom' if recipe.rev_zoom else 'full'}\n"
    if recipe.rev_click_refinement != "none":
        view += f"stage2_click_refinement: {recipe.rev_click_refinement}\n"
    (model / "models.yaml").write_text(
        header + "vlm_base: ./base\ninit_adapter: ./init\nrev_adapter: ./rev\n" + view + common
    )
    (model / "models-stage1.yaml").write_text(
        header + "# Stage 1 only (no revision policy): the ablation of the evaluation report.\n"
        "vlm_base: ./base\ninit_adapter: ./init\n" + common
    )
    (model / "recipe.json").write_text(
        json.dumps({"recipe": dataclasses.asdict(recipe), **info}, indent=1, default=str)
    )
    (model / "README.md").write_text(model_card(recipe, info))


def model_card(recipe: DemoRecipe, info: dict[str, Any]) -> str:
    """The model card (``README.md``) written beside the weights.

    Args:
        recipe: the settings the model was trained with.
        info: the run's record (:func:`package`'s ``info``): minutes per phase and the figures of
            the F_seg and vision pre-training phases.
    """
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
