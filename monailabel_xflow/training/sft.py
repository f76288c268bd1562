"""Supervised fine-tuning of π_init and π_rev with trl's ``SFTTrainer`` (paper §4.4, Table 7).

What is trained is exactly what inference asks
------------------------------------------------
Every example is encoded segment by segment the way :class:`~monailabel_xflow.policy.vlm.VLMPolicy`
encodes a conversation at inference, with the same prompt functions and the processor's chat
template:

* **π_init** (``init-sft`` rows): ``processor.apply_chat_template(stage1_messages(instruction),
  add_generation_prompt=True)`` with the radiograph, then the target protocol text and
  ``<end_of_turn>``. The instruction is the row's *canonical* ``instruction``: at inference the
  user's free text is parsed into an :class:`~monailabel_xflow.instructions.Instruction` first and
  the model only ever sees its canonical text, so the row's varied ``prompt`` phrasing is not
  shown to the model (it serves the parser's tests and the RL prompts' logs).
* **π_rev** (``rev-sft`` rows): one multi-image conversation per trajectory. Turn 0 is
  ``stage2_messages(instruction, box)`` with observation o_0; every later user turn is
  ``stage2_followup_text(...)`` with observation o_t, appended after the previous target and its
  ``<end_of_turn>``, the very text ``VLMRevisionSession`` appends at inference.

The loss covers the assistant tokens only: each target and its ``<end_of_turn>`` (so the model
learns to stop); prompts, images and user turns carry label ``-100``.

What is adapted, and how it is saved
------------------------------------
LoRA (r/α from the config) on every linear layer of the *language model* only
(:data:`~monailabel_xflow.policy.configs.LORA_TARGET_MODULES`, a regex on ``language_model`` so
SigLIP's ``q_proj``… are not caught). The vision tower and the multimodal projector
are unfrozen (paper A.4) as peft ``modules_to_save``: each adapter folder then carries its own
trained copy of them, and ``PeftModel.from_pretrained`` / ``load_adapter`` (what
``VLMPolicy.from_pretrained`` calls) swap that copy in whenever the adapter is active. So π_init
and π_rev each see the image through the tower they were trained with, on one shared base model.
Optimizer parameter groups: LoRA at the base rate, tower and projector at
``vision_lr_scale`` × the base rate (Table 7: 0.3).

π_rev is warm-started from π_init's SFT adapter (``init_from``): the LoRA weights and the trained
tower are loaded into the new adapter before training (rank and α are the warm-start adapter's).

The optional auxiliary loss (``aux_mask_loss_weight > 0``) lives in
:mod:`monailabel_xflow.training.aux_head`: π_init's image tokens predict the lesion cells,
π_rev's the cells each observation's mask misses and spills. Its head belongs to the trainer and
is never saved.

Output folder: ``adapter_config.json`` + ``adapter_model.safetensors`` (peft), and
``xflow_training.json`` (trainer, config, data size, base model, losses).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.errors import InputError
from monailabel_xflow.training.config import ConfigError, PolicySFTConfig, to_dict

log = logging.getLogger(__name__)

__all__ = [
    "VISION_MODULES",
    "SFTDataError",
    "load_rows",
    "policy_image",
    "observation_image",
    "PolicyExampleEncoder",
    "PolicyCollator",
    "policy_lora_config",
    "load_policy_model",
    "batch_geometry",
    "common_training_args",
    "train_sft",
]

VISION_MODULES = ("vision_tower", "multi_modal_projector")
"""Modules unfrozen in SFT and saved with each adapter (peft ``modules_to_save``)."""

STAGE_COLUMNS = {
    "init-sft": ("image", "instruction", "target"),
    "rev-sft": ("image", "instruction", "box", "observations", "targets"),
}


class SFTDataError(InputError):
    """A training set that does not have the rows its trainer needs (names what is missing)."""


# --- data -------------------------------------------------------------------------------------


def load_rows(data: Any):
    """A ``datasets.Dataset`` from a builder output folder, a ``save_to_disk`` folder, or as is.

    Raises:
        SFTDataError: the folder holds neither.
    """
    from datasets import Dataset

    if isinstance(data, Dataset):
        return data
    path = Path(data)
    if (path / "build.json").is_file():
        from monailabel_xflow.training.builders import load_built

        return load_built(path)
    if (path / "dataset_info.json").is_file() or (path / "state.json").is_file():
        return Dataset.load_from_disk(str(path))
    raise SFTDataError(f"{path} is neither a training-set build (build.json) nor a saved dataset")


def check_columns(rows, needed: Sequence[str], trainer: str) -> None:
    """Raise :class:`SFTDataError` naming the columns ``rows`` lacks for ``trainer``."""
    missing = [c for c in needed if c not in rows.column_names]
    if missing:
        raise SFTDataError(
            f"{trainer} needs columns {list(needed)}; the data lacks {missing} (has {rows.column_names})"
        )
    if len(rows) == 0:
        raise SFTDataError(f"{trainer}: the training set is empty")


def policy_image(path: str | Path):
    """The radiograph as the policy sees it at inference: ``load_cxr`` then 8-bit grey RGB PIL."""
    from monailabel_xflow.policy.conversation import image_to_pil  # one conversion for training and inference
    from monailabel_xflow.transforms import load_cxr

    image, _ = load_cxr(path)
    return image_to_pil(image)


def observation_image(path: str | Path):
    """A rendered Stage 2 observation PNG (``render_observation`` output) as RGB PIL."""
    from PIL import Image

    with Image.open(path) as im:
        return im.convert("RGB")


@dataclass
class PolicyExampleEncoder:
    """Turns one SFT row into model tensors, segment by segment as inference encodes them.

    Args:
        processor: the policy's ``Gemma3Processor``.
        stage: ``"init-sft"`` or ``"rev-sft"``.
        aux_side: token-grid side for auxiliary mask targets (None: no targets).

    Calling it on a row returns a dict of 1-D ``input_ids``, ``labels`` (-100 off the assistant
    turns), ``token_type_ids`` (1 on image soft tokens), ``pixel_values`` ``(n_images, 3, S, S)``
    and, with ``aux_side``, ``aux_target``: ``(n_images, aux_side**2, n_findings)`` from the row's
    ``finding_masks`` when it has them, else ``(n_images, aux_side**2)`` from its ``lesion_mask``
    (see :mod:`~monailabel_xflow.training.aux_head`).
    """

    processor: Any
    stage: str
    aux_side: int | None = None

    def __post_init__(self) -> None:
        from monailabel_xflow.policy.conversation import ConversationEncoder

        if self.stage not in STAGE_COLUMNS:
            raise ValueError(f"unknown SFT stage {self.stage!r}; one of {sorted(STAGE_COLUMNS)}")
        self.conversation = ConversationEncoder(self.processor)

    def pieces(self, row: dict[str, Any]) -> list[tuple[bool, Any]]:
        """The conversation as ``[(is_answer, Piece), ...]``, encoded by the policies' own
        :class:`~monailabel_xflow.policy.conversation.ConversationEncoder`."""
        from monailabel_xflow.instructions import parse_instruction

        instruction = parse_instruction(row["instruction"])
        enc = self.conversation
        if self.stage == "init-sft":
            return [
                (False, enc.stage1_prompt(policy_image(row["image"]), instruction)),
                (True, enc.answer(row["target"])),
            ]
        observations, targets = list(row["observations"]), list(row["targets"])
        if len(observations) != len(targets) or not targets:
            raise SFTDataError(
                f"row {row.get('case_id')}: {len(observations)} observations for "
                f"{len(targets)} targets (need one per turn, at least one)"
            )
        x1, y1, x2, y2 = (float(v) for v in row["box"])
        box = (x1, y1, x2, y2)
        out: list[tuple[bool, Any]] = []
        for t, (obs, target) in enumerate(zip(observations, targets, strict=False)):
            # every training answer ends with <end_of_turn>, so no follow-up needs to close one
            out += [(False, enc.stage2_prompt(observation_image(obs), instruction, box, t)), (True, enc.answer(target))]
        return out

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        import torch

        ids, labels, types, pixels = [], [], [], []
        for is_answer, piece in self.pieces(row):
            seg = piece.input_ids[0]
            ids.append(seg)
            labels.append(seg.clone() if is_answer else torch.full_like(seg, -100))
            types.append(piece.token_type_ids[0])
            if piece.pixel_values is not None:
                pixels.append(piece.pixel_values)
        out = {
            "input_ids": torch.cat(ids),
            "labels": torch.cat(labels),
            "token_type_ids": torch.cat(types),
            "pixel_values": torch.cat(pixels),
        }
        if self.aux_side is not None:
            from monailabel_xflow.training.aux_head import (
                error_token_targets,
                finding_token_targets,
                mask_token_targets,
            )

            if self.stage == "rev-sft":  # one target per observation: what its mask misses and spills
                errors = [error_token_targets(e, self.aux_side) for e in row["error_masks"]]
                out["aux_target"] = torch.from_numpy(np.stack(errors))
                return out
            if row.get("finding_masks"):
                target = finding_token_targets(row["finding_masks"], self.aux_side)
            else:
                target = mask_token_targets(row.get("lesion_mask"), self.aux_side)
            out["aux_target"] = torch.from_numpy(np.repeat(target[None], len(out["pixel_values"]), 0))
        return out


@dataclass
class PolicyCollator:
    """Encodes rows with a :class:`PolicyExampleEncoder` and right-pads them into a batch."""

    encoder: PolicyExampleEncoder
    pad_token_id: int

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        enc = [self.encoder(r) for r in rows]
        n = max(len(e["input_ids"]) for e in enc)

        def pad(key: str, value: int):
            return torch.stack([torch.nn.functional.pad(e[key], (0, n - len(e[key])), value=value) for e in enc])

        batch = {
            "input_ids": pad("input_ids", self.pad_token_id),
            "labels": pad("labels", -100),
            "token_type_ids": pad("token_type_ids", 0),
            "attention_mask": torch.stack(
                [
                    torch.nn.functional.pad(
                        torch.ones(len(e["input_ids"]), dtype=torch.long), (0, n - len(e["input_ids"]))
                    )
                    for e in enc
                ]
            ),
            "pixel_values": torch.cat([e["pixel_values"] for e in enc]),
        }
        if "aux_target" in enc[0]:
            batch["aux_target"] = torch.cat([e["aux_target"] for e in enc])
        return batch


# --- model --------------------------------------------------------------------------------------


def policy_lora_config(r: int, alpha: int, train_vision: bool):
    """LoRA on the language model's linear layers; tower and projector saved with it if trained."""
    from peft import LoraConfig

    from monailabel_xflow.policy.configs import LORA_TARGET_MODULES

    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=LORA_TARGET_MODULES,
        modules_to_save=list(VISION_MODULES) if train_vision else None,
    )


