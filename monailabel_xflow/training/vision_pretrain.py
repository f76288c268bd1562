"""Vision-tower pre-training of a Gemma3 policy on phantom supervision (the demo's stand-in for
MedGemma's pretrained medical image encoder, as ROSALIA's SAM half is pre-trained).

Why: π_init decides presence from the 16 projected image tokens. Trained from nothing during
LoRA SFT, the tower gets its signal only through a few answer tokens (and the auxiliary mask
loss), and the demo's presence decision stayed below answering "present" to everything. A
vision-only phase is cheap (no language model in the step: ~50x less compute than an SFT step),
so it can run many steps on many phantoms before SFT.

What is trained: the base model's ``vision_tower`` and ``multi_modal_projector`` (the modules SFT
unfreezes, :data:`~monailabel_xflow.training.sft.VISION_MODULES`), through two training-only heads
on the *projected image tokens* (the vectors spliced into the language model's input):

* **cells**: a linear head gives every token ``k`` a logit ``c[k, f]`` per finding ``f``; its
  target is 1 where finding ``f`` covers more than :data:`CELL_FRACTION` of the token's cell
  (:func:`~monailabel_xflow.training.aux_head.finding_token_targets`).
* **questions**: each question kind ``q`` (finding, level, regions) seen in training gets a
  learned spatial log-weight ``a[q, k]`` and bias ``b[q]``; its presence logit is
  ``logsumexp_k(c[k, f_q] + a[q, k]) + b[q]``, a soft OR over the cells of its region, trained
  with BCE on the question's answer. Presence per finding *and* region thus has to be readable
  from the tokens, finding by finding, where the language model's attention can read it.

Neither head is saved: the result is a base model folder (weights + processor) whose tower and
projector are pre-trained, which SFT then starts from. The pixels are what inference feeds the
policy: :func:`~monailabel_xflow.training.sft.policy_image` then the processor, through
:meth:`~monailabel_xflow.policy.conversation.ConversationEncoder.prompt`.

Heavy imports (torch, transformers) happen inside the functions.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["CELL_FRACTION", "VisionSet", "question_key", "vision_set", "pretrain_vision", "presence_accuracy"]

CELL_FRACTION = 0.01
"""A token's cell counts as holding a finding when the finding covers more than this fraction of it."""


def question_key(row: dict[str, Any]) -> str:
    """The question kind of an ``init-sft`` row: finding, level and regions (its canonical
    instruction's, e.g. ``"effusion|lung|left lung"``)."""
    from monailabel_xflow.instructions import parse_instruction

    ins = parse_instruction(row["instruction"])
    return f"{ins.finding}|{ins.level}|{','.join(ins.regions)}"


@dataclass
class VisionSet:
    """Pre-training tensors, one entry per distinct image.

    Attributes:
        pixels: ``(n, 3, S, S)`` float32, the policy's pixel values.
        cells: ``(n, tokens, findings)`` float32 in {0, 1}.
        questions: ``(n, kinds)`` float32: 1 present, 0 absent, -1 not asked about that image.
        keys: the question kinds (column order of ``questions``).
        images: image paths (row order).
    """

    pixels: Any
    cells: Any
    questions: Any
    keys: list[str]
    images: list[str]


def vision_set(rows, processor, side: int, keys: Sequence[str] | None = None) -> VisionSet:
    """Gather :class:`VisionSet` tensors from ``init-sft`` rows (``image``, ``instruction``,
    ``positive``, ``finding_masks``).

    Args:
        rows: iterable of row dicts (a ``datasets.Dataset`` works).
        processor: the policy's processor.
        side: token-grid side (:func:`~monailabel_xflow.training.aux_head.token_grid_side`).
        keys: question kinds to use (default: every kind in ``rows``, sorted); kinds not listed
            are ignored (a held-out set is scored on the training kinds).
    """
    import torch

    from monailabel_xflow.policy.conversation import ConversationEncoder
    from monailabel_xflow.training.aux_head import finding_token_targets
    from monailabel_xflow.training.sft import policy_image

    per_image: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = per_image.setdefault(row["image"], {"masks": row["finding_masks"], "answers": {}})
        entry["answers"][question_key(row)] = bool(row["positive"])
    keys = sorted({k for e in per_image.values() for k in e["answers"]}) if keys is None else list(keys)
    index = {k: j for j, k in enumerate(keys)}
    encoder = ConversationEncoder(processor)
    pixels, cells, questions = [], [], []
    for image, entry in per_image.items():
        piece = encoder.prompt(encoder.image_token, [policy_image(image)])
        if piece.pixel_values is None:  # a prompt with an image always has its pixels
            raise ValueError(f"{image}: the processor returned no pixels")
        pixels.append(piece.pixel_values[0])
        cells.append(finding_token_targets(entry["masks"], side) > CELL_FRACTION)
        answers = np.full(len(keys), -1.0, np.float32)
        for k, present in entry["answers"].items():
            if k in index:
                answers[index[k]] = float(present)
        questions.append(answers)
    return VisionSet(
        torch.stack(pixels).float(),
        torch.from_numpy(np.stack(cells).astype(np.float32)),
        torch.from_numpy(np.stack(questions)),
        keys,
        list(per_image),
    )


