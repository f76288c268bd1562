"""Optional F_seg backend on Meta's official ``sam3`` package (extra ``sam3``; CUDA only).

The official package hard-codes CUDA and needs torchvision, so it is imported only
when this backend is selected, and refused with :class:`Sam3BackendUnavailable` -- saying why --
on a machine without a CUDA device or without the package. The transformers backend
(:class:`~monailabel_xflow.segmenter.sam3.Sam3Segmenter`) is the default everywhere; this one exists
to cross-check it against the reference implementation on GPU machines and to run fine-tuned
``sam3.pt`` checkpoints exactly as their trainer did.

It follows the SAM1-task API of ``sam3`` (``build_sam3_image_model(enable_inst_interactivity=True)``,
``Sam3Processor.set_image`` then ``model.predict_inst``) behind the same
:class:`~monailabel_xflow.segmenter.base.PromptableSegmenter` contract: the same input images,
normalised boxes/clicks, ``(N, H, W)`` masks and ``(N, 1, 288, 288)`` low-res logits, and the
same embedding cache keyed by image content.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.errors import UnavailableError
from monailabel_xflow.geometry import Box, Click
from monailabel_xflow.segmenter.base import (
    PAD_LABEL,
    SegmentationResult,
    build_prompts,
    check_model_image,
    empty_result,
    image_key,
    to_rgb01,
)
from monailabel_xflow.segmenter.cache import EmbeddingCache, default_cache
from monailabel_xflow.weights import weights_tag

logger = logging.getLogger(__name__)

_NOT_A_POINT = -1  # the official prompt encoder's padding label


class Sam3BackendUnavailable(UnavailableError):
    """The official backend cannot run here (no CUDA device, or the ``sam3`` package missing)."""


def require_official_backend(device: Any = None) -> None:
    """Check that the official backend can run, before anything heavy is imported.

    Raises:
        Sam3BackendUnavailable: no CUDA device (the package hard-codes ``"cuda"``), a non-CUDA
            ``device`` was requested, or ``sam3`` is not installed.
    """
    import torch

    if device is not None and torch.device(device).type != "cuda":
        raise Sam3BackendUnavailable(
            f"the official sam3 backend runs on CUDA only (it hard-codes 'cuda'); device={device!r} was "
            "requested: use backend='transformers' on this device"
        )
    if not torch.cuda.is_available():
        raise Sam3BackendUnavailable(
            "the official sam3 backend needs CUDA (the sam3 package hard-codes 'cuda' and needs "
            "torchvision) and this machine has no CUDA device: use backend='transformers', which "
            "runs the same SAM3 tracker on CPU"
        )
    try:
        import sam3  # noqa: F401
    except ImportError as exc:
        raise Sam3BackendUnavailable(
            f"the official sam3 package is not installed ({exc}): pip install 'monailabel-xflow[sam3]'"
        ) from exc


class OfficialSam3Segmenter:
    """:class:`~monailabel_xflow.segmenter.base.PromptableSegmenter` on the official ``sam3`` model.

    Build it with :meth:`load`; the constructor takes an already built ``sam3`` image model with
    instance interactivity enabled.
    """

    def __init__(self, model: Any, cache: EmbeddingCache | None = None, cache_tag: str = "default") -> None:
        from sam3.model.sam3_image_processor import Sam3Processor

        self.model = model
        self.processor = Sam3Processor(model)
        self.cache = cache if cache is not None else default_cache()
        self.cache_tag = f"sam3-official:{cache_tag}"
        self._state: Any = None
        self._shape: tuple[int, int] | None = None

    @classmethod
    def load(
        cls, name_or_path: str | Path | None, device: Any = None, cache: EmbeddingCache | None = None
    ) -> OfficialSam3Segmenter:
        """Build the official model from ``sam3.pt`` (or the hub default when ``name_or_path`` is
        ``None`` or ``"facebook/sam3"``).

        Raises:
            Sam3BackendUnavailable: see :func:`require_official_backend`.
        """
        require_official_backend(device)
        from sam3.model_builder import build_sam3_image_model

        checkpoint = None if name_or_path in (None, "facebook/sam3") else str(name_or_path)
        if checkpoint is not None and not Path(checkpoint).is_file():
            raise FileNotFoundError(f"official SAM3 checkpoint not found: {checkpoint}")
        model = build_sam3_image_model(
            checkpoint_path=checkpoint, load_from_HF=checkpoint is None, enable_inst_interactivity=True, device="cuda"
        )
        return cls(model, cache=cache, cache_tag=weights_tag(checkpoint or "facebook/sam3"))

    def fork(self) -> OfficialSam3Segmenter:
        """See :meth:`~monailabel_xflow.segmenter.base.PromptableSegmenter.fork`."""
        twin = object.__new__(OfficialSam3Segmenter)
        twin.__dict__.update(self.__dict__)
        twin._state, twin._shape = None, None
        return twin

    def set_image(self, image: np.ndarray) -> None:
        """See :meth:`~monailabel_xflow.segmenter.base.PromptableSegmenter.set_image`."""
        from PIL import Image

        checked = check_model_image(image)
        key = f"{self.cache_tag}:{image_key(checked)}"

        def encode() -> Any:
            rgb = (to_rgb01(checked) * 255.0 + 0.5).astype(np.uint8)
            return self.processor.set_image(Image.fromarray(rgb))

        self._state = self.cache.get_or_compute(key, encode)
        self._shape = (int(checked.shape[0]), int(checked.shape[1]))

    def predict(
        self,
        boxes: Sequence[Box],
        clicks: Sequence[Sequence[Click]] | None = None,
        previous: np.ndarray | None = None,
        multimask: bool = False,
    ) -> SegmentationResult:
        """See :meth:`~monailabel_xflow.segmenter.base.PromptableSegmenter.predict` (same semantics)."""
        if self._state is None or self._shape is None:
            raise RuntimeError("call set_image(image) before predict()")
        prompts = build_prompts(boxes, clicks, previous)  # the checks of every backend
        n = len(prompts)
        if n == 0:
            return empty_result(self._shape)
        h, w = self._shape
        # the official predictor takes original-image pixels (normalize_coords=True rescales them)
        kwargs: dict[str, Any] = {
            "box": (prompts.boxes * np.array([w, h, w, h])).astype(np.float32),
            "multimask_output": multimask,
            "normalize_coords": True,
        }
        if prompts.labels.shape[1]:
            labels = np.where(prompts.labels == PAD_LABEL, _NOT_A_POINT, prompts.labels).astype(np.int32)
            kwargs.update(point_coords=(prompts.points * np.array([w, h])).astype(np.float32), point_labels=labels)
        if prompts.previous is not None:
            kwargs["mask_input"] = prompts.previous
        logits, iou, low_res = self.model.predict_inst(self._state, return_logits=True, **kwargs)
        # The official predictor squeezes a batch of one: restore (N, M, ...) before choosing.
        logits, iou, low_res = (np.asarray(a, np.float32) for a in (logits, iou, low_res))
        if n == 1 and iou.ndim == 1:
            logits, iou, low_res = logits[None], iou[None], low_res[None]
        best = iou.argmax(axis=1)
        rows = np.arange(n)
        chosen = logits[rows, best]
        return SegmentationResult(
            logits=chosen,
            masks=chosen > 0,
            iou=iou[rows, best].astype(np.float32),
            low_res_logits=low_res[rows, best][:, None],
        )