def _adapter_config(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "adapter_config.json"
    if not path.is_file():
        raise ConfigError(f"{folder} is not a peft adapter folder (no adapter_config.json)")
    return json.loads(path.read_text())


def load_policy_model(
    base: str | Path,
    r: int,
    alpha: int,
    train_vision: bool,
    init_from: str | Path | None = None,
    dtype: str | None = None,
):
    """The base Gemma3 with a fresh trainable adapter ``"default"``, warm-started if asked.

    Args:
        base: base model folder or hub id.
        r, alpha: LoRA rank and scale for a fresh adapter (a warm start takes its adapter's).
        train_vision: unfreeze the vision tower and projector (saved with the adapter).
        init_from: adapter folder whose weights (LoRA, and tower if it has one) start training.
        dtype: torch dtype name; float32 by default.

    Returns:
        ``(peft_model, processor)``.

    Raises:
        ConfigError: ``init_from`` is not an adapter or does not fit the model.
    """
    import torch
    from peft import get_peft_model
    from peft.utils import load_peft_weights, set_peft_model_state_dict
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(str(base))
    model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=getattr(torch, dtype or "float32"))
    warm = _adapter_config(init_from) if init_from is not None else None
    if warm is not None:
        if (warm["r"], warm["lora_alpha"]) != (r, alpha):
            log.info(
                "warm start from %s: LoRA r=%s alpha=%s (the adapter's, not the config's %s/%s)",
                init_from,
                warm["r"],
                warm["lora_alpha"],
                r,
                alpha,
            )
        r, alpha = warm["r"], warm["lora_alpha"]
        train_vision = train_vision or bool(warm.get("modules_to_save"))
    model = get_peft_model(model, policy_lora_config(r, alpha, train_vision))
    if init_from is not None:
        weights = load_peft_weights(str(init_from), device="cpu")
        _fill_unsaved_copies(model, weights)
        result = set_peft_model_state_dict(model, weights, adapter_name="default")
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        missing = [k for k in (getattr(result, "missing_keys", []) or []) if "lora_" in k]
        if unexpected or missing:
            raise ConfigError(
                f"adapter {init_from} does not fit {base}: "
                f"{len(unexpected)} unexpected, {len(missing)} missing LoRA weights "
                f"(e.g. {(unexpected + missing)[:3]})"
            )
        log.info("warm-started adapter from %s (%d tensors)", init_from, len(weights))
    return model, processor