class _Heads:
    """The training-only heads (module docstring): cell logits and per-question presence logits."""

    def __init__(self, hidden: int, findings: Sequence[str], keys: Sequence[str], tokens: int) -> None:
        import torch
        from torch import nn

        from monailabel_xflow.training.aux_head import mask_token_head

        self.cell = mask_token_head(hidden, len(findings))
        self.spatial = nn.Parameter(torch.zeros(len(keys), tokens))
        self.bias = nn.Parameter(torch.zeros(len(keys)))
        finding_of = {f: j for j, f in enumerate(findings)}
        self.finding = torch.tensor([finding_of[k.split("|")[0]] for k in keys])

    def parameters(self) -> list:
        return [*self.cell.parameters(), self.spatial, self.bias]

    def __call__(self, tokens):
        """``(n, tokens, hidden)`` -> cell logits ``(n, tokens, findings)``, presence ``(n, kinds)``."""
        import torch

        cell = self.cell(tokens)
        per_kind = cell[:, :, self.finding].transpose(1, 2) + self.spatial[None]  # (n, kinds, tokens)
        return cell, torch.logsumexp(per_kind, dim=2) + self.bias


def _image_tokens(model, pixels):
    """Projected image tokens ``(n, tokens, hidden)``: the vectors the language model receives."""
    out = model.get_image_features(pixel_values=pixels)
    return out.pooler_output if hasattr(out, "pooler_output") else out


def _vision_parameters(model) -> list:
    from monailabel_xflow.training.sft import VISION_MODULES

    return [p for name, p in model.named_parameters() if any(f"{m}." in name for m in VISION_MODULES)]


def _losses(model, heads: _Heads, data: VisionSet, idx, pos_weight):
    """Cell and presence BCE of the images ``idx``; positives weighted by ``pos_weight`` (absent
    over present answers in training), so presence is learned balanced as π_init SFT sees it."""
    import torch.nn.functional as F

    cell, presence = heads(_image_tokens(model, data.pixels[idx]))
    cell_loss = F.binary_cross_entropy_with_logits(cell, data.cells[idx])
    answers = data.questions[idx]
    asked = answers >= 0
    q_loss = F.binary_cross_entropy_with_logits(presence[asked], answers[asked], pos_weight=pos_weight)
    return cell_loss, q_loss


def presence_accuracy(model, heads: _Heads, data: VisionSet, batch: int = 64) -> dict[str, float]:
    """Balanced accuracy of the presence head on ``data`` (mean of the accuracy on present and on
    absent answers), and the fraction of cells classified right."""
    import torch

    hits = {True: [0, 0], False: [0, 0]}
    cells_right = cells_all = 0
    with torch.no_grad():
        for start in range(0, len(data.pixels), batch):
            idx = torch.arange(start, min(start + batch, len(data.pixels)))
            cell, presence = heads(_image_tokens(model, data.pixels[idx]))
            answers = data.questions[idx]
            for sign in (True, False):
                sel = answers == float(sign)
                hits[sign][0] += int(((presence[sel] > 0) == sign).sum())
                hits[sign][1] += int(sel.sum())
            cells_right += int(((cell > 0).float() == data.cells[idx]).sum())
            cells_all += cell.numel()
    recall = {s: h / n if n else float("nan") for s, (h, n) in hits.items()}
    return {
        "balanced_accuracy": float(np.nanmean([recall[True], recall[False]])),
        "present_recall": recall[True],
        "absent_recall": recall[False],
        "cell_accuracy": cells_right / max(1, cells_all),
    }


