"""F_seg: the promptable SAM3 segmenter shared by both policies (DESIGN §5, XFlow §4.1).

Contract (segment-anything style: set the image once, prompt many times):

* :meth:`PromptableSegmenter.set_image` takes an ``(H, W)`` float image in ``[0, 1]`` (or uint8),
  or an ``(H, W, 3)`` uint8/float RGB image, and computes -- or fetches from the shared
  :class:`~monailabel_xflow.embedding_cache.EmbeddingCache` -- its embedding. Setting an image
  whose *content* was seen before encodes nothing.
* :meth:`PromptableSegmenter.predict` takes ``N`` normalised xyxy boxes (``geometry.Box``), an
  optional list of clicks per box and optionally the ``low_res_logits`` of an earlier call, and
  runs all ``N`` prompts through the mask decoder in **one** batched call. Masks come back at the
  original ``(H, W)``, row 0 at the top, as XFlow's Eq. 4.4 needs:
  ``M_t = F_seg(I, b_t, {(s_i, p_i)}_{i<=t}, M_{t-1})``.

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

import hashlib
import logging
import os
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Sequence, runtime_checkable

import numpy as np

from .embedding_cache import EmbeddingCache, default_cache
from .geometry import Box, Click, GeometryError, box_to_sam, point_to_sam

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

POSITIVE_LABEL = 1
NEGATIVE_LABEL = 0
PAD_LABEL = -10
"""Point labels of Sam3TrackerModel: 1 positive, 0 negative, -10 padding (ignored)."""

BACKENDS = ("transformers", "official")


class SegmenterInputError(ValueError):
    """An image, prompt or previous-logits array the segmenter cannot use (says which and why)."""


@dataclass
class SegmentationResult:
    """Masks for ``N`` prompts of one image.

    Attributes:
        logits: ``(N, H, W)`` float32 mask logits at the original image size.
        masks: ``(N, H, W)`` bool, ``logits > 0``.
        iou: ``(N,)`` float32, the model's IoU estimate of each returned mask.
        low_res_logits: ``(N, 1, h, w)`` float32 (288 x 288 for SAM3), the decoder's own
            logits, to pass back as ``previous`` with the next clicks on the same boxes.
    """

    logits: np.ndarray
    masks: np.ndarray
    iou: np.ndarray
    low_res_logits: np.ndarray

    def __len__(self) -> int:
        return int(self.masks.shape[0])


@runtime_checkable
class PromptableSegmenter(Protocol):
    """What the workflow, the oracle clicker and the trainers need from F_seg."""

    def set_image(self, image: np.ndarray) -> None:
        """Compute (or fetch from the cache) the embedding of ``image``; see the module docstring."""
        ...

    def predict(
        self,
        boxes: Sequence[Box],
        clicks: Sequence[Sequence[Click]] | None = None,
        previous: np.ndarray | None = None,
        multimask: bool = False,
    ) -> SegmentationResult:
        """Masks for ``N`` boxes of the current image, in one batched decoder call.

        Args:
            boxes: ``N`` normalised xyxy boxes.
            clicks: ``None`` or one list per box (possibly empty) of normalised clicks.
            previous: ``None`` or the ``(N, 1, h, w)`` ``low_res_logits`` of an earlier call.
            multimask: ask for three hypotheses per box and return the one with the highest
                predicted IoU (otherwise the single-mask output, with SAM's stability fallback).
        """
        ...


# --- helpers shared by the backends -------------------------------------------------------------


def image_key(image: np.ndarray) -> str:
    """Content hash of an image array (dtype, shape and bytes): the embedding cache key.

    Two arrays with equal pixels, shape and dtype share a key whatever file they came from.
    """
    array = np.ascontiguousarray(image)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{array.dtype.str}|{array.shape}|".encode())
    digest.update(memoryview(array).cast("B"))
    return digest.hexdigest()


def to_rgb01(image: np.ndarray) -> np.ndarray:
    """Validate an image and return it as ``(H, W, 3)`` float32 in ``[0, 1]``.

    Accepted: ``(H, W)`` or ``(H, W, 1)`` grey and ``(H, W, 3)`` RGB, either uint8 (``x/255``) or
    float in ``[0, 1]``.

    Raises:
        SegmenterInputError: another shape or dtype, NaNs, float values outside ``[0, 1]``, or an
            image smaller than 2 x 2.
    """
    if not isinstance(image, np.ndarray):
        raise SegmenterInputError(f"image must be a numpy array, got {type(image).__name__}")
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[..., 0]
    if not (image.ndim == 2 or (image.ndim == 3 and image.shape[2] == 3)):
        raise SegmenterInputError(
            f"image must be (H, W) grey or (H, W, 3) RGB, got shape {image.shape} "
            "(drop an alpha channel or convert to grey first)"
        )
    if image.shape[0] < 2 or image.shape[1] < 2:
        raise SegmenterInputError(f"image of shape {image.shape} is too small")
    if image.dtype == np.uint8:
        rgb = image.astype(np.float32) / 255.0
    elif np.issubdtype(image.dtype, np.floating):
        rgb = image.astype(np.float32, copy=False)
        if not np.isfinite(rgb).all():
            raise SegmenterInputError("image contains NaN or infinite values")
        lo, hi = float(rgb.min()), float(rgb.max())
        if lo < -1e-6 or hi > 1 + 1e-6:
            raise SegmenterInputError(f"float image must lie in [0, 1], got [{lo:.4g}, {hi:.4g}]")
        rgb = np.clip(rgb, 0.0, 1.0)
    else:
        raise SegmenterInputError(f"image dtype must be uint8 or float in [0, 1], got {image.dtype}")
    if rgb.ndim == 2:
        rgb = np.repeat(rgb[..., None], 3, axis=2)
    return rgb


def validate_box(box: Sequence[float], index: int = 0) -> list[float]:
    """A box as 4 floats, checked: finite, within ``[0, 1]``, ordered.

    Raises:
        GeometryError: naming the box by its ``index`` and saying what is wrong.
    """
    values = [float(v) for v in box] if len(box) == 4 else None
    if values is None:
        raise GeometryError(f"box {index} must have 4 values (x1, y1, x2, y2), got {list(box)}")
    if not all(np.isfinite(values)) or not all(0.0 <= v <= 1.0 for v in values):
        raise GeometryError(f"box {index} {values} must be finite and normalised to [0, 1]")
    if values[0] > values[2] or values[1] > values[3]:
        raise GeometryError(f"box {index} {values} is not ordered (x1 <= x2, y1 <= y2)")
    return values


def validate_click(click: Click, box_index: int = 0) -> Click:
    """A click as :class:`Click`, checked: ``(positive, x, y)`` with finite normalised ``x, y``.

    Raises:
        GeometryError: naming the click and its box.
    """
    try:
        positive, x, y = click
    except (TypeError, ValueError):
        raise GeometryError(f"click {click!r} of box {box_index} is not (positive, x, y)") from None
    x, y = float(x), float(y)
    if not (np.isfinite(x) and np.isfinite(y) and 0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
        raise GeometryError(f"click ({x}, {y}) of box {box_index} must be finite and normalised to [0, 1]")
    return Click(bool(positive), x, y)


def choose_device(device: "str | torch.device | None" = None) -> "torch.device":
    """The requested device, or CUDA when available, else the CPU."""
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def choose_dtype(device: "torch.device", dtype: "torch.dtype | str | None" = None) -> "torch.dtype":
    """The requested dtype (a ``torch.dtype`` or its name, e.g. ``"bfloat16"``), or bfloat16 on a
    CUDA device that supports it, else float32.

    Raises:
        ValueError: a name that is not a floating torch dtype.
    """
    import torch

    if isinstance(dtype, str):
        named = getattr(torch, dtype, None)
        if not isinstance(named, torch.dtype) or not named.is_floating_point:
            raise ValueError(f"dtype {dtype!r} is not a floating torch dtype (float32, bfloat16, float16)")
        return named
    if dtype is not None:
        return dtype
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def empty_result(shape: Sequence[int], low_res: Sequence[int] = (288, 288)) -> SegmentationResult:
    """The result of a call with no boxes: arrays with ``N = 0``."""
    h, w = int(shape[0]), int(shape[1])
    return SegmentationResult(
        logits=np.zeros((0, h, w), np.float32),
        masks=np.zeros((0, h, w), bool),
        iou=np.zeros((0,), np.float32),
        low_res_logits=np.zeros((0, 1, *low_res), np.float32),
    )


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
    """

    def __init__(
        self,
        model: Any,
        device: "str | torch.device | None" = None,
        dtype: "torch.dtype | None" = None,
        cache: EmbeddingCache | None = None,
        cache_tag: str | None = None,
    ) -> None:
        self.device = choose_device(device)
        self.dtype = choose_dtype(self.device, dtype)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.cache = cache if cache is not None else default_cache()
        if cache_tag is None:
            cache_tag = _model_tags.setdefault(model, uuid.uuid4().hex)
        self.cache_tag = f"sam3:{cache_tag}:{self.device}:{self.dtype}"
        prompt = self.model.config.prompt_encoder_config
        self.input_size = int(prompt.image_size)
        if self.input_size % prompt.patch_size:
            raise ValueError(f"SAM3 tracker input {self.input_size} px is not a multiple of its "
                             f"{prompt.patch_size}-px patches")
        side = 4 * prompt.image_size // prompt.patch_size
        self.low_res_size = (side, side)
        self._embeddings: list[torch.Tensor] | None = None
        self._shape: tuple[int, int] | None = None

    def fork(self) -> "Sam3Segmenter":
        """A new predictor sharing this one's model, device, dtype and cache (for another thread)."""
        twin = object.__new__(Sam3Segmenter)
        twin.__dict__.update(self.__dict__)
        twin._embeddings, twin._shape = None, None
        return twin

    # --- image --------------------------------------------------------------------------------

    def preprocess(self, image: np.ndarray) -> "torch.Tensor":
        """``(1, 3, S, S)`` model input of an image (``S = input_size``, see the module docstring)."""
        return self._model_input(to_rgb01(image))

    def _model_input(self, rgb01: np.ndarray) -> "torch.Tensor":
        import torch
        import torch.nn.functional as F

        rgb = torch.from_numpy(rgb01).permute(2, 0, 1)[None]  # (1, 3, H, W) in [0, 1]
        resized = F.interpolate(rgb, size=(self.input_size, self.input_size), mode="bilinear", align_corners=False, antialias=True)
        return ((resized - 0.5) / 0.5).to(device=self.device, dtype=self.dtype)

    def set_image(self, image: np.ndarray) -> None:
        """Make ``image`` current, encoding it unless the cache already holds its embedding.

        Raises:
            SegmenterInputError: see :func:`to_rgb01`.
        """
        import torch

        rgb01 = to_rgb01(image)  # validate first: bad input fails before anything is cached
        key = f"{self.cache_tag}:{image_key(image)}"

        def encode() -> list[torch.Tensor]:
            # the one slow step (~100 s for the full model on a 2-core CPU): say so
            logger.info("SAM3: encoding a %dx%d image on %s ...", image.shape[1], image.shape[0], self.device)
            start = time.perf_counter()
            with torch.no_grad():
                embeddings = list(self.model.get_image_embeddings(self._model_input(rgb01)))
            logger.info("SAM3: image encoded in %.1f s", time.perf_counter() - start)
            return embeddings

        self._embeddings = self.cache.get_or_compute(key, encode)
        self._shape = (int(image.shape[0]), int(image.shape[1]))

    # --- prompts ------------------------------------------------------------------------------

    def _prompt_tensors(
        self, boxes: Sequence[Box], clicks: Sequence[Sequence[Click]] | None, previous: np.ndarray | None
    ) -> dict[str, Any]:
        """Model keyword arguments for ``N`` prompts laid out as a batch of ``N`` single prompts.

        Each box is its own batch element with one prompt (``(N, 1, ...)``), so a box never
        attends to another box's tokens and a batched call equals ``N`` single calls.
        """
        import torch

        n = len(boxes)
        sam_boxes = [box_to_sam(validate_box(b, i), self.input_size) for i, b in enumerate(boxes)]
        kwargs: dict[str, Any] = {"input_boxes": torch.tensor(sam_boxes, dtype=torch.float32, device=self.device)[:, None, :]}
        if clicks is not None:
            if len(clicks) != n:
                raise SegmenterInputError(f"clicks must hold one list per box: {n} boxes, {len(clicks)} click lists")
            checked = [[validate_click(c, i) for c in per_box] for i, per_box in enumerate(clicks)]
            k = max((len(c) for c in checked), default=0)
            if k > 0:
                points = torch.zeros((n, 1, k, 2), dtype=torch.float32)
                labels = torch.full((n, 1, k), PAD_LABEL, dtype=torch.int64)
                for i, per_box in enumerate(checked):
                    for j, click in enumerate(per_box):
                        points[i, 0, j] = torch.tensor(point_to_sam(click.x, click.y, self.input_size))
                        labels[i, 0, j] = POSITIVE_LABEL if click.positive else NEGATIVE_LABEL
                kwargs["input_points"] = points.to(self.device)
                kwargs["input_labels"] = labels.to(self.device)
        if previous is not None:
            prev = np.asarray(previous)
            if prev.ndim != 4 or prev.shape[0] != n or prev.shape[1] != 1:
                raise SegmenterInputError(f"previous must be (N={n}, 1, h, w) low-res logits, got shape {prev.shape}")
            if not np.isfinite(prev).all():
                raise SegmenterInputError("previous logits contain NaN or infinite values")
            kwargs["input_masks"] = torch.from_numpy(prev.astype(np.float32)).to(device=self.device, dtype=self.dtype)
        return kwargs

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
        if len(boxes) == 0:
            if clicks:
                raise SegmenterInputError("clicks given without boxes")
            return empty_result(self._shape, self.low_res_size)
        kwargs = self._prompt_tensors(boxes, clicks, previous)
        n = len(boxes)
        embeddings = [e.expand(n, *e.shape[1:]) for e in self._embeddings]
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


# model -> tag, so re-wrapping one model object keeps its cached embeddings (weak: no leak)
_model_tags: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


# --- loading ------------------------------------------------------------------------------------

_CHECKPOINT_SUFFIXES = (".pt", ".pth")


def _looks_like_local_path(name: str) -> bool:
    """True for names that cannot be a hub id (``owner/name``): absolute, relative, or a file."""
    return os.path.isabs(name) or name.startswith((".", "~")) or name.endswith(_CHECKPOINT_SUFFIXES) or name.count("/") > 1


def weights_tag(name_or_path: str | Path) -> str:
    """Cache tag of some weights: the resolved path plus the weights file's size and mtime (so
    embeddings of weights a trainer overwrote are not reused), or the hub id."""
    path = Path(os.path.expanduser(str(name_or_path)))
    if not path.exists():
        return str(name_or_path)
    weights = path
    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        weights = files[0] if files else path
    stat = weights.stat()
    return f"{path.resolve()}@{stat.st_size}:{stat.st_mtime_ns}"


def _tracker_config_beside(checkpoint: Path):
    """A ``sam3_tracker`` ``config.json`` in the checkpoint's folder, else the full SAM3 config."""
    import json

    from .sam3_configs import sam3_tracker_config

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

    from .sam3_checkpoint import load_official_checkpoint

    path = Path(os.path.expanduser(str(name_or_path)))
    if path.is_file():
        if path.suffix not in _CHECKPOINT_SUFFIXES:
            raise SegmenterInputError(f"{path}: expected a folder saved by save_pretrained or a .pt/.pth checkpoint")
        model = Sam3TrackerModel(config if config is not None else _tracker_config_beside(path))
        report = load_official_checkpoint(model, path, strict=True)
        logger.info("loaded %s: %s", path, report.summary())
        return model.eval()
    if path.is_dir():
        return Sam3TrackerModel.from_pretrained(path).eval()
    name = str(name_or_path)
    if _looks_like_local_path(name):
        raise FileNotFoundError(f"SAM3 weights not found: {name}")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() not in ("", "0", "false", "no")
    return Sam3TrackerModel.from_pretrained(name, local_files_only=offline).eval()


def load_segmenter(
    name_or_path: str | Path,
    backend: str = "transformers",
    device: "str | torch.device | None" = None,
    *,
    dtype: "torch.dtype | None" = None,
    cache: EmbeddingCache | None = None,
    config: Any = None,
) -> PromptableSegmenter:
    """Build F_seg from weights (see :func:`load_tracker_model` for what ``name_or_path`` may be).

    Args:
        name_or_path: local HF folder, hub id, or official ``.pt`` checkpoint.
        backend: ``"transformers"`` (any device) or ``"official"`` (the ``sam3`` package; CUDA only,
            needs the ``sam3`` extra).
        device: defaults to CUDA when available, else CPU.
        dtype, cache, config: passed to :class:`Sam3Segmenter` / :func:`load_tracker_model`.

    Raises:
        ValueError: an unknown backend.
        Sam3BackendUnavailable: the official backend on a machine without CUDA or ``sam3``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown segmenter backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "official":
        from .sam3_official import OfficialSam3Segmenter

        return OfficialSam3Segmenter.load(name_or_path, device=device, cache=cache)
    model = load_tracker_model(name_or_path, config=config)
    return Sam3Segmenter(model, device=device, dtype=dtype, cache=cache, cache_tag=weights_tag(name_or_path))
