"""The contract of F_seg (segment-anything style: set the image once, prompt many times).

* :meth:`PromptableSegmenter.set_image` takes an ``(H, W)`` float image in ``[0, 1]`` (or uint8),
  or an ``(H, W, 3)`` uint8/float RGB image, and computes -- or fetches from the shared
  :class:`~monailabel_xflow.segmenter.cache.EmbeddingCache` -- its embedding. Setting an image
  whose *content* was seen before encodes nothing, and the cache is asked before any copy is
  made; an image the workflow checked (``geometry.check_image``) is neither checked nor hashed
  again (:func:`check_model_image`, :func:`image_key`).
* :meth:`PromptableSegmenter.predict` takes ``N`` normalised xyxy boxes (``geometry.Box``), an
  optional list of clicks per box and optionally the ``low_res_logits`` of an earlier call, and
  runs all ``N`` prompts through the mask decoder in **one** batched call. Masks come back at the
  original ``(H, W)``, row 0 at the top, as XFlow's Eq. 4.4 needs:
  ``M_t = F_seg(I, b_t, {(s_i, p_i)}_{i<=t}, M_{t-1})``.

Both backends (:mod:`.sam3`, :mod:`.official`) validate their inputs with the functions here, so
they refuse the same inputs with the same errors.
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Box, Click, GeometryError, check_click, check_image, is_checked

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

    logits: NDArray[np.float32]
    masks: NDArray[np.bool_]
    iou: NDArray[np.float32]
    low_res_logits: NDArray[np.float32]

    def __len__(self) -> int:
        return int(self.masks.shape[0])


@runtime_checkable
class PromptableSegmenter(Protocol):
    """What the workflow, the oracle clicker and the trainers need from F_seg."""

    def set_image(self, image: NDArray[Any]) -> None:
        """Compute (or fetch from the cache) the embedding of ``image``; see the module docstring."""
        ...

    def predict(
        self,
        boxes: Sequence[Box],
        clicks: Sequence[Sequence[Click]] | None = None,
        previous: NDArray[Any] | None = None,
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


def check_model_image(image: Any) -> NDArray[np.float32]:
    """The segmenters' image border: the contract's layouts brought to the one image rule.

    Accepted: ``(H, W)`` or ``(H, W, 1)`` grey and ``(H, W, 3)`` RGB, either uint8 (read as
    ``x/255``) or float in ``[0, 1]``; everything else is :func:`~monailabel_xflow.geometry.check_image`'s
    rule. A checked image (the workflow's) passes at once.

    Returns:
        The checked image: ``(H, W)`` or ``(H, W, 3)`` float32 in ``[0, 1]``, read-only.

    Raises:
        SegmenterInputError: another shape or dtype, NaNs, float values outside ``[0, 1]``, or an
            image smaller than 2 x 2.
    """
    if is_checked(image):
        return image  # type: ignore[no-any-return]
    if not isinstance(image, np.ndarray):
        raise SegmenterInputError(f"image must be a numpy array, got {type(image).__name__}")
    if image.dtype == np.uint8:
        image = image.astype(np.float32) / np.float32(255.0)
    elif not np.issubdtype(image.dtype, np.floating):
        raise SegmenterInputError(f"image dtype must be uint8 or float in [0, 1], got {image.dtype}")
    try:
        return check_image(image, rgb=True)
    except GeometryError as err:
        raise SegmenterInputError(str(err)) from err


def to_rgb01(image: Any) -> NDArray[np.float32]:
    """An image the segmenters take (:func:`check_model_image`) as ``(H, W, 3)`` float32 in ``[0, 1]``.

    Raises:
        SegmenterInputError: see :func:`check_model_image`.
    """
    checked = check_model_image(image)
    return checked if checked.ndim == 3 else np.repeat(checked[..., None], 3, axis=2)


# id -> (weak reference, key) of the checked images hashed so far
_keys: dict[int, tuple[weakref.ref[NDArray[Any]], str]] = {}


def _forget(ident: int, _ref: object, registry: dict[int, Any] = _keys) -> None:
    registry.pop(ident, None)


def image_key(image: NDArray[Any]) -> str:
    """Content hash of an image array (dtype, shape and bytes): the embedding cache key.

    Two arrays with equal pixels, shape and dtype share a key whatever file they came from. A
    checked image (:func:`~monailabel_xflow.geometry.check_image`, whose pixels are taken as fixed)
    is hashed once; asking again for its key is a dictionary look-up.
    """
    remembered = _keys.get(id(image))
    if remembered is not None and remembered[0]() is image:
        return remembered[1]
    array = np.ascontiguousarray(image)
    digest = hashlib.sha256(f"{array.dtype.str}|{array.shape}|".encode())
    digest.update(array.data.cast("B"))
    key = digest.hexdigest()[:32]
    if is_checked(image):
        ident = id(image)
        _keys[ident] = (weakref.ref(image, functools.partial(_forget, ident)), key)
    return key


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

    boxes: NDArray[np.float64]
    points: NDArray[np.float64]
    labels: NDArray[np.int64]
    previous: NDArray[np.float32] | None = None

    def __len__(self) -> int:
        return int(self.boxes.shape[0])


def build_prompts(
    boxes: Sequence[Box],
    clicks: Sequence[Sequence[Click]] | None = None,
    previous: NDArray[Any] | None = None,
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