def _fill_unsaved_copies(model, weights: dict) -> None:
    """Give a warm start the tower copies its adapter does not carry, from the base model.

    A π_init trained with the tower frozen saves no tower; π_rev warm-started from it with the
    tower trained needs a starting copy for every peft ``modules_to_save`` wrapper: the base's
    own (e.g. vision-pre-trained) weights, under the keys peft saves them with.
    """
    from peft.utils.other import ModulesToSaveWrapper

    for name, module in model.named_modules():
        if isinstance(module, ModulesToSaveWrapper):
            for key, value in module.original_module.state_dict().items():
                weights.setdefault(f"{name}.{key}", value)


def set_vision_trainable(model, trainable: bool) -> int:
    """(Un)freeze the adapter's copies of the vision tower and projector; returns the count."""
    n = 0
    for name, p in model.named_parameters():
        if ".modules_to_save." in name and any(f"{m}." in name for m in VISION_MODULES):
            p.requires_grad_(trainable)
            n += p.numel()
    return n


def batch_geometry(
    effective_batch: int, per_device: int | None, world_size: int, max_per_device: int = 8
) -> tuple[int, int]:
    """``(per_device_batch, grad_accum)`` reaching ``effective_batch`` (rounded up) on ``world_size``.

    The per-device batch defaults to what one step of ``effective_batch`` needs, capped at
    ``max_per_device``.
    """
    if effective_batch < 1:
        raise ConfigError(f"effective_batch must be >= 1, got {effective_batch}")
    per_step = max(1, math.ceil(effective_batch / world_size))
    per_device = per_device or min(per_step, max_per_device)
    return per_device, max(1, math.ceil(per_step / per_device))


