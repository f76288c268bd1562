"""The training-only auxiliary mask loss of π_init SFT (optional, off by default).

Why: a from-scratch (or randomly initialised) vision tower gets almost no gradient from the
cross-entropy on a few answer tokens; the language model fits the text prior and ignores the
image. A linear head on the *projected image tokens* (the output of Gemma3's
``multi_modal_projector``, the very vectors spliced into the language model's input) that predicts
each token's cell of the lesion mask gives every image token a direct, spatial signal.

Contract:

* Gemma3 turns an image into ``mm_tokens_per_image`` soft tokens by average-pooling the SigLIP
  patch grid to ``side x side`` (``side = sqrt(mm_tokens_per_image)``) and flattening it row by
  row, so token ``k`` covers the cell ``(k // side, k % side)`` of the image *as the processor
  resized it* (the whole image squashed to a square, no crop). The target of token ``k`` is the
  fraction of that cell covered by the lesion mask (soft BCE target in ``[0, 1]``).
* The head is a plain ``torch.nn.Linear(hidden, 1)`` owned by the trainer, not by the model: it
  is never registered as a submodule, never wrapped by peft, and so never saved. The saved
  adapter loads as plain Gemma3 + LoRA and runs with ordinary ``generate``.

Heavy imports (torch) happen inside the functions; the module itself imports only numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "token_grid_side",
    "mask_token_targets",
    "finding_token_targets",
    "error_token_targets",
    "mask_token_head",
    "capture_projector",
    "aux_mask_loss",
]


def token_grid_side(mm_tokens_per_image: int) -> int:
    """Side of the square soft-token grid (``mm_tokens_per_image`` must be a perfect square).

    Raises:
        ValueError: not a perfect square.
    """
    side = int(round(math.sqrt(mm_tokens_per_image)))
    if side * side != mm_tokens_per_image:
        raise ValueError(f"mm_tokens_per_image={mm_tokens_per_image} is not a square grid")
    return side


def mask_token_targets(mask: np.ndarray | str | Path | None, side: int) -> np.ndarray:
    """Per-token targets: the lesion fraction of each cell of a ``side x side`` grid.

    Args:
        mask: ``(H, W)`` bool/0-255 array, a PNG path (0/255), or None (no lesion: all zeros).
        side: grid side (:func:`token_grid_side`).

    Returns:
        float32 ``(side * side,)`` in ``[0, 1]``, row-major (token order).
    """
    if mask is None:
        return np.zeros(side * side, np.float32)
    if isinstance(mask, (str, Path)):
        from PIL import Image

        mask = np.asarray(Image.open(mask).convert("L")) > 127
    m = np.asarray(mask).astype(np.float32)
    if m.max() > 1:
        m = m / 255.0
    h, w = m.shape
    # Area average over each cell: cell edges at i*h/side (fractional edges handled by
    # resampling to a multiple of side first, then block-averaging).
    from PIL import Image

    big = side * max(1, int(math.ceil(max(h, w) / side)))
    up = np.asarray(Image.fromarray(m).resize((big, big), Image.Resampling.BILINEAR), np.float32)
    cells = up.reshape(side, big // side, side, big // side).mean(axis=(1, 3))
    return np.clip(cells, 0.0, 1.0).reshape(-1).astype(np.float32)


def finding_token_targets(masks, side: int) -> np.ndarray:
    """Per-token, per-channel targets: :func:`mask_token_targets` of each mask, side by side.

    Args:
        masks: one mask (array, PNG path, or None/"" for "none in this image") per channel.
        side: grid side.

    Returns:
        float32 ``(side * side, len(masks))``.
    """
    return np.stack([mask_token_targets(None if isinstance(m, str) and not m else m, side) for m in masks], axis=1)


def error_token_targets(error_png: str | Path | np.ndarray, side: int) -> np.ndarray:
    """Per-token targets of π_rev's auxiliary error loss: the missed (red) and spilled (green)
    fraction of each cell of a :func:`~monailabel_xflow.training.builders.error_map` picture.

    Returns:
        float32 ``(side * side, 2)``: channel 0 missed, channel 1 spilled.
    """
    if isinstance(error_png, (str, Path)):
        from PIL import Image

        error_png = np.asarray(Image.open(error_png).convert("RGB"))
    rgb = np.asarray(error_png)
    return np.stack([mask_token_targets(rgb[..., c] > 127, side) for c in (0, 1)], axis=1)


def mask_token_head(hidden_size: int, channels: int = 1):
    """The linear head: ``torch.nn.Linear(hidden_size, channels)``, zero bias, weights of std
    ``hidden_size ** -0.5``, so the auxiliary loss starts near ``log 2`` per token."""
    from torch import nn

    head = nn.Linear(hidden_size, channels)
    nn.init.normal_(head.weight, std=hidden_size**-0.5)
    nn.init.zeros_(head.bias)
    return head


@contextmanager
def capture_projector(model: Any) -> Iterator[list]:
    """Record the outputs of the model's ``multi_modal_projector`` while the block runs.

    Yields a list that receives one ``(n_images, tokens, hidden)`` tensor per projector call
    (with gradients attached). Works on a bare Gemma3 model or through peft wrappers (it finds
    the module by name; under peft ``modules_to_save`` the active copy is the one that runs).

    Raises:
        ValueError: the model has no ``multi_modal_projector``.
    """
    modules = [m for name, m in model.named_modules() if _is_projector(name)]
    if not modules:
        raise ValueError("model has no multi_modal_projector: the auxiliary mask loss needs a Gemma3 VLM")
    seen: list = []
    handles = [m.register_forward_hook(lambda _m, _i, out: seen.append(out)) for m in modules]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def _is_projector(name: str) -> bool:
    """Projector modules that actually run: the plain one, or peft's trainable copies.

    Under peft ``modules_to_save`` the wrapper's ``original_module`` is skipped when an adapter
    copy is active; hooking the wrapper itself catches the output of whichever copy ran.
    """
    return name.endswith("multi_modal_projector")


def aux_mask_loss(projected: Any, head: Any, targets: Any) -> Any:
    """Mean BCE between the head's per-token logits and the cell targets.

    Args:
        projected: ``(n_images, tokens, hidden)`` projected image tokens.
        head: the linear head (``channels`` outputs).
        targets: ``(n_images, tokens)`` (one channel) or ``(n_images, tokens, channels)``,
            float in ``[0, 1]``.

    Returns:
        A scalar tensor.

    Raises:
        ValueError: shapes do not match.
    """
    import torch.nn.functional as F

    channels = head.out_features
    if targets.ndim == 2:
        targets = targets[..., None]
    if projected.shape[:2] != targets.shape[:2] or targets.shape[2] != channels:
        raise ValueError(
            f"projected image tokens {tuple(projected.shape)} and a {channels}-channel head "
            f"do not match targets {tuple(targets.shape)}"
        )
    logits = head(projected.to(head.weight.dtype))
    return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))
