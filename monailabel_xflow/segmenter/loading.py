"""Building F_seg from weights, with either backend."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from monailabel_xflow.segmenter.base import PromptableSegmenter
from monailabel_xflow.segmenter.cache import EmbeddingCache
from monailabel_xflow.segmenter.refine import ClickRefinement
from monailabel_xflow.segmenter.sam3 import Sam3Segmenter, load_tracker_model
from monailabel_xflow.segmenter.zoom import ZoomedSegmenter, read_view
from monailabel_xflow.weights import weights_tag

if TYPE_CHECKING:  # pragma: no cover
    import torch


BACKENDS = ("transformers", "official")


def load_segmenter(
    name_or_path: str | Path,
    backend: str = "transformers",
    device: str | torch.device | None = None,
    *,
    dtype: torch.dtype | None = None,
    cache: EmbeddingCache | None = None,
    config: Any = None,
    encode_precision: str | None = "float32",
    refinement: ClickRefinement | None = None,
) -> PromptableSegmenter:
    """Build F_seg from weights (see :func:`load_tracker_model` for what ``name_or_path`` may be).

    Args:
        name_or_path: local HF folder, hub id, or official ``.pt`` checkpoint.
        backend: ``"transformers"`` (any device) or ``"official"`` (the ``sam3`` package; CUDA only,
            needs the ``sam3`` extra).
        device: defaults to CUDA when available, else CPU.
        dtype, cache, config: passed to :class:`Sam3Segmenter` / :func:`load_tracker_model`.
        encode_precision: the image encoder's arithmetic (:data:`~monailabel_xflow.weights.ENCODE_PRECISIONS`;
            the transformers backend only; the official one runs as its package decides).
        refinement: make masks agree with their clicks by backpropagation (:mod:`.refine`; the
            transformers backend only); None: the model's own answer.

    Returns:
        The transformers backend's segmenter, wrapped in a
        :class:`~monailabel_xflow.segmenter.zoom.ZoomedSegmenter` when the weights folder says they
        were trained to zoom (:func:`~monailabel_xflow.segmenter.zoom.read_view`).

    Raises:
        ValueError: an unknown backend, or a refinement asked of the official one.
        Sam3BackendUnavailable: the official backend on a machine without CUDA or ``sam3``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown segmenter backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "official":
        if refinement is not None:
            raise ValueError("click refinement needs the transformers backend (it backpropagates through its decoder)")
        from monailabel_xflow.segmenter.official import OfficialSam3Segmenter

        return OfficialSam3Segmenter.load(name_or_path, device=device, cache=cache)
    model = load_tracker_model(name_or_path, config=config)
    segmenter = Sam3Segmenter(
        model,
        device=device,
        dtype=dtype,
        cache=cache,
        cache_tag=weights_tag(name_or_path),
        encode_precision=encode_precision,
        refinement=refinement,
    )
    # weights trained to segment in a window around the prompt say so in their folder
    return ZoomedSegmenter(segmenter) if read_view(name_or_path) == "zoom" else segmenter