def common_training_args(
    cfg: Any, out_dir: Path, per_device: int, accum: int, report_to: Any, progress: bool
) -> dict[str, Any]:
    """The ``TrainingArguments`` both policy trainers (SFT and GRPO) set the same way."""
    import torch

    return dict(
        output_dir=str(out_dir / "checkpoints"),
        learning_rate=cfg.learning_rate,
        weight_decay=cfg.weight_decay,
        max_grad_norm=cfg.grad_clip,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accum,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps,
        seed=cfg.seed,
        logging_steps=1,
        save_strategy="no",
        report_to=report_to,
        remove_unused_columns=False,
        activation_checkpointing=False,  # TRL's configs default the deprecated alias to True
        disable_tqdm=not progress,
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        dataloader_num_workers=0,
    )


# --- trainer ------------------------------------------------------------------------------------


def _trainer_class():
    import torch
    from trl import SFTTrainer

    from monailabel_xflow.training.aux_head import aux_mask_loss, capture_projector

    class PolicySFTTrainer(SFTTrainer):
        """``SFTTrainer`` with vision-tower param groups and the optional auxiliary mask loss."""

        def __init__(
            self, *args, vision_lr_scale: float = 0.3, aux_head=None, aux_weight: float = 0.0, **kwargs
        ) -> None:
            self.vision_lr_scale = vision_lr_scale
            self.aux_head = aux_head
            self.aux_weight = aux_weight
            super().__init__(*args, **kwargs)

        def create_optimizer(self, model=None):
            if self.optimizer is not None:
                return self.optimizer
            opt_model = self.model if model is None else model
            lr = self.args.learning_rate
            lora, vision = [], []
            for name, p in opt_model.named_parameters():
                if p.requires_grad:
                    (vision if any(f"{m}." in name for m in VISION_MODULES) else lora).append(p)
            groups = [{"params": lora, "lr": lr}]
            if vision:
                groups.append({"params": vision, "lr": lr * self.vision_lr_scale})
            if self.aux_head is not None:
                groups.append({"params": list(self.aux_head.parameters()), "lr": lr})
            cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            kwargs = {k: v for k, v in kwargs.items() if k != "lr"}
            self.optimizer = cls(groups, lr=lr, weight_decay=self.args.weight_decay, **kwargs)
            return self.optimizer

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            aux_target = inputs.pop("aux_target", None)
            if self.aux_head is None or aux_target is None or not model.training:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            with capture_projector(model) as seen:
                out = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            loss = out[0] if return_outputs else out
            aux = aux_mask_loss(torch.cat(seen), self.aux_head, aux_target)
            self._metrics["train"]["aux_mask_loss"].append(float(aux.detach()))
            loss = loss + self.aux_weight * aux
            return (loss, out[1]) if return_outputs else loss

    return PolicySFTTrainer