def pretrain_vision(
    base: str | Path,
    rows,
    out: str | Path,
    steps: int,
    batch: int = 32,
    lr: float = 1e-3,
    holdout: float = 0.05,
    question_weight: float = 1.0,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Pre-train ``base``'s vision tower and projector on ``rows`` and save the whole model to ``out``.

    Args:
        base: base model folder (model + processor), e.g. the random demo base.
        rows: ``init-sft`` rows (every question of every image; see :func:`vision_set`).
        out: folder for the pre-trained base (weights + processor; loads like ``base``).
        steps: optimiser steps (AdamW, cosine schedule, weight decay 0.01).
        batch: images per step.
        lr: peak learning rate.
        holdout: fraction of the images held out of training and scored before and after
            (:func:`presence_accuracy`), the phase's learning check.
        question_weight: weight of the presence loss beside the cell loss.
        seed: image split, data order, head initialisation.
        progress: show a progress bar.

    Returns:
        Steps, first/last losses (means of the first/last 20 steps), held-out figures before and
        after, image and question-kind counts, seconds; also written to ``out/xflow_vision.json``.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from monailabel_xflow.training.aux_head import token_grid_side
    from monailabel_xflow.vocabulary import FINDINGS

    start_time = time.perf_counter()
    torch.manual_seed(seed)
    processor = AutoProcessor.from_pretrained(str(base))
    model = AutoModelForImageTextToText.from_pretrained(str(base), dtype=torch.float32)
    tokens = int(model.config.mm_tokens_per_image)
    data = vision_set(rows, processor, token_grid_side(tokens))
    order = np.random.default_rng(seed).permutation(len(data.images))
    n_held = int(round(holdout * len(order)))
    held_idx, train_idx = torch.from_numpy(order[:n_held]), torch.from_numpy(order[n_held:])
    held = VisionSet(
        data.pixels[held_idx],
        data.cells[held_idx],
        data.questions[held_idx],
        data.keys,
        [data.images[i] for i in held_idx],
    )
    hidden = int(model.config.get_text_config().hidden_size)
    heads = _Heads(hidden, FINDINGS, data.keys, tokens)
    for p in model.parameters():
        p.requires_grad_(False)
    params = _vision_parameters(model)
    for p in params:
        p.requires_grad_(True)
    model.eval()  # no dropout in the figures; training mode changes nothing else for SigLIP
    before = presence_accuracy(model, heads, held) if n_held else {}
    optimizer = torch.optim.AdamW([*params, *heads.parameters()], lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=max(1, steps), pct_start=0.05)
    rng = np.random.default_rng(seed + 1)
    answers = data.questions[train_idx]
    pos_weight = ((answers == 0).sum() / (answers == 1).sum().clamp(min=1)).clamp(min=1.0)
    cell_losses, q_losses = [], []
    for _ in tqdm(range(steps), desc="vision pre-training", disable=not progress):
        idx = train_idx[torch.from_numpy(rng.choice(len(train_idx), min(batch, len(train_idx)), replace=False))]
        cell_loss, q_loss = _losses(model, heads, data, idx, pos_weight)
        loss = cell_loss + question_weight * q_loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        cell_losses.append(float(cell_loss.detach()))
        q_losses.append(float(q_loss.detach()))
    after = presence_accuracy(model, heads, held) if n_held else {}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    losses = np.asarray(cell_losses) + question_weight * np.asarray(q_losses)
    summary = {
        "steps": steps,
        "batch": batch,
        "lr": lr,
        "images": len(train_idx),
        "held_out_images": n_held,
        "question_kinds": len(data.keys),
        "present_weight": float(pos_weight),
        "loss_first_last": [float(losses[:20].mean()), float(losses[-20:].mean())] if steps else None,
        "question_loss_first_last": [float(np.mean(q_losses[:20])), float(np.mean(q_losses[-20:]))] if steps else None,
        "held_out_before": before,
        "held_out_after": after,
        "seconds": time.perf_counter() - start_time,
    }
    (out / "xflow_vision.json").write_text(json.dumps(summary, indent=1))
    log.info("vision pre-training: %s", json.dumps({k: summary[k] for k in ("loss_first_last", "held_out_after")}))
    return summary
