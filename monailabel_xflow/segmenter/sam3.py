"""F_seg: the promptable SAM3 segmenter shared by both policies (XFlow §4.1).

It implements the contract of :mod:`.base` (set the image once, prompt many times; masks at
the original ``(H, W)``, as XFlow's Eq. 4.4 needs).

Model input (hand-written, no AutoProcessor and no torchvision): grey -> 3 channels, bilinear
antialiased resize to the model's square input, ``S = prompt_encoder_config.image_size`` (1008
for SAM3; reduced models such as the demo's may use less), aspect ratio *not* kept, as in SAM3;
``x/255`` then ``(x - 0.5) / 0.5``; prompts scaled to the ``S`` grid by
``geometry.box_to_sam``/``point_to_sam`` (x by S/W, y by S/H). Logits of ``pred_masks``
(``4S/14`` square: 288 x 288 for SAM3) are upsampled bilinearly to ``(H, W)`` and thresholded at 0.

A :class:`Sam3Segmenter` holds the current image, so one instance serves one caller at a time
(like ``SamPredictor``); threads share the model and the cache through :meth:`Sam3Segmenter.fork`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from monailabel_xflow.geometry import Box, Click, box_to_sam, point_to_sam
from monailabel_xflow.segmenter.base import (
    PAD_LABEL,
    POSITIVE_LABEL,
    Prompts,
    SegmentationResult,
    SegmenterInputError,
    build_prompts,
    check_model_image,
    empty_result,
    image_key,
)
from monailabel_xflow.segmenter.cache import EmbeddingCache, default_cache
from monailabel_xflow.segmenter.refine import ClickRefinement, refine_decoder
from monailabel_xflow.segmenter.store import ResultStore, default_store, digest, pack, unpack
from monailabel_xflow.weights import (
    CHECKPOINT_SUFFIXES,
    check_encode_precision,
    choose_device,
    choose_dtype,
    looks_like_local_path,
    weights_fingerprint,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


# --- the transformers backend -------------------------------------------------------------------


class Sam3Segmenter:
    """:class:`PromptableSegmenter` on ``transformers.Sam3TrackerModel``.

    Args:
        model: a ``Sam3TrackerModel`` (moved to ``device``/``dtype`` and set to eval mode).
        device: defaults to CUDA when available, else CPU.
        dtype: defaults to bfloat16 on CUDA, float32 on CPU.
        cache: embedding cache; defaults to the process-wide :func:`default_cache`.
        cache_tag: identifies the weights in cache keys, so two models never share an entry.
            Defaults to a fresh id per model object (``load_segmenter`` passes the checkpoint
            name, so segmenters loaded twice from the same weights share embeddings).
        encode_precision: the image encoder's arithmetic (``weights.ENCODE_PRECISIONS``;
            ``bfloat16`` runs it under autocast, about 2x faster on a CPU with bfloat16 units);
            default ``float32``. The decoder always runs in ``dtype``.
        store: the persistent store (:mod:`.store`) asked after the in-memory cache and before
            encoding, under the weights' :attr:`fingerprint`; defaults to the process's
            (:func:`~.store.default_store`, None outside the app).
        persist: False never reads nor writes a store (a trainer whose weights change).
        refinement: make each mask agree with its clicks by backpropagation
            (:mod:`.refine`); None (default) answers with the model alone.

    Raises:
        ValueError: an unknown ``encode_precision``.
    """

    def __init__(
        self,
        model: Any,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        cache: EmbeddingCache | None = None,
        cache_tag: str | None = None,
        encode_precision: str | None = "float32",
        store: ResultStore | None = None,
        persist: bool = True,
        refinement: ClickRefinement | None = None,
    ) -> None:
        self.device = choose_device(device)
        self.dtype = choose_dtype(self.device, dtype)
        self.encode_precision = check_encode_precision(encode_precision)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.cache = cache if cache is not None else default_cache()
        self.store = store
        self.persist = bool(persist)
        self.refinement = refinement
        if cache_tag is None:
            cache_tag = _model_tags.setdefault(model, uuid.uuid4().hex)
        self.cache_tag = f"sam3:{cache_tag}:{self.device}:{self.dtype}:{self.encode_precision}"
        prompt = self.model.config.prompt_encoder_config
        self.input_size = int(prompt.image_size)
        if self.input_size % prompt.patch_size:
            raise ValueError(
                f"SAM3 tracker input {self.input_size} px is not a multiple of its {prompt.patch_size}-px patches"
            )
        side = 4 * prompt.image_size // prompt.patch_size
        self.low_res_size = (side, side)
        self._embeddings: list[torch.Tensor] | None = None
        self._shape: tuple[int, int] | None = None

    @property
    def fingerprint(self) -> str:
        """The loaded weights' fingerprint (:func:`~monailabel_xflow.weights.weights_fingerprint`):
        the store's namespace for this segmenter."""
        return weights_fingerprint(self.model)

    @property
    def encode_options(self) -> dict[str, Any]:
        """What besides the weights and the image changes an embedding (part of every stored key)."""
        return {"device": self.device.type, "dtype": str(self.dtype), "precision": self.encode_precision}

    def fork(self) -> Sam3Segmenter:
        """A new predictor sharing this one's model, device, dtype and cache (for another thread)."""
        twin = object.__new__(Sam3Segmenter)
        twin.__dict__.update(self.__dict__)
        twin._embeddings, twin._shape = None, None
        return twin

    # --- image --------------------------------------------------------------------------------

    def preprocess(self, image: np.ndarray) -> torch.Tensor:
        """``(1, 3, S, S)`` model input of an image (``S = input_size``, see the module docstring)."""
        return self._model_input(check_model_image(image))

    def _model_input(self, checked: np.ndarray) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        pixels = torch.from_numpy(np.array(checked))  # writeable copy for torch, (H, W) or (H, W, 3)
        pixels = pixels[None, None] if pixels.ndim == 2 else pixels.permute(2, 0, 1)[None]
        resized = F.interpolate(
            pixels, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False, antialias=True
        )
        # grey -> 3 channels after the resize: channels are resized independently, so it is the same
        resized = resized.expand(1, 3, self.input_size, self.input_size)
        return ((resized - 0.5) / 0.5).to(device=self.device, dtype=self.dtype)

    def set_image(self, image: np.ndarray) -> None:
        """Make ``image`` current, encoding it unless the cache already holds its embedding.

        The cache is asked first; nothing is copied for an image it holds.

        Raises:
            SegmenterInputError: see :func:`~.base.check_model_image`.
        """

        checked = check_model_image(image)  # validate first: bad input fails before anything is cached
        key = f"{self.cache_tag}:{image_key(checked)}"

        def encode() -> list[torch.Tensor]:
            store = (self.store if self.store is not None else default_store()) if self.persist else None
            names = (self.fingerprint, "emb", digest(image_key(checked), self.encode_options)) if store else None
            if store is not None and names is not None:
                payload = store.get(*names)
                if payload is not None:
                    try:
                        return self._embeddings_from(payload)
                    except ValueError as exc:  # a payload of another layout: recompute
                        logger.warning("SAM3: stored embedding unusable (%s); encoding again", exc)
            # the one slow step (the full model's image encoder): say so
            logger.info("SAM3: encoding a %dx%d image on %s ...", checked.shape[1], checked.shape[0], self.device)
            start = time.perf_counter()
            embeddings = self.encode(self._model_input(checked))
            logger.info("SAM3: image encoded in %.1f s", time.perf_counter() - start)
            if store is not None and names is not None:
                arrays = {f"level{i}": e.detach().float().cpu().numpy() for i, e in enumerate(embeddings)}
                store.put(*names, pack(arrays, {"levels": len(embeddings)}))
            return embeddings

        self._embeddings = self.cache.get_or_compute(key, encode)
        self._shape = (int(checked.shape[0]), int(checked.shape[1]))

    def encode(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        """The image encoder on a ``(1, 3, S, S)`` model input, in :attr:`encode_precision`;
        embeddings come back in the model's ``dtype``."""
        import torch

        autocast = (
            torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
            if self.encode_precision == "bfloat16" and self.dtype != torch.bfloat16
            else contextlib.nullcontext()
        )
        with torch.no_grad(), autocast:
            embeddings = list(self.model.get_image_embeddings(pixels))
        return [e.to(self.dtype) for e in embeddings]

    def _embeddings_from(self, payload: bytes) -> list[torch.Tensor]:
        import torch

        arrays, meta = unpack(payload)
        levels = int(meta.get("levels", -1))
        if levels < 1 or any(f"level{i}" not in arrays for i in range(levels)):
            raise ValueError("missing embedding levels")
        return [
            torch.from_numpy(np.ascontiguousarray(arrays[f"level{i}"])).to(device=self.device, dtype=self.dtype)
            for i in range(levels)
        ]

    # --- prompts ------------------------------------------------------------------------------

    def predict(
        self,
        boxes: Sequence[Box],
        clicks: Sequence[Sequence[Click]] | None = None,
        previous: np.ndarray | None = None,
        multimask: bool = False,
    ) -> SegmentationResult:
        """See :meth:`PromptableSegmenter.predict`.

        With ``multimask`` the decoder returns three hypotheses per box and the one with the
        highest predicted IoU is kept (SAM's own choice for ambiguous single clicks); without it
        the single-mask token is used, falling back to that best hypothesis when its stability
        score is low (transformers' ``dynamic_multimask_via_stability``, as in SAM2/SAM3).

        With a :class:`~.refine.ClickRefinement` (and without ``multimask``), prompts with clicks
        are decoded with the image-embedding correction that makes their masks agree with the
        clicks (:func:`~.refine.refine_decoder`); prompts without clicks are answered as before.

        Boxes with fewer clicks than others are padded with label -10, which the prompt encoder
        embeds as zeros. Zero tokens still take part in the decoder's attention, so a box padded
        in a batch can differ slightly from the same box alone; boxes with equal click counts
        give identical results batched or one at a time.

        Raises:
            RuntimeError: :meth:`set_image` was not called.
            GeometryError: a box or click outside ``[0, 1]``, unordered, or malformed.
            SegmenterInputError: ``clicks``/``previous`` that do not match the boxes.
        """
        import torch
        import torch.nn.functional as F

        if self._embeddings is None or self._shape is None:
            raise RuntimeError("call set_image(image) before predict()")
        prompts = build_prompts(boxes, clicks, previous)
        n = len(prompts)
        if n == 0:
            return empty_result(self._shape, self.low_res_size)
        kwargs = sam3_prompt_kwargs(prompts, self.input_size, self.device, self.dtype)
        embeddings = [e.expand(n, *e.shape[1:]) for e in self._embeddings]
        if self.refinement is not None and not multimask and prompts.labels.shape[1]:

            def decode(levels: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
                out = self.model(image_embeddings=levels, multimask_output=False, **kwargs)
                return out.pred_masks[:, 0, 0].float(), out.iou_scores[:, 0, 0].float()

            per_box = [
                [Click(bool(lab == POSITIVE_LABEL), float(x), float(y)) for (x, y), lab in pairs if lab != PAD_LABEL]
                for pairs in (
                    zip(row, labs, strict=True) for row, labs in zip(prompts.points, prompts.labels, strict=True)
                )
            ]
            refined, refined_iou = refine_decoder(decode, embeddings, per_box, self.refinement, self.low_res_size[0])
            low_res, iou = refined[:, None], refined_iou[:, None]  # (N, 1, 288, 288), (N, 1)
        else:
            with torch.no_grad():
                out = self.model(image_embeddings=embeddings, multimask_output=multimask, **kwargs)
            low_res = out.pred_masks[:, 0].float()  # (N, M, 288, 288)
            iou = out.iou_scores[:, 0].float()  # (N, M)
        best = iou.argmax(dim=1)  # M == 1 without multimask
        rows = torch.arange(n, device=low_res.device)
        low_res = low_res[rows, best][:, None]  # (N, 1, 288, 288)
        iou = iou[rows, best]
        logits = F.interpolate(low_res, size=self._shape, mode="bilinear", align_corners=False)[:, 0]
        logits_np = logits.cpu().numpy().astype(np.float32, copy=False)
        return SegmentationResult(
            logits=logits_np,
            masks=logits_np > 0,
            iou=iou.cpu().numpy().astype(np.float32, copy=False),
            low_res_logits=low_res.cpu().numpy().astype(np.float32, copy=False),
        )


def sam3_prompt_kwargs(
    prompts: Prompts, input_size: int, device: str | torch.device, mask_dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """``Sam3TrackerModel`` keyword arguments of ``N`` prompts (inference and F_seg training alike).

    Each box is its own batch element with one prompt (``(N, 1, ...)``), so a box never attends
    to another box's tokens and a batched call equals ``N`` single calls. Coordinates are scaled
    to the ``input_size`` square (:func:`~monailabel_xflow.geometry.box_to_sam`).

    Returns:
        ``input_boxes`` ``(N, 1, 4)`` float32; with clicks ``input_points`` ``(N, 1, K, 2)``
        float32 and ``input_labels`` ``(N, 1, K)`` int64; with ``prompts.previous``
        ``input_masks`` ``(N, 1, h, w)`` in ``mask_dtype``.
    """
    import torch

    kwargs = {
        "input_boxes": torch.tensor(
            [box_to_sam(b, input_size) for b in prompts.boxes], dtype=torch.float32, device=device
        ).reshape(len(prompts), 1, 4)
    }
    if prompts.labels.shape[1]:
        points = [[point_to_sam(x, y, input_size) for x, y in row] for row in prompts.points]
        kwargs["input_points"] = torch.tensor(points, dtype=torch.float32, device=device)[:, None]
        kwargs["input_labels"] = torch.from_numpy(prompts.labels).to(device)[:, None]
    if prompts.previous is not None:
        kwargs["input_masks"] = torch.from_numpy(prompts.previous).to(device=device, dtype=mask_dtype)
    return kwargs


# model -> tag, so re-wrapping one model object keeps its cached embeddings (weak: no leak)
_model_tags: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


# --- loading ------------------------------------------------------------------------------------


def _tracker_config_beside(checkpoint: Path):
    """A ``sam3_tracker`` ``config.json`` in the checkpoint's folder, else the full SAM3 config."""
    import json

    from monailabel_xflow.segmenter.configs import sam3_tracker_config

    config_file = checkpoint.parent / "config.json"
    if config_file.is_file():
        try:
            model_type = json.loads(config_file.read_text()).get("model_type")
        except (OSError, ValueError):
            model_type = None
        if model_type == "sam3_tracker":
            from transformers import Sam3TrackerConfig

            return Sam3TrackerConfig.from_pretrained(checkpoint.parent)
    return sam3_tracker_config("full")


def load_tracker_model(name_or_path: str | Path, config: Any = None) -> Any:
    """A ``Sam3TrackerModel`` from a local HF folder, a hub id or an official ``.pt`` checkpoint.

    Args:
        name_or_path: folder written by ``save_pretrained``; ``owner/name`` on the Hugging Face hub
            (downloaded only here, when asked; with ``HF_HUB_OFFLINE`` set, only the local hub cache
            is read); or ``sam3.pt``-style file (mapped by :mod:`.sam3_checkpoint`).
        config: for a ``.pt`` file, the ``Sam3TrackerConfig`` to build; defaults to a
            ``sam3_tracker`` ``config.json`` beside the file, else the full SAM3 tracker.

    Raises:
        FileNotFoundError: a local path that does not exist.
        Sam3CheckpointError: a ``.pt`` file that does not fill the model.
    """
    from transformers import Sam3TrackerModel

    from monailabel_xflow.segmenter.checkpoint import load_official_checkpoint

    path = Path(os.path.expanduser(str(name_or_path)))
    if path.is_file():
        if path.suffix not in CHECKPOINT_SUFFIXES:
            raise SegmenterInputError(f"{path}: expected a folder saved by save_pretrained or a .pt/.pth checkpoint")
        model = Sam3TrackerModel(config if config is not None else _tracker_config_beside(path))
        report = load_official_checkpoint(model, path, strict=True)
        logger.info("loaded %s: %s", path, report.summary())
        return model.eval()
    if path.is_dir():
        return Sam3TrackerModel.from_pretrained(path).eval()
    name = str(name_or_path)
    if looks_like_local_path(name):
        raise FileNotFoundError(f"SAM3 weights not found: {name}")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no")
    return Sam3TrackerModel.from_pretrained(name, local_files_only=offline).eval()
