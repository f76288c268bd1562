"""The contract of F_seg (segment-anything style: set the image once, prompt many times).

* :meth:`PromptableSegmenter.set_image` takes an ``(H, W)`` float image in ``[0, 1]`` (or uint8),
  or an ``(H, W, 3)`` uint8/float RGB image, and computes -- or fetches from the shared
  :class:`~monailabel_xflow.segmenter.cache.EmbeddingCache` -- its embedding. Setting an image
  whose *content* was seen before encodes nothing.
* :meth:`PromptableSegmenter.predict` takes ``N`` normalised xyxy boxes (``geometry.Box``), an
  optional list of clicks per box and optionally the ``low_res_logits`` of an earlier call, and
  runs all ``N`` prompts through the mask decoder in **one** batched call. Masks come back at the
  original ``(H, W)``, row 0 at the top, as XFlow's Eq. 4.4 needs:
  ``M_t = F_seg(I, b_t, {(s_i, p_i)}_{i<=t}, M_{t-1})``.

Both backends (:mod:`.sam3`, :mod:`.official`) validate their inputs with the functions here, so
they refuse the same inputs with the same errors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Box, Click, GeometryError, check_click

POSITIVE_LABEL = 1


NEGATIVE_LABEL = 0


PAD_LABEL = -10
"""Point labels of Sam3TrackerModel: 1 positive, 0 negative, -10 padding (ignored)."""


class SegmenterInputError(InputError):
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

    def fork(self) -> PromptableSegmenter:
        """A segmenter sharing this one's model and embedding cache but with no current image,
        so another thread can ``set_image`` / ``predict`` without touching this one's state."""
        ...


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
    """A click as :class:`Click`, checked by :func:`~monailabel_xflow.geometry.check_click`.

    Raises:
        GeometryError: naming the click and its box.
    """
    return check_click(click, f"click of box {box_index}")


@dataclass(frozen=True)
class Prompts:
    """``N`` checked prompts as arrays, in normalised coordinates (x right, y down, ``[0, 1]``).

    Every backend and the F_seg trainer build their model inputs from this (:func:`build_prompts`),
    scaling to their own pixel grid; float64 so that scaling rounds as the model input's float32
    does once.

    Attributes:
        boxes: ``(N, 4)`` float64 xyxy.
        points: ``(N, K, 2)`` float64 xy, ``K`` the most clicks any box has (0: no clicks).
        labels: ``(N, K)`` int64, :data:`POSITIVE_LABEL` / :data:`NEGATIVE_LABEL`, :data:`PAD_LABEL`
            after a box's own clicks.
        previous: ``(N, 1, h, w)`` float32 finite low-res logits, or None.
    """

    boxes: np.ndarray
    points: np.ndarray
    labels: np.ndarray
    previous: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.boxes.shape[0])


def build_prompts(
    boxes: Sequence[Box],
    clicks: Sequence[Sequence[Click]] | None = None,
    previous: np.ndarray | None = None,
) -> Prompts:
    """Check the prompts of one :meth:`PromptableSegmenter.predict` call and lay them out.

    Args:
        boxes: ``N`` normalised xyxy boxes.
        clicks: None or one list of normalised clicks per box (possibly empty).
        previous: None or ``(N, 1, h, w)`` low-res logits of an earlier call (not checked when
            ``N == 0``: nothing is decoded).

    Raises:
        GeometryError: a box or click malformed, outside ``[0, 1]`` or unordered (names which).
        SegmenterInputError: clicks without boxes, a click list per box missing, ``previous``
            of another shape or not finite.
    """
    n = len(boxes)
    if n == 0 and clicks:
        raise SegmenterInputError("clicks given without boxes")
    checked_boxes = np.array([validate_box(b, i) for i, b in enumerate(boxes)], np.float64).reshape(n, 4)
    checked: list[list[Click]] = [[] for _ in range(n)]
    if clicks is not None:
        if len(clicks) != n:
            raise SegmenterInputError(f"clicks must hold one list per box: {n} boxes, {len(clicks)} click lists")
        checked = [[validate_click(c, i) for c in per_box] for i, per_box in enumerate(clicks)]
    k = max((len(c) for c in checked), default=0)
    points = np.zeros((n, k, 2), np.float64)
    labels = np.full((n, k), PAD_LABEL, np.int64)
    for i, per_box in enumerate(checked):
        for j, click in enumerate(per_box):
            points[i, j] = (click.x, click.y)
            labels[i, j] = POSITIVE_LABEL if click.positive else NEGATIVE_LABEL
    prev = None
    if previous is not None and n:
        prev = np.asarray(previous)
        if prev.ndim != 4 or prev.shape[0] != n or prev.shape[1] != 1:
            raise SegmenterInputError(f"previous must be (N={n}, 1, h, w) low-res logits, got shape {prev.shape}")
        if not np.isfinite(prev).all():
            raise SegmenterInputError("previous logits contain NaN or infinite values")
        prev = prev.astype(np.float32)
    return Prompts(checked_boxes, points, labels, prev)


def empty_result(shape: Sequence[int], low_res: Sequence[int] = (288, 288)) -> SegmentationResult:
    """The result of a call with no boxes: arrays with ``N = 0``."""
    h, w = int(shape[0]), int(shape[1])
    return SegmentationResult(
        logits=np.zeros((0, h, w), np.float32),
        masks=np.zeros((0, h, w), bool),
        iou=np.zeros((0,), np.float32),
        low_res_logits=np.zeros((0, 1, *low_res), np.float32),
    )
