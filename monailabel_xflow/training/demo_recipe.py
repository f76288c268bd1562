"""The demo recipe's settings: :class:`DemoRecipe` (sizes and step counts), :data:`QUICK` (the toy
scale of smoke checks), the demo policy's Gemma 3 size (:data:`DEMO_VLM_SPEC`) and the
fingerprint a work folder's finished phases are keyed by (:func:`recipe_fingerprint`).

The recipe itself runs in :mod:`monailabel_xflow.training.demo` (``xflow train demo``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monailabel_xflow.policy.base import MAX_CLICKS, check_budget, check_stop_bias
from monailabel_xflow.segmenter.refine import CLICK_REFINEMENTS
from monailabel_xflow.training.config import check_int_fields

__all__ = [
    "DEMO_VLM_SIZE",
    "DEMO_VLM_SPEC",
    "DemoRecipe",
    "QUICK",
    "build_demo_vlm",
    "recipe_fingerprint",
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
        rev_aux_weight: weight of π_rev SFT's auxiliary error loss (0: off): a linear head on each
            observation's projected image tokens predicts which cells its mask misses and spills
            (:func:`~monailabel_xflow.training.builders.error_map`), so the tower learns to see
            the error a click must fix. Needs the tower trained (``rev_vision_lr_scale > 0``).
        vision_steps / vision_batch / vision_lr: the vision-tower pre-training phase
            (:func:`~monailabel_xflow.training.vision_pretrain.pretrain_vision`: presence per
            finding and region, lesion cells per finding, on the training phantoms) before π_init
            SFT; 0 steps skips it (the tower is then trained from nothing during SFT).
        vision_from: a vision-pre-trained base folder (model + processor, e.g. ``work/vlm/pretrained``
            of an earlier run with the same phantoms) reused instead of running the phase (whatever
            ``vision_steps``).
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
        rev_onpolicy: π_rev's ``rev-sft`` and ``rev-rl`` states come from the demo's own Stage 1
            (the π_init just trained, with F_seg) on ``rev_components`` questions, each lesion box
            revised by the oracle through the workflow's Stage 2 loop
            (:func:`~monailabel_xflow.training.builders.onpolicy_trajectories`; stop-only where
            clicking gains less than ``policy.oracle.PAYS``), instead of perturbed true boxes.
        rev_zoom: π_rev looks at a zoomed view around the box that prompted the mask
            (``geometry.zoom_view``) in its SFT rows, GRPO rollouts and the packaged
            ``models.yaml`` (``revision_view: zoom``), instead of the whole image.
        click_refinement: the packaged models files' ``click_refinement`` (``none`` or ``brs``:
            F_seg's masks made to agree with their clicks at inference,
            :mod:`monailabel_xflow.segmenter.refine`); an inference setting, no phase depends on it.
        presence_bias: the packaged models files' ``stage1_presence_bias`` (π_init's presence
            operating point, ``policy.vlm.presence_decision_ids``), an inference setting chosen on a
            dev seed; with ``rev_onpolicy`` the Stage 1 that π_rev's states come from uses it too.
        rev_pays: with ``rev_onpolicy``, the smallest IoU gain of the oracle's clicks for which a
            trajectory teaches π_rev to click (``policy.oracle.PAYS``, 0.01); below it, to stop.
        rev_click_refinement: the same for π_rev's clicks: its trajectories (``build rev-sft``),
            GRPO rollouts and the packaged ``models.yaml``'s ``stage2_click_refinement``, so π_rev
            learns when clicking pays from the masks its clicks will get in Stage 2.
        threads: torch threads of the policy phases (1 on a machine shared with other jobs: OpenMP
            threads on oversubscribed cores slow an SFT step down far more than they help).
        seg_revision_clicks / seg_revision_prob: F_seg's revision-aware prompts
            (:class:`~monailabel_xflow.training.config.SegmenterTrainConfig` ``revision_clicks`` /
            ``revision_prob``): simulated Stage 2 turns with the previous logits as mask input.
        seg_interactive_rounds / seg_interactive_click_start / seg_interactive_mask_dropout /
            seg_interactive_oracle_prob: F_seg's interactive training (``SegmenterTrainConfig``
            ``interactive_*``, SAM's recipe: click rounds from the current prediction's error
            region, the previous logits fed back, a loss on every round); 0 rounds is
            box-and-point training only.
        seg_zoom_prob: the share of F_seg's samples cropped to the window a zoom-in F_seg segments
            them in (``SegmenterTrainConfig.zoom_prob``, :mod:`monailabel_xflow.segmenter.zoom`);
            above 0 the packaged weights zoom.
        seg_checkpoint_every: also keep ``work/segmenter/checkpoint-<step>`` every this many
            steps (0: none), to choose the step count on the dev seed.
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
    rev_aux_weight: float = 0.0
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
    seg_interactive_rounds: int = 0
    seg_interactive_click_start: float = 0.5
    seg_interactive_mask_dropout: float = 0.0
    seg_interactive_oracle_prob: float = 0.5
    seg_zoom_prob: float = 0.0
    seg_checkpoint_every: int = 0
    seg_init_from: str = ""
    segmenter_from: str = ""
    init_from: str = ""
    rev_from: str = ""
    rev_onpolicy: bool = False
    rev_zoom: bool = False
    click_refinement: str = "none"
    rev_click_refinement: str = "none"
    presence_bias: float = 0.0
    rev_pays: float = 0.01
    threads: int = 2

    def __post_init__(self) -> None:
        # the settings a phase reads only minutes into a run: checked when the recipe is made
        check_int_fields(self, _AT_LEAST_ONE)
        check_budget(self.max_clicks)
        for name in ("click_refinement", "rev_click_refinement"):
            if getattr(self, name) not in CLICK_REFINEMENTS:
                raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(CLICK_REFINEMENTS)}")
        check_stop_bias(self.presence_bias, "presence_bias")
        if not 0.0 <= self.rev_pays <= 1.0:  # an IoU gain; also rejects NaN
            raise ValueError(f"rev_pays must lie in [0, 1] (an IoU gain), got {self.rev_pays}")
        # an auxiliary loss trains the tower through its head: with the tower frozen it trains nothing
        for aux, scale, steps in (
            ("aux_weight", "sft_vision_lr_scale", self.init_sft_steps + self.init_sft2_steps),
            ("rev_aux_weight", "rev_vision_lr_scale", self.rev_sft_steps),
        ):
            if steps > 0 and getattr(self, aux) > 0 and getattr(self, scale) <= 0:
                raise ValueError(f"{aux} > 0 needs the tower trained ({scale} > 0); set {aux}=0 or {scale} > 0")


_AT_LEAST_ONE = frozenset(
    {"train_studies", "phantom_size", "seg_image_size", "seg_batch", "sft_batch", "vision_batch"}
    | {"rl_generations", "rl_batch", "threads"}
)
"""Integer fields that are sizes or counts of something that must exist; the others (steps,
seeds, optional counts) may be 0."""

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


def recipe_fingerprint(recipe: DemoRecipe) -> dict[str, Any]:
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
    stored: dict[str, Any] = json.loads(json.dumps(fingerprint))  # as phases.json stores it (tuples as lists)
    return stored
