"""Zoom-in F_seg: segment inside a window around the prompt, at the model's full input size.

Interactive models segment small objects better when they look closer: RITM's *zoom-in*
(Sofiiuk et al. 2022) and FocalClick's *target crop* (Chen et al. 2022) crop the image around
the object being segmented and run the network on the crop resized to its input size. The demo
F_seg sees a 256-px phantom through 24 x 24 image tokens, so a phantom's small lesion spans a
handful of tokens and a click that should move its edge has nothing to move; in a window twice
the box's side the same lesion spans half the token grid.

:class:`ZoomedSegmenter` wraps any :class:`~monailabel_xflow.segmenter.base.PromptableSegmenter`
and keeps its contract: boxes, clicks and masks stay in the whole image's coordinates. As RITM's
zoom-in does, each call is two passes:

1. a coarse pass on the whole image with the prompt as given (no previous logits), which says
   how far the object reaches;
2. the window :func:`prompt_view`: ``geometry.zoom_view`` (the same window a zoomed π_rev looks at)
   of the box grown to hold every positive click and the coarse mask's components that touch the
   box or a positive click; a point without a coarse mask stays on the whole image;
3. the fine pass in the window: the image cropped to it (one embedding per window, cached by
   content like any image), the box and clicks mapped into it (a negative click outside the window
   is dropped: everything outside is background anyway), and the previous ``low_res_logits`` only
   when they are the ones it returned for the same window (logits of another window do not line up);
   a whole-image window without previous logits is the coarse pass itself, and keeps its answer;
4. the window's logits pasted back into a whole-image array whose outside is background.

Training crops its samples with :func:`zoom_sample`, which uses the same window rule
(:mod:`monailabel_xflow.training.segmenter`, ``zoom_prob``). Whether a checkpoint was trained for
it is part of the checkpoint: :data:`VIEW_FILE` in the weights folder (:func:`read_view`,
:func:`write_view`), which :func:`~monailabel_xflow.segmenter.loading.load_segmenter` reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.geometry import (
    FULL_VIEW,
    Box,
    Click,
    box_to_mask,
    box_to_pixels,
    box_to_view,
    click_to_view,
    components_touching,
    make_box,
    mask_to_box,
    point_to_pixel,
    view_pixels,
    zoom_view,
)
from monailabel_xflow.segmenter.base import (
    PromptableSegmenter,
    SegmentationResult,
    SegmenterInputError,
    build_prompts,
    check_model_image,
)

__all__ = [
    "VIEW_FILE",
    "SEGMENTER_VIEWS",
    "MIN_ZOOM_BOX_PX",
    "OUTSIDE_LOGIT",
    "ZOOM_PROB",
    "MAX_ZOOM_SIDE",
    "ZoomedSegmenter",
    "prompt_view",
    "zoom_sample",
    "read_view",
    "write_view",
]

VIEW_FILE = "xflow_segmenter.json"
"""The file in an F_seg weights folder that says how the weights look at an image (``{"view": ...}``)."""

SEGMENTER_VIEWS = ("full", "zoom")
"""``full``: the whole image (SAM's way); ``zoom``: the window around each prompt."""

MIN_ZOOM_BOX_PX = 4.0
"""A box whose longer side is shorter than this (pixels) is a point: segmented on the whole image."""

MAX_ZOOM_SIDE = 0.5
"""The widest window worth zooming into, as a share of the image (chosen on the click benchmark's
dev seed over 1.0; ``reports/click-efficiency/README.md``)."""

ZOOM_PROB = 0.5
"""The share of window samples when a zooming F_seg is trained further with a config that names none
(the active-learning fine-tune): it keeps both passes, the whole image and the window, trained."""

OUTSIDE_LOGIT = -20.0
"""The logit pasted outside the window (background, far from the decision boundary)."""


def prompt_view(
    box: Sequence[float],
    clicks: Sequence[Click],
    shape: Sequence[int],
    coarse: NDArray[Any] | None = None,
    max_side: float = MAX_ZOOM_SIDE,
) -> Box:
    """The window a zoomed F_seg segments ``box`` in (normalised xyxy in the image).

    Args:
        box: the prompt's box.
        clicks: its clicks; the positive ones widen the window.
        shape: ``(H, W)`` of the image.
        coarse: ``(H, W)`` bool mask of the coarse pass, or None; its components that touch the box
            or a positive click widen the window.
        max_side: a window wider or taller than this share of the image is not worth zooming into.

    Returns:
        :func:`~monailabel_xflow.geometry.zoom_view` of the grown box, or
        :data:`~monailabel_xflow.geometry.FULL_VIEW` when that box is a point (longer side under
        :data:`MIN_ZOOM_BOX_PX`) or the window exceeds ``max_side``.
    """
    x1, y1, x2, y2 = (float(v) for v in box)
    positives = [c for c in clicks if c.positive]
    for c in positives:
        x1, y1, x2, y2 = min(x1, c.x), min(y1, c.y), max(x2, c.x), max(y2, c.y)
    if coarse is not None and coarse.any():
        reach = mask_to_box(_touching(np.asarray(coarse, bool), box, positives))
        if reach is not None:
            x1, y1, x2, y2 = min(x1, reach[0]), min(y1, reach[1]), max(x2, reach[2]), max(y2, reach[3])
    grown = make_box(x1, y1, x2, y2)
    px = box_to_pixels(grown, shape)
    if max(px[2] - px[0], px[3] - px[1]) < MIN_ZOOM_BOX_PX:
        return FULL_VIEW
    view = zoom_view(grown, shape)
    if view[2] - view[0] > max_side or view[3] - view[1] > max_side:
        return FULL_VIEW  # hardly closer than the whole image, and without its context
    return view


def _touching(mask: NDArray[np.bool_], box: Sequence[float], positives: Sequence[Click]) -> NDArray[np.bool_]:
    """The components of ``mask`` that overlap ``box`` or lie under a positive click."""
    anchor = box_to_mask(box, mask.shape)
    for c in positives:
        r, col = point_to_pixel(c.x, c.y, mask.shape)
        anchor[min(r, mask.shape[0] - 1), min(col, mask.shape[1] - 1)] = True
    return components_touching(mask, anchor)


def zoom_sample(image: NDArray[Any], mask: NDArray[Any], box: Sequence[float]) -> tuple[NDArray[Any], NDArray[Any]]:
    """A training sample cropped as :class:`ZoomedSegmenter` crops an image for ``box``.

    Args:
        image: ``(H, W)`` image.
        mask: ``(H, W)`` ground-truth component.
        box: the prompt's box (normalised xyxy), which decides the window.

    Returns:
        ``(image, mask)`` cropped to :func:`prompt_view` of ``box``.
    """
    rows, cols = view_pixels(prompt_view(box, (), mask.shape), mask.shape)
    return np.ascontiguousarray(image[rows, cols]), np.ascontiguousarray(mask[rows, cols])


def read_view(weights: str | Path) -> str:
    """How the F_seg weights at ``weights`` look at an image: ``"zoom"`` when their folder says so, else ``"full"``.

    Raises:
        SegmenterInputError: a :data:`VIEW_FILE` that is not JSON or names an unknown view.
    """
    path = Path(weights) / VIEW_FILE
    if not path.is_file():
        return "full"
    try:
        view = json.loads(path.read_text(encoding="utf-8")).get("view", "full")
    except (ValueError, AttributeError, OSError) as err:
        raise SegmenterInputError(f"{path} is not a JSON object: {err}") from err
    if view not in SEGMENTER_VIEWS:
        raise SegmenterInputError(f"{path}: view {view!r} is not one of {', '.join(SEGMENTER_VIEWS)}")
    return str(view)


def write_view(weights: str | Path, view: str) -> None:
    """Record in the weights folder how they were trained to look at an image (see :func:`read_view`)."""
    from monailabel_xflow.files import atomic_write

    if view not in SEGMENTER_VIEWS:
        raise ValueError(f"view {view!r} is not one of {', '.join(SEGMENTER_VIEWS)}")
    atomic_write(Path(weights) / VIEW_FILE, json.dumps({"view": view}) + "\n")


class ZoomedSegmenter:
    """F_seg that segments each box in its window (module docstring); same contract as the inner one.

    Args:
        inner: the segmenter that does the work (its embedding cache serves the windows).
        max_side: the widest window worth zooming into, as a share of the image (:func:`prompt_view`).
    """

    def __init__(self, inner: PromptableSegmenter, max_side: float = MAX_ZOOM_SIDE) -> None:
        self.inner = inner
        self.max_side = float(max_side)
        self._image: NDArray[np.float32] | None = None
        # the windows and low-res logits of the last call, to tell whether `previous` fits
        self._last: tuple[list[Box], NDArray[np.float32]] | None = None

    def __getattr__(self, name: str) -> Any:
        # the fingerprint (the weights are the inner's), the model, the input size: the inner segmenter's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def encode_options(self) -> dict[str, Any]:
        """The inner segmenter's, and the view: the same weights answer otherwise when they zoom,
        so a stored answer of one is not the other's."""
        return {**getattr(self.inner, "encode_options", {}), "view": "zoom"}

    def fork(self) -> ZoomedSegmenter:
        return ZoomedSegmenter(self.inner.fork(), self.max_side)

    def set_image(self, image: NDArray[Any]) -> None:
        """Keep the checked image; windows are encoded when first prompted."""
        self._image = check_model_image(image)
        self._last = None

    def predict(
        self,
        boxes: Sequence[Box],
        clicks: Sequence[Sequence[Click]] | None = None,
        previous: NDArray[Any] | None = None,
        multimask: bool = False,
    ) -> SegmentationResult:
        """The contract's :meth:`~monailabel_xflow.segmenter.base.PromptableSegmenter.predict`,
        one inner call per box, each in its window."""
        if self._image is None:
            raise RuntimeError("call set_image(image) before predict()")
        build_prompts(boxes, clicks, previous)  # every prompt check, as the backends make them
        shape = self._image.shape[:2]
        per_box = [list(c) for c in clicks] if clicks is not None else [[] for _ in boxes]
        coarse = None
        if boxes:  # the coarse pass: how far each object reaches
            self.inner.set_image(self._image)
            coarse = self.inner.predict(boxes, per_box, None, multimask)
        views = [
            prompt_view(b, c, shape, coarse.masks[i] if coarse is not None else None, self.max_side)
            for i, (b, c) in enumerate(zip(boxes, per_box, strict=True))
        ]
        fits = (
            previous is not None
            and self._last is not None
            and self._last[0] == views
            and np.array_equal(np.asarray(previous, np.float32), self._last[1])
        )
        results = []
        for i, (box, box_clicks, view) in enumerate(zip(boxes, per_box, views, strict=True)):
            rows, cols = view_pixels(view, shape)
            prev = np.asarray(previous)[i : i + 1] if fits and previous is not None else None
            if view == FULL_VIEW and prev is None and coarse is not None:
                # the fine pass would repeat the coarse one: same image, same prompt
                one = slice(i, i + 1)
                same = SegmentationResult(
                    coarse.logits[one], coarse.masks[one], coarse.iou[one], coarse.low_res_logits[one]
                )
                results.append((rows, cols, same))
                continue
            self.inner.set_image(np.ascontiguousarray(self._image[rows, cols]))
            moved = [m for m in (click_to_view(c, view) for c in box_clicks) if m is not None]
            results.append((rows, cols, self.inner.predict([box_to_view(box, view)], [moved], prev, multimask)))
        logits = np.full((len(boxes), *shape), OUTSIDE_LOGIT, np.float32)
        for i, (rows, cols, r) in enumerate(results):
            logits[i, rows, cols] = r.logits[0]
        low = (
            np.concatenate([r.low_res_logits for _, _, r in results]) if results else np.zeros((0, 1, 1, 1), np.float32)
        )
        self._last = (views, low)
        iou = np.concatenate([r.iou for _, _, r in results]) if results else np.zeros(0, np.float32)
        return SegmentationResult(logits, logits > 0, iou.astype(np.float32), low)
