"""GRPO of π_init and π_rev with trl's ``GRPOTrainer`` (paper §4.4, Eq. 4.5 and 4.7, Table 7).

Which trl hook, and why
-----------------------
trl 1.16 offers two ways to own the rollout: ``environment_factory`` (the environment's methods
become *tools* the model calls through the chat template's tool-calling format, and tool results
come back as tool turns) and ``rollout_func`` (a function that returns the prompt and completion
token ids itself). XFlow's policies do not call tools: π_rev answers ``<click>…</click>`` or
``<stop/>`` and the next observation comes back as a *user* turn (``stage2_followup_text``), the
conversation that :class:`~monailabel_xflow.policy.vlm.VLMRevisionSession` holds at inference. An
environment would train a different conversation from the one inference asks, so both stages use
**``rollout_func``**, and the rollouts run through the inference code itself:
:class:`~monailabel_xflow.policy.vlm.VLMPolicy` wraps the model being trained (sampling settings
from the config), Stage 1 encodes its prompt with ``VLMPolicy.stage1_inputs`` and Stage 2 runs a
real ``VLMRevisionSession`` with F_seg in the loop, turn by turn as
:class:`~monailabel_xflow.workflow.xflow` does (box growth, all clicks so far, previous logits), for at
most ``max_clicks`` turns.

One thing ``rollout_func`` does not carry is the images: trl builds the pixel inputs of the
loss from the dataset's ``image`` column and the *prompt* only, while a π_rev trajectory holds one
observation per turn inside the completion (and even π_init's image must go through the CXR
loader, not trl's). :class:`XFlowGRPOTrainer` therefore takes the pixel values, image counts and
token types of each rollout from the rollout itself (two small overrides), and the dataset handed
to trl keeps the image path under ``image_path`` so trl does not load it a second time. The
tokens of the user turns between π_rev's answers are masked out of the loss with trl's
``env_mask``.

Rewards are the pure functions of :mod:`monailabel_xflow.training.rewards` (``init_reward``,
``revision_reward``) wrapped as trl reward functions, one per term so trl logs each term; their
sum is R_init / R_rev. F_seg stays frozen throughout; the adapters train on the language layers
only and the vision tower (trained in SFT, carried by the adapter) is frozen (paper A.4). The KL
reference is trl's frozen copy of the starting adapter (``"ref"``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.training import rewards
from monailabel_xflow.training.config import ConfigError, PolicyGRPOConfig
from monailabel_xflow.training.sft import check_columns, load_rows

log = logging.getLogger(__name__)

__all__ = [
    "RL_COLUMNS",
    "init_reward_funcs",
    "revision_reward_funcs",
    "InitRollout",
    "RevisionRollout",
    "trl_dataset",
    "train_grpo",
]

RL_COLUMNS = {
    "init-rl": ("image", "instruction", "gt_boxes"),
    "rev-rl": ("image", "instruction", "start_box", "gt_mask"),
}
DEFAULT_MAX_NEW_TOKENS = {"init-rl": 256, "rev-rl": 64}
"""Tokens per completion (π_init) and per turn (π_rev) when the caller gives none."""


# --- rewards ------------------------------------------------------------------------------------


def init_reward_funcs() -> list:
    """trl reward functions for the three terms of R_init (box, format, repetition).

    Each receives the completions (``[{"role": "assistant", "content": text}]`` or text) and the
    ``gt_boxes`` column, and calls :func:`monailabel_xflow.training.rewards.init_reward`.
    """

    def term(key: str):
        def reward(completions, gt_boxes, **_: Any) -> list[float]:
            return [
                float(rewards.init_reward(_text(c), [tuple(b) for b in boxes])[key])
                for c, boxes in zip(completions, gt_boxes, strict=False)
            ]

        reward.__name__ = f"r_init_{key}"
        return reward

    return [term("box"), term("format"), term("rep")]


def revision_reward_funcs() -> list:
    """trl reward functions for the terms of R_rev (IoU gain, format).

    They read what :class:`RevisionRollout` returns beside the ids: ``turn_texts`` (raw text of
    every turn), ``first_mask``, ``final_mask`` and ``gt`` (bool arrays), and call
    :func:`monailabel_xflow.training.rewards.revision_reward`.
    """

    def term(key: str):
        def reward(completions, turn_texts, first_mask, final_mask, gt, **_: Any) -> list[float]:
            return [
                float(rewards.revision_reward(t, m0, mt, g)[key])
                for t, m0, mt, g in zip(turn_texts, first_mask, final_mask, gt, strict=False)
            ]

        reward.__name__ = f"r_rev_{key}"
        return reward

    return [term("gain"), term("format")]


def _text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        return (
            content if isinstance(content, str) else " ".join(c.get("text", "") for c in content if isinstance(c, dict))
        )
    return str(completion)


# --- rollouts -----------------------------------------------------------------------------------


class _Rollout:
    """Shared plumbing: a sampling :class:`VLMPolicy` around the model being trained."""

    def __init__(self, processor, temperature: float, top_p: float, max_new_tokens: int, zoom: bool = False) -> None:
        from monailabel_xflow.policy.vlm import GenerationSettings

        self.processor = processor
        self.zoom = zoom
        self.settings = GenerationSettings(
            do_sample=True, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens
        )

    def policy(self, trainer):
        """The inference policy on the trainer's (unwrapped) model, with its active adapter."""
        from monailabel_xflow.policy.vlm import VLMPolicy

        model = trainer.accelerator.unwrap_model(trainer.model)
        policy = VLMPolicy(model, self.processor, generation=self.settings, zoom=self.zoom)
        # The adapter being trained is "default" (not "init"/"rev"): run the model as it is,
        # rather than with adapters disabled (VLMPolicy's rule for a missing stage adapter).
        policy.adapters = frozenset()
        return policy

    def __call__(self, prompts: list, trainer) -> dict[str, Any]:
        import torch

        rows = trainer._xflow_rows
        if len(rows) != len(prompts):
            raise RuntimeError(f"rollout got {len(prompts)} prompts for {len(rows)} rows")
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                episodes = [self.episode(self.policy(trainer), row) for row in rows]
        finally:
            model.train(was_training)
        out: dict[str, Any] = {key: [e[key] for e in episodes] for key in episodes[0]}
        trainer._xflow_mm = {k: out.pop(k) for k in ("pixel_values", "prompt_tti", "completion_tti")}
        out["logprobs"] = None
        return out

    def episode(self, policy, row: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError


class InitRollout(_Rollout):
    """π_init rollouts: one sampled Stage 1 answer per row, encoded exactly as ``VLMPolicy.stage1``."""

    def episode(self, policy, row: dict[str, Any]) -> dict[str, Any]:

        from monailabel_xflow.instructions import parse_instruction
        from monailabel_xflow.transforms import load_cxr

        image, _ = load_cxr(row["image_path"])
        enc = policy.stage1_inputs(image, parse_instruction(row["instruction"]))
        out = policy.generate(enc, pixel_values=enc.pixel_values)
        n = enc.input_ids.shape[1]
        completion = out.sequences[0, n:].tolist()
        return {
            "prompt_ids": enc.input_ids[0].tolist(),
            "completion_ids": completion,
            "pixel_values": enc.pixel_values.float().cpu(),
            "prompt_tti": enc.token_type_ids[0].tolist(),
            "completion_tti": [0] * len(completion),
        }


class RevisionRollout(_Rollout):
    """π_rev rollouts: a Stage 2 episode with F_seg in the loop, as the workflow runs it.

    Args:
        segmenter: F_seg (frozen), a :class:`~monailabel_xflow.segmenter.base.PromptableSegmenter`.
        max_clicks: the turn budget T.
    """

    def __init__(self, processor, segmenter, max_clicks: int, **kwargs: Any) -> None:
        super().__init__(processor, **kwargs)
        self.segmenter = segmenter
        self.max_clicks = max_clicks

    def episode(self, policy, row: dict[str, Any]) -> dict[str, Any]:
        import torch
        from PIL import Image

        from monailabel_xflow.instructions import parse_instruction
        from monailabel_xflow.transforms import load_cxr
        from monailabel_xflow.workflow.revision import revise_mask

        image, _ = load_cxr(row["image_path"])
        with Image.open(row["gt_mask"]) as im:
            gt = np.asarray(im.convert("L").resize((image.shape[1], image.shape[0]), Image.Resampling.NEAREST)) > 127
        instruction = parse_instruction(row["instruction"])
        x1, y1, x2, y2 = (float(v) for v in row["start_box"])
        box = (x1, y1, x2, y2)
        self.segmenter.set_image(image)
        res = self.segmenter.predict([box])
        first = np.asarray(res.masks[0], bool)
        session = policy.start(image, instruction, box)
        # the workflow's own Stage 2 loop (pruning included), the session recording its tokens
        run = revise_mask(
            self.segmenter, session, image, instruction, box, first, res.low_res_logits[0:1], budget=self.max_clicks
        )
        ids = session.input_ids[0].tolist()
        tti = session.token_type_ids[0].tolist()
        prompt_len = session.answer_spans[0][0]
        env_mask = [0] * (len(ids) - prompt_len)
        for start, end in session.answer_spans:
            for k in range(start, end):
                env_mask[k - prompt_len] = 1
        return {
            "prompt_ids": ids[:prompt_len],
            "completion_ids": ids[prompt_len:],
            "env_mask": env_mask,
            "pixel_values": torch.cat(session.pixel_values, dim=0).float().cpu(),
            "prompt_tti": tti[:prompt_len],
            "completion_tti": tti[prompt_len:],
            "turn_texts": list(session.texts),
            "first_mask": first,
            "final_mask": run.mask,
            "gt": gt,
        }


# --- the trainer --------------------------------------------------------------------------------


def _trainer_class():
    import torch
    from trl import GRPOTrainer

    class XFlowGRPOTrainer(GRPOTrainer):
        """``GRPOTrainer`` whose pixel inputs and token types come from the rollouts.

        During ``_generate_and_score_completions`` the batch rows are exposed to the rollout
        (``_xflow_rows``); the rollout leaves each row's images and token types in
        ``_xflow_mm``, which feed the old/reference log-prob passes and are put into the
        batch for the loss (flat ``pixel_values`` + ``num_images``, which trl splits per row
        when it shuffles and slices the batch).
        """

        _xflow_rows = None
        _xflow_mm = None
        _xflow_forward = None

        def _generate_and_score_completions(self, inputs):
            self._xflow_rows = inputs
            self._xflow_forward = None
            try:
                output = super()._generate_and_score_completions(inputs)
                output.update(self._mm_kwargs(output["prompt_ids"].shape[1], output["completion_ids"].shape[1]))
            finally:
                self._xflow_rows, self._xflow_mm = None, None
            return output

        def _mm_kwargs(self, prompt_width: int, completion_width: int) -> dict[str, Any]:
            mm = self._xflow_mm
            device = self.accelerator.device
            rows = []
            for p, c in zip(mm["prompt_tti"], mm["completion_tti"], strict=False):
                rows.append([0] * (prompt_width - len(p)) + list(p) + list(c) + [0] * (completion_width - len(c)))
            return {
                "pixel_values": torch.cat(mm["pixel_values"]).to(device),
                "num_images": [len(p) for p in mm["pixel_values"]],
                "token_type_ids": torch.tensor(rows, dtype=torch.long, device=device),
            }

        def _get_per_token_logps_and_entropies(
            self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, **kwargs
        ):
            if kwargs.get("pixel_values") is None and self._xflow_mm is not None:
                width = input_ids.shape[1] - logits_to_keep
                kwargs.update(self._mm_kwargs(width, logits_to_keep))
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size, **kwargs
            )

    return XFlowGRPOTrainer


