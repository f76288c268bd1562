"""Training configurations. Defaults are the XFlow paper's Table 7 (Appendix A.4).

Each trainer reads one dataclass; a YAML file overrides any field (unknown keys are an error,
so a typo never silently trains with a default). The files in ``configs/train/`` at the
repository root spell out these defaults for editing.

Effective batch sizes are the paper's (per-device batch x gradient accumulation x devices); the
per-device batch is derived at run time from the number of processes accelerate starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from monailabel_xflow.errors import InputError
from monailabel_xflow.policy.base import MAX_CLICKS

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

C = TypeVar("C", bound="DataclassInstance")


@dataclass
class SegmenterTrainConfig:
    """F_seg fine-tuning (SAM 2 loss on the SAM3 tracker head, encoder unfrozen)."""

    learning_rate: float = 1e-4
    encoder_lr_scale: float = 0.6
    layer_decay: float = 0.9
    weight_decay: float = 0.1
    grad_clip: float = 0.1
    effective_batch: int = 16
    epochs: int = 5
    image_size: int = 1024
    focal_weight: float = 20.0
    dice_weight: float = 1.0
    iou_weight: float = 1.0
    points_per_prompt: int = 2  # clicks sampled per box prompt, like the revision policy produces
    box_jitter: float = 0.1  # box edges moved by up to this fraction of the box size
    # Revision-aware prompts (0 = off, the paper's Table 7 recipe): with probability revision_prob a
    # prompt also runs 1..revision_clicks simulated Stage 2 turns (Algorithm 1's corrective click on
    # the current error, the box grown as in Stage 2, the previous low-res logits as mask input) and
    # the last turn's single-mask output is supervised too, so F_seg learns the input it gets in Stage 2.
    revision_clicks: int = 0
    revision_prob: float = 0.5
    revision_box_jitter: float = 0.25  # Stage 1 boxes are looser than the plain prompts' boxes
    # Interactive training, SAM's recipe (0 = off): every prompt also runs a first prompt (a jittered
    # box, or with probability interactive_click_start one positive click whose point is the box, the
    # click tool's rule) and then interactive_rounds click rounds, each click drawn from the current
    # prediction's error region (the oracle's deepest error pixel with probability interactive_oracle_prob,
    # else uniformly from the error region as SAM does), the box grown as in Stage 2, the previous
    # round's low-res logits fed back as mask input; every round's single-mask output is supervised.
    interactive_rounds: int = 0
    interactive_click_start: float = 0.5
    interactive_oracle_prob: float = 0.5
    interactive_box_jitter: float = 0.1
    # Share of click rounds run without the previous logits: a 3D Slicer or OHIF click request
    # carries every click so far but no mask, so F_seg must also answer clicks alone.
    interactive_mask_dropout: float = 0.0
    # Weight of a loss on the pixels near each round's clicks (their true labels, a disc of
    # CLICK_LOSS_RADIUS low-res pixels): the mask loss barely notices the few pixels a click is
    # about, so a model can learn to answer the box and ignore the clicks on it.
    interactive_click_weight: float = 0.0
    # Zoom-in (RITM, FocalClick): this share of samples is cropped to the window a ZoomedSegmenter
    # segments their jittered box in (segmenter/zoom.py); > 0 marks the weights as zooming.
    zoom_prob: float = 0.0
    freeze_encoder: bool = False  # train the prompt encoder and mask decoder only; each image encoded once
    max_steps: int = -1  # >0 caps the run (smoke tests, demos)
    checkpoint_every: int = 0  # >0: also save OUT/checkpoint-<step> every this many steps
    seed: int = 0


@dataclass
class PolicySFTConfig:
    """SFT of π_init (defaults) or π_rev (see :func:`rev_sft_defaults`)."""

    learning_rate: float = 1e-5
    vision_lr_scale: float = 0.3
    lora_r: int = 128
    lora_alpha: int = 256
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    effective_batch: int = 256
    epochs: int = 15
    max_steps: int = -1
    aux_mask_loss_weight: float = 0.0  # training-only head on image tokens; off by default
    seed: int = 0


@dataclass
class PolicyGRPOConfig:
    """GRPO of π_init (defaults) or π_rev (see :func:`rev_rl_defaults`)."""

    learning_rate: float = 1e-5
    lora_r: int = 128
    lora_alpha: int = 256
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    effective_batch: int = 32
    epochs: int = 10
    num_generations: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    kl_beta: float = 0.1
    max_clicks: int = MAX_CLICKS
    max_steps: int = -1
    seed: int = 0


def rev_sft_defaults() -> PolicySFTConfig:
    """π_rev SFT: warm-started from π_init SFT; batch 64, 10 epochs."""
    return PolicySFTConfig(effective_batch=64, epochs=10)


def rev_rl_defaults() -> PolicyGRPOConfig:
    """π_rev GRPO: lr 1e-6, batch 64, top-p 0.95, KL 0.02."""
    return PolicyGRPOConfig(learning_rate=1e-6, effective_batch=64, top_p=0.95, kl_beta=0.02)


DEFAULTS: dict[str, Any] = {
    "segmenter": SegmenterTrainConfig,
    "init-sft": PolicySFTConfig,
    "init-rl": PolicyGRPOConfig,
    "rev-sft": rev_sft_defaults,
    "rev-rl": rev_rl_defaults,
}
"""Trainer name -> factory of its default config."""


class ConfigError(InputError):
    """A config file or override that does not fit the trainer's fields."""


def load_config(trainer: str, path: str | Path | None = None, **overrides: Any):
    """The trainer's defaults, updated from a YAML file and then from keyword overrides.

    Raises:
        ConfigError: unknown trainer, unknown keys, or a value of the wrong type.
    """
    if trainer not in DEFAULTS:
        raise ConfigError(f"unknown trainer {trainer!r}; one of {', '.join(DEFAULTS)}")
    config = DEFAULTS[trainer]()
    values: dict[str, Any] = {}
    if path is not None:
        import yaml

        loaded = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of settings")
        values.update(loaded)
    values.update({k: v for k, v in overrides.items() if v is not None})
    return _apply(config, values, source=str(path or "overrides"))


def check_int_fields(config: Any, at_least_one: Collection[str] = ()) -> None:
    """Refuse an integer field of a dataclass below 0 (below 1 for the names in ``at_least_one``).

    For recipes, whose step counts and sizes reach the trainers as given: ``max_steps=-5`` means
    "every epoch" to the Hugging Face Trainer, and a batch of 0 fails minutes into a run.

    Raises:
        ValueError: naming the field, its bound and the value.
    """
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, int) and not isinstance(value, bool):
            lo = 1 if f.name in at_least_one else 0
            if value < lo:
                raise ValueError(f"{f.name} must be >= {lo}, got {value}")


def _apply(config: C, values: dict[str, Any], source: str) -> C:
    fields = {f.name: f for f in dataclasses.fields(config)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"{source}: unknown setting(s) {unknown}; known: {sorted(fields)}")
    for key, value in values.items():
        default = getattr(config, key)
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            ok = isinstance(value, type(default))
        else:  # ints accept ints; floats accept ints and floats ("1e-5" in YAML is a string)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if isinstance(default, int) and not isinstance(default, bool):
                ok = ok and float(value).is_integer()
        if not ok:
            raise ConfigError(f"{source}: {key} must be {type(default).__name__}, got {value!r}")
        setattr(config, key, type(default)(value))
    return config


def to_dict(config) -> dict[str, Any]:
    return dataclasses.asdict(config)