def train_sft(
    stage: str,
    data: Any,
    base: str | Path,
    out_dir: str | Path,
    cfg: PolicySFTConfig | None = None,
    init_from: str | Path | None = None,
    per_device_batch: int | None = None,
    progress: bool = True,
    report_to: str | list[str] = "none",
) -> dict[str, Any]:
    """Run SFT of π_init (``"init-sft"``) or π_rev (``"rev-sft"``) and save the adapter.

    Args:
        stage: ``"init-sft"`` or ``"rev-sft"``.
        data: builder output folder, ``save_to_disk`` folder, or a ``datasets.Dataset`` with the
            rows of that stage (see :mod:`monailabel_xflow.training.builders`).
        base: base model folder (model + processor) or hub id.
        out_dir: output folder; the adapter is written at its root.
        cfg: hyperparameters (Table 7 defaults).
        init_from: adapter to warm-start from (π_rev: π_init's SFT output).
        per_device_batch: examples per device and step (default: see :func:`batch_geometry`).
        progress: show tqdm progress bars.
        report_to: transformers ``report_to`` (``"none"``, ``"tensorboard"``…).

    Returns:
        The summary written to ``out_dir/xflow_training.json`` (losses per logged step…).

    Raises:
        SFTDataError: rows lack the stage's columns, or are empty.
        ConfigError: a setting that cannot apply (aux loss without its target column, a bad warm start).
    """
    import torch
    from accelerate import PartialState
    from trl import SFTConfig

    if stage not in STAGE_COLUMNS:
        raise ConfigError(f"unknown SFT trainer {stage!r}; one of {sorted(STAGE_COLUMNS)}")
    cfg = cfg or PolicySFTConfig()
    rows = load_rows(data)
    check_columns(rows, STAGE_COLUMNS[stage], stage)
    use_aux = cfg.aux_mask_loss_weight > 0
    aux_column = "error_masks" if stage == "rev-sft" else "lesion_mask"
    if use_aux and aux_column not in rows.column_names:
        raise ConfigError(f"aux_mask_loss_weight > 0 needs a {aux_column} column ({stage} rows have none)")
    if use_aux and cfg.vision_lr_scale <= 0:  # the head's gradient would reach nothing but the head
        raise ConfigError("aux_mask_loss_weight > 0 trains the tower through its head: set vision_lr_scale > 0")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    # vision_lr_scale 0 leaves the tower frozen and out of the adapter (then LoRA only)
    model, processor = load_policy_model(
        base, cfg.lora_r, cfg.lora_alpha, train_vision=cfg.vision_lr_scale > 0, init_from=init_from
    )
    vision_trained = bool(model.peft_config["default"].modules_to_save)
    aux_head, aux_side = None, None
    if use_aux:
        from monailabel_xflow.training.aux_head import mask_token_head, token_grid_side

        aux_side = token_grid_side(int(model.config.mm_tokens_per_image))
    encoder = PolicyExampleEncoder(processor, stage, aux_side)
    if use_aux:
        target = encoder(rows[0])["aux_target"]  # the encoder's targets decide the head's channels
        channels = int(target.shape[2]) if target.ndim == 3 else 1
        aux_head = mask_token_head(int(model.config.get_text_config().hidden_size), channels).to(model.device)
    state = PartialState()
    per_device, accum = batch_geometry(cfg.effective_batch, per_device_batch, state.num_processes)
    tok = processor.tokenizer
    collator = PolicyCollator(encoder, int(tok.pad_token_id))
    args = SFTConfig(
        **common_training_args(cfg, out_dir, per_device, accum, report_to, progress),
        lr_scheduler_type="cosine",
        warmup_steps=0.03,
        dataset_kwargs={"skip_prepare_dataset": True},
    )
    trainer = _trainer_class()(
        model=model,
        args=args,
        train_dataset=rows,
        processing_class=processor,
        data_collator=collator,
        vision_lr_scale=cfg.vision_lr_scale,
        aux_head=aux_head,
        aux_weight=cfg.aux_mask_loss_weight,
    )
    result = trainer.train()
    return save_run(
        trainer,
        state,
        out_dir,
        stage=stage,
        base=base,
        init_from=init_from,
        rows=len(rows),
        cfg=cfg,
        per_device=per_device,
        accum=accum,
        train_loss=float(result.training_loss),
        vision_trained=vision_trained,
        aux_mask_loss=[h["aux_mask_loss"] for h in trainer.state.log_history if "aux_mask_loss" in h],
    )