def trl_dataset(rows):
    """The rows as trl wants them: a text ``prompt`` for its bookkeeping, ``image`` → ``image_path``.

    The conversation the model sees is built by the rollout (module docstring); ``prompt`` only
    names the question in trl's logs.
    """
    rows = rows.rename_column("image", "image_path")
    return rows.map(lambda r: {"prompt": [{"role": "user", "content": r["instruction"]}]})


def train_grpo(
    stage: str,
    data: Any,
    base: str | Path,
    out_dir: str | Path,
    init_from: str | Path | None,
    cfg: PolicyGRPOConfig | None = None,
    segmenter: Any = None,
    max_new_tokens: int | None = None,
    per_device_batch: int | None = None,
    progress: bool = True,
    report_to: str | list[str] = "none",
    zoom: bool = False,
) -> dict[str, Any]:
    """Run GRPO of π_init (``"init-rl"``) or π_rev (``"rev-rl"``) and save the adapter.

    Args:
        stage: ``"init-rl"`` or ``"rev-rl"``.
        data: builder output, ``save_to_disk`` folder or ``datasets.Dataset`` of that stage's rows.
        base: base model folder or hub id.
        out_dir: output folder (the adapter at its root, ``xflow_training.json`` beside it).
        init_from: the SFT adapter of the same policy (Table 7: RL starts there); None starts a
            fresh LoRA (tests, ablations).
        cfg: hyperparameters (Table 7 defaults for the stage).
        segmenter: F_seg for ``rev-rl`` (a ``PromptableSegmenter``, or a path for
            :func:`~monailabel_xflow.segmenter.loading.load_segmenter`).
        max_new_tokens: per completion (π_init) or per turn (π_rev).
        per_device_batch: completions per device and step; default: one step's share of the
            effective batch (Table 7 counts it in completions), capped at 16, the rest being
            gradient accumulation. The completions of one step, over all processes, must be a
            multiple of ``num_generations`` (trl forms the groups from them).
        zoom: π_rev looks at the zoomed view (``VLMPolicy(zoom=True)``), as its SFT rows did.

    Returns:
        The summary written to ``out_dir/xflow_training.json``.

    Raises:
        SFTDataError: rows lack the stage's columns.
        ConfigError: bad settings (no segmenter for rev-rl, batch not a multiple of the group).
    """
    import torch
    from accelerate import PartialState
    from trl import GRPOConfig

    from monailabel_xflow.training.sft import (
        batch_geometry,
        common_training_args,
        load_policy_model,
        save_run,
        set_vision_trainable,
    )

    if stage not in RL_COLUMNS:
        raise ConfigError(f"unknown RL trainer {stage!r}; one of {sorted(RL_COLUMNS)}")
    cfg = cfg or PolicyGRPOConfig()
    rows = load_rows(data)
    check_columns(rows, RL_COLUMNS[stage], stage)
    if stage == "rev-rl" and segmenter is None:
        raise ConfigError("rev-rl runs F_seg in the loop: give a segmenter")
    if isinstance(segmenter, (str, Path)):
        from monailabel_xflow.segmenter.loading import load_segmenter

        segmenter = load_segmenter(segmenter)
    state = PartialState()
    g = cfg.num_generations
    if g < 2:
        raise ConfigError(f"num_generations must be >= 2 (GRPO normalises within a group), got {g}")
    per_device, accum = batch_geometry(cfg.effective_batch, per_device_batch, state.num_processes, max_per_device=16)
    if (per_device * accum * state.num_processes) % g:
        raise ConfigError(
            f"completions per step ({per_device} x {accum} x {state.num_processes}) must be a "
            f"multiple of num_generations={g}"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model, processor = load_policy_model(base, cfg.lora_r, cfg.lora_alpha, train_vision=False, init_from=init_from)
    frozen = set_vision_trainable(model, False)  # RL: language layers only (paper A.4)
    if frozen:
        log.info("vision tower carried by the adapter, frozen for RL (%d parameters)", frozen)
    max_new = max_new_tokens or DEFAULT_MAX_NEW_TOKENS[stage]
    sampling: dict[str, Any] = dict(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=max_new)
    rollout: _Rollout
    if stage == "init-rl":
        rollout, reward_funcs = InitRollout(processor, **sampling), init_reward_funcs()
    else:
        rollout = RevisionRollout(processor, segmenter, cfg.max_clicks, **sampling, zoom=zoom)
        reward_funcs = revision_reward_funcs()
    args = GRPOConfig(
        **common_training_args(cfg, out_dir, per_device, accum, report_to, progress),
        num_generations=g,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        beta=cfg.kl_beta,
        max_completion_length=max_new * (cfg.max_clicks if stage == "rev-rl" else 1),
    )
    trainer = _trainer_class()(
        model=model,
        reward_funcs=reward_funcs,
        args=args,
        train_dataset=trl_dataset(rows),
        processing_class=processor,
        rollout_func=rollout,
    )
    trainer.train()
    history = trainer.state.log_history
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
        max_new_tokens=max_new,
        reward=[h["reward"] for h in history if "reward" in h],
        rewards_per_term={
            k: [h[k] for h in history if k in h]
            for k in sorted({k for h in history for k in h if k.startswith("rewards/")})
        },
    )