def save_run(
    trainer: Any,
    state: Any,
    out_dir: Path,
    *,
    stage: str,
    base: str | Path,
    init_from: str | Path | None,
    rows: int,
    cfg: Any,
    per_device: int,
    accum: int,
    **extra: Any,
) -> dict[str, Any]:
    """Save a finished SFT or GRPO run: the LoRA adapter and ``xflow_training.json`` (main process
    only), the summary both trainers write (``extra``: the trainer's own figures)."""
    history = trainer.state.log_history
    if state.is_main_process:
        trainer.model.save_pretrained(str(out_dir), selected_adapters=["default"])
        _drop_if_empty(out_dir / "checkpoints")
    summary = {
        "trainer": stage,
        "base": str(base),
        "init_from": str(init_from) if init_from else None,
        "rows": rows,
        "config": to_dict(cfg),
        "per_device_batch": per_device,
        "grad_accum": accum,
        "processes": state.num_processes,
        "steps": trainer.state.global_step,
        "losses": [h["loss"] for h in history if "loss" in h],
        **extra,
    }
    if state.is_main_process:
        (out_dir / "xflow_training.json").write_text(json.dumps(summary, indent=2))
    return summary


def _drop_if_empty(folder: Path) -> None:
    """Remove the trainer's checkpoint folder when nothing was saved in it (save_strategy="no")."""
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
