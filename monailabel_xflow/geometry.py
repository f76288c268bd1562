"""Coordinates: the one place where conventions meet. Never transpose elsewhere.

Conventions used everywhere in the package:

* **Image arrays** are ``(H, W)``: row 0 is the top of the displayed image, column 0 its left.
* **Normalised coordinates** are continuous, ``x`` (horizontal) first, in ``[0, 1]``. Pixel
  ``(row, col)`` covers ``[col/W, (col+1)/W) x [row/H, (row+1)/H)``; its centre is
  ``((col + 0.5) / W, (row + 0.5) / H)``.
* **Boxes** are normalised ``(x1, y1, x2, y2)`` with ``x1 <= x2`` and ``y1 <= y2``.
* **Clicks** are :class:`Click` ``(positive, x, y)`` with normalised ``x, y``.
* **Text coordinates** (the policies' protocol) are integers 0–1000, x first (Qwen-VL style).
* **View coordinates** are normalised coordinates of the window a Stage 2 observation shows
  (:func:`zoom_view`; :data:`FULL_VIEW` is the whole image). A policy that looks at a view
  reads and writes its boxes and clicks in it; :func:`click_from_view` maps them back.
* **SAM input** coordinates are pixels of the 1008 x 1008 resize the segmenter sees.
* **MONAI Label client clicks** are voxel indices ``[i, j, k]`` of the image as MONAI's
  PIL/ITK readers hold it, i.e. ``(W, H, 1)``: ``i`` is the column, ``j`` the row, ``k`` = 0.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.errors import InputError

TEXT_SCALE = 1000
"""Text coordinates run 0..TEXT_SCALE inclusive."""

SAM_SIZE = 1008
"""Side of the square input of Sam3TrackerModel."""

Box = tuple[float, float, float, float]


class GeometryError(InputError):
    """A coordinate that cannot be mapped: outside the image, wrong arity, not finite."""


class Click(NamedTuple):
    """A point prompt. ``positive`` grows the mask, negative shrinks it. ``x, y`` normalised."""

    positive: bool
    x: float
    y: float


def _check_finite(*values: float) -> None:
    if not all(math.isfinite(float(v)) for v in values):
        raise GeometryError(f"coordinates must be finite, got {values}")


MIN_IMAGE_SIDE = 2
"""Smallest image height and width the models take (SAM resizes, the VLM needs a picture)."""

# id -> weak reference of every checked image still alive (see check_image)
_checked: dict[int, weakref.ref[NDArray[np.float32]]] = {}


def check_image(image: Any, *, rgb: bool = False) -> NDArray[np.float32]:
    """The one image rule of the package: a radiograph as ``transforms.load_cxr`` returns it.

    The rule: a real-valued ``(H, W)`` array (with ``rgb``, also ``(H, W, 3)``, or ``(H, W, 1)``
    taken as ``(H, W)``), at least :data:`MIN_IMAGE_SIDE` pixels each way, finite, in ``[0, 1]``.
    Validate once at a border and let the layers below trust what comes out: the result is a
    *checked image*, a read-only float32 view (a copy only when the dtype differs), and checking a
    checked image again returns it at once (:func:`is_checked`). Its pixels are taken as fixed
    from then on (the segmenters hash them once): do not change the array it views while a call
    that checked it runs.

    Returns:
        ``(H, W)`` (or ``(H, W, 3)``) float32 in ``[0, 1]``, read-only.

    Raises:
        GeometryError: another shape, too small, not real-valued, NaN/infinite values, or values
            outside ``[0, 1]``.
    """
    if is_checked(image):
        return image  # type: ignore[no-any-return]
    arr = np.asarray(image)
    if rgb and arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[..., 0]
    if not (arr.ndim == 2 or (rgb and arr.ndim == 3 and arr.shape[2] == 3)):
        layout = "(H, W) grey or (H, W, 3) RGB (drop an alpha channel first)" if rgb else "a 2-D (H, W) array"
        raise GeometryError(f"image must be {layout}, got shape {arr.shape}")
    if min(arr.shape[:2]) < MIN_IMAGE_SIDE:
        raise GeometryError(f"image of shape {arr.shape} is too small (at least {MIN_IMAGE_SIDE} x {MIN_IMAGE_SIDE})")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise GeometryError(f"image must be real-valued, got dtype {arr.dtype}")
    out = arr.astype(np.float32, copy=False).view()  # a view of its own: flags set below stay here
    lo, hi = float(out.min()), float(out.max())  # NaN propagates to both, so one pass per bound
    if not (lo >= 0.0 and hi <= 1.0):
        if not np.isfinite(out).all():
            raise GeometryError("image holds NaN or infinite values")
        raise GeometryError(f"image values must lie in [0, 1] (transforms.load_cxr output), got [{lo:.3g}, {hi:.3g}]")
    out.flags.writeable = False
    key = id(out)
    _checked[key] = weakref.ref(out, functools.partial(_forget, _checked, key))
    return out


def _forget(registry: dict[int, Any], key: int, _ref: object) -> None:
    """A weak reference's callback: drop its entry (the registry is bound, no global at exit)."""
    registry.pop(key, None)


def is_checked(image: Any) -> bool:
    """Whether ``image`` is an array :func:`check_image` returned (and so needs no check)."""
    ref = _checked.get(id(image))
    return ref is not None and ref() is image


def check_click(click: Any, what: str = "click") -> Click:
    """The one click check of the package: ``(positive, x, y)`` with finite ``x, y`` in ``[0, 1]``.

    Args:
        click: a :class:`Click` or any ``(positive, x, y)`` triple.
        what: how the message names the click (e.g. ``"click of box 2"``).

    Raises:
        GeometryError: not a triple, or a point outside the image.
    """
    try:
        positive, x, y = click
        x, y = float(x), float(y)
    except (TypeError, ValueError):
        raise GeometryError(f"{what} {click!r} is not (positive, x, y)") from None
    if not (math.isfinite(x) and math.isfinite(y) and 0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
        raise GeometryError(f"{what} {click!r} lies outside the image (normalised coordinates in [0, 1])")
    return Click(bool(positive), x, y)


def clip01(v: float) -> float:
    return min(1.0, max(0.0, float(v)))


def make_box(x1: float, y1: float, x2: float, y2: float) -> Box:
    """A normalised box with its corners ordered and clipped to the image."""
    _check_finite(x1, y1, x2, y2)
    xa, xb = sorted((clip01(x1), clip01(x2)))
    ya, yb = sorted((clip01(y1), clip01(y2)))
    return (xa, ya, xb, yb)


# --- pixels ---------------------------------------------------------------------------------


def pixel_to_point(row: float, col: float, shape: Sequence[int]) -> tuple[float, float]:
    """Centre of pixel ``(row, col)`` of an ``(H, W)`` image as normalised ``(x, y)``."""
    h, w = int(shape[0]), int(shape[1])
    return ((col + 0.5) / w, (row + 0.5) / h)


def point_to_pixel(x: float, y: float, shape: Sequence[int]) -> tuple[int, int]:
    """The ``(row, col)`` of the pixel containing normalised point ``(x, y)``.

    Raises:
        GeometryError: if the point lies outside ``[0, 1]^2``.
    """
    _check_finite(x, y)
    if not (0.0 <= x <= 1.0 and 0.0 <= y <= 1.0):
        raise GeometryError(f"point ({x:.4f}, {y:.4f}) lies outside the image")
    h, w = int(shape[0]), int(shape[1])
    return (min(h - 1, int(y * h)), min(w - 1, int(x * w)))


def box_to_pixels(box: Sequence[float], shape: Sequence[int]) -> NDArray[np.float64]:
    """Normalised box -> continuous pixel ``(x1, y1, x2, y2)`` of an ``(H, W)`` image."""
    h, w = int(shape[0]), int(shape[1])
    return np.array([box[0] * w, box[1] * h, box[2] * w, box[3] * h], dtype=np.float64)


def pixels_to_box(xyxy: Sequence[float], shape: Sequence[int]) -> Box:
    """Continuous pixel ``(x1, y1, x2, y2)`` -> normalised box (clipped)."""
    h, w = int(shape[0]), int(shape[1])
    return make_box(xyxy[0] / w, xyxy[1] / h, xyxy[2] / w, xyxy[3] / h)


def mask_to_box(mask: NDArray[Any]) -> Box | None:
    """Tight normalised box around the non-zero pixels of an ``(H, W)`` mask (pixel edges).

    Returns None for an empty mask.
    """
    rows = np.flatnonzero(mask.any(axis=1))
    if rows.size == 0:
        return None
    cols = np.flatnonzero(mask.any(axis=0))
    h, w = mask.shape[:2]
    return (cols[0] / w, rows[0] / h, (cols[-1] + 1) / w, (rows[-1] + 1) / h)


def box_to_mask(box: Sequence[float], shape: Sequence[int]) -> NDArray[np.bool_]:
    """Boolean ``(H, W)`` mask of the pixels whose centres lie inside a normalised box."""
    h, w = int(shape[0]), int(shape[1])
    xs = (np.arange(w) + 0.5) / w
    ys = (np.arange(h) + 0.5) / h
    inx = (xs >= box[0]) & (xs <= box[2])
    iny = (ys >= box[1]) & (ys <= box[3])
    return iny[:, None] & inx[None, :]


def resize_mask(mask: NDArray[Any], shape: Sequence[int]) -> NDArray[np.bool_]:
    """Nearest-neighbour resize of a bool ``(H, W)`` mask to ``shape = (H', W')``.

    Used where a mask and its image differ in size (MIMIC-ILS masks are 512 px).
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.shape == tuple(int(v) for v in shape[:2]):
        return mask
    from PIL import Image

    img = Image.fromarray(mask.astype(np.uint8) * 255)
    return np.asarray(img.resize((int(shape[1]), int(shape[0])), Image.Resampling.NEAREST)) > 0


# --- text (0..1000) -------------------------------------------------------------------------


def to_text(v: float) -> int:
    """Normalised coordinate -> integer text coordinate 0..1000."""
    _check_finite(v)
    return int(round(clip01(v) * TEXT_SCALE))


def from_text(v: int | float) -> float:
    """Integer text coordinate -> normalised coordinate."""
    return float(v) / TEXT_SCALE


def box_to_text(box: Sequence[float]) -> tuple[int, int, int, int]:
    return tuple(to_text(v) for v in box)  # type: ignore[return-value]


def box_from_text(values: Sequence[int | float]) -> Box:
    return tuple(from_text(v) for v in values)  # type: ignore[return-value]


# --- SAM model input (1008 x 1008) ----------------------------------------------------------


def box_to_sam(box: Sequence[float], size: int = SAM_SIZE) -> list[float]:
    """Normalised box -> SAM input pixels ``[x1, y1, x2, y2]``.

    Equivalent to scaling original-image pixels by ``size / W`` and ``size / H``.
    """
    return [float(v) * size for v in box]


def point_to_sam(x: float, y: float, size: int = SAM_SIZE) -> list[float]:
    """Normalised point -> SAM input pixels ``[x, y]``."""
    return [float(x) * size, float(y) * size]


# --- MONAI Label clients --------------------------------------------------------------------


def client_index_to_point(index: Sequence[float], shape: Sequence[int]) -> tuple[float, float]:
    """A Slicer/OHIF click ``[i, j(, k)]`` on an ``(H, W)`` image -> normalised ``(x, y)``.

    MONAI's readers hold a 2D radiograph as ``(W, H[, 1])``, so ``i`` indexes columns and
    ``j`` rows; the returned point is the centre of the nearest pixel. Coordinates are continuous:
    any ``-0.5 <= i < W`` and ``-0.5 <= j < H`` lies on the image (a viewer's ``[0, W)`` image
    coordinates and ITK's voxel-centred indices alike; ``511.999`` on a 512-wide image is its
    last column).

    Raises:
        GeometryError: wrong arity, a non-zero slice index, or a point outside the image.
    """
    if len(index) not in (2, 3):
        raise GeometryError(f"a click needs 2 or 3 indices [i, j, k], got {list(index)}")
    _check_finite(*index)
    i, j = float(index[0]), float(index[1])
    if len(index) == 3 and int(round(float(index[2]))) != 0:
        raise GeometryError(f"click {list(index)} is on slice {index[2]}; a radiograph has one slice (k=0)")
    h, w = int(shape[0]), int(shape[1])
    if not (-0.5 <= i < w and -0.5 <= j < h):
        raise GeometryError(f"click {list(index)} lies outside the {w} x {h} image (0 <= i < W, 0 <= j < H)")
    col, row = min(max(int(round(i)), 0), w - 1), min(max(int(round(j)), 0), h - 1)
    return pixel_to_point(row, col, shape)


def point_to_client_index(x: float, y: float, shape: Sequence[int]) -> list[int]:
    """Normalised point -> the ``[i, j, 0]`` voxel index a MONAI Label client uses."""
    row, col = point_to_pixel(x, y, shape)
    return [col, row, 0]


# --- box arithmetic -------------------------------------------------------------------------


def box_area(box: Sequence[float]) -> float:
    return max(0.0, box[2] - box[0]) * max(0.0, box[3] - box[1])


def box_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two boxes (0 when both are degenerate)."""
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = box_area(a) + box_area(b) - inter
    return inter / union if union > 0 else 0.0


def grow_box(box: Sequence[float], click: Click) -> Box:
    """Stage 2 box-growth rule.

    A positive click outside the box grows it to the smallest box enclosing the old box and
    the click; any other click leaves the box unchanged.
    """
    x1, y1, x2, y2 = box
    inside = x1 <= click.x <= x2 and y1 <= click.y <= y2
    if not click.positive or inside:
        return (x1, y1, x2, y2)
    return (min(x1, click.x), min(y1, click.y), max(x2, click.x), max(y2, click.y))


def clicks_box(clicks: Sequence[Click]) -> Box:
    """The box of a person's clicks without a box or mask (the click tool's rule): the bounds of
    the positive clicks, or of all clicks when none is positive (a negative click says "not
    here", so it does not widen the box). Normalised xyxy, degenerate for a single click.

    Raises:
        GeometryError: no click.
    """
    if not clicks:
        raise GeometryError("no click to take a box from")
    inside = [c for c in clicks if c.positive] or list(clicks)
    xs, ys = [c.x for c in inside], [c.y for c in inside]
    return make_box(min(xs), min(ys), max(xs), max(ys))


# --- the Stage 2 observation's view ---------------------------------------------------------

FULL_VIEW: Box = (0.0, 0.0, 1.0, 1.0)
"""The whole image: a view in which view and image coordinates are the same."""

VIEW_MARGIN = 0.5
"""A zoomed view shows the box with this fraction of its longer side added on every side."""

VIEW_MIN_SIDE = 0.25
"""Smallest zoomed view, as a fraction of the image's shorter side (a speck still shows context)."""


def zoom_view(box: Sequence[float], shape: Sequence[int], margin: float = VIEW_MARGIN) -> Box:
    """The window a zoomed Stage 2 observation shows around ``box``.

    A square in pixels (the policy's picture is square, so nothing is stretched), centred on
    ``box``, of side ``(1 + 2 * margin)`` times the box's longer side and at least
    :data:`VIEW_MIN_SIDE` of the image's shorter side, shifted (not shrunk) to lie inside the
    image and snapped to whole pixels, so that cropping and :func:`to_view` agree exactly.

    Args:
        box: normalised xyxy (the box that prompted the mask).
        shape: ``(H, W)`` of the image.
        margin: context added on each side, as a fraction of the box's longer side.

    Returns:
        A normalised xyxy box inside the image.
    """
    h, w = int(shape[0]), int(shape[1])
    x1, y1, x2, y2 = box_to_pixels(box, shape)
    side = max(max(x2 - x1, y2 - y1) * (1.0 + 2.0 * margin), VIEW_MIN_SIDE * min(h, w))
    side = float(min(round(side), h, w))
    left = min(max(round((x1 + x2 - side) / 2.0), 0.0), w - side)
    top = min(max(round((y1 + y2 - side) / 2.0), 0.0), h - side)
    return pixels_to_box((left, top, left + side, top + side), shape)


def view_pixels(view: Sequence[float], shape: Sequence[int]) -> tuple[slice, slice]:
    """``(rows, cols)`` slices of an ``(H, W)`` array that a view shows."""
    x1, y1, x2, y2 = (int(round(v)) for v in box_to_pixels(view, shape))
    return slice(y1, max(y2, y1 + 1)), slice(x1, max(x2, x1 + 1))


def to_view(x: float, y: float, view: Sequence[float]) -> tuple[float, float]:
    """Image-normalised point -> normalised coordinates of the view (outside ``[0, 1]`` when
    the point lies outside the view)."""
    return ((x - view[0]) / (view[2] - view[0]), (y - view[1]) / (view[3] - view[1]))


def from_view(x: float, y: float, view: Sequence[float]) -> tuple[float, float]:
    """View-normalised point -> image-normalised point (inverse of :func:`to_view`)."""
    return (view[0] + x * (view[2] - view[0]), view[1] + y * (view[3] - view[1]))


def click_to_view(click: Click, view: Sequence[float]) -> Click | None:
    """A click in the view's coordinates, or None when it lies outside the view."""
    x, y = to_view(click.x, click.y, view)
    return Click(click.positive, x, y) if 0.0 <= x <= 1.0 and 0.0 <= y <= 1.0 else None


def click_from_view(click: Click, view: Sequence[float]) -> Click:
    """A click read in the view's coordinates, in the image's."""
    x, y = from_view(click.x, click.y, view)
    return Click(click.positive, clip01(x), clip01(y))


def box_to_view(box: Sequence[float], view: Sequence[float]) -> Box:
    """A box in the view's coordinates, clipped to the view."""
    x1, y1 = to_view(box[0], box[1], view)
    x2, y2 = to_view(box[2], box[3], view)
    return make_box(x1, y1, x2, y2)


def connected_components(mask: NDArray[Any], min_area_px: int = 1) -> list[NDArray[np.bool_]]:
    """Split a ground-truth mask into its 8-connected components.

    Args:
        mask: ``(H, W)`` mask, non-zero = foreground.
        min_area_px: components with fewer pixels are left out.

    Returns:
        One bool ``(H, W)`` mask per component, in the order of their first pixel in row-major
        order (so component ids are stable for a given mask).

    Raises:
        GeometryError: if ``mask`` is not 2-D.
    """
    from scipy import ndimage

    mask = np.asarray(mask)
    if mask.ndim != 2:
        raise GeometryError(f"mask must be a 2-D (H, W) mask, got shape {mask.shape}")
    labels, n = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    sizes = np.bincount(labels.ravel(), minlength=n + 1)  # sizes first: no full mask per speck
    return [labels == i for i in range(1, n + 1) if sizes[i] >= min_area_px]


def components_touching(mask: NDArray[Any], anchor: NDArray[Any]) -> NDArray[np.bool_]:
    """The union of the 8-connected components of ``mask`` that have a pixel in ``anchor``.

    The one rule for "the object a prompt points at": Stage 2's pruning, the zoom-in window and
    the ILS pipeline's anomaly selection all keep whole components by what they touch. Labels
    the mask once and selects by label id (a map can hold thousands of specks).

    Args:
        mask: ``(H, W)`` mask, non-zero = foreground.
        anchor: ``(H, W)`` bool, the pixels that select (a box's pixels, clicks, a previous mask).

    Returns:
        ``(H, W)`` bool; empty when no component touches ``anchor``.
    """
    from scipy import ndimage

    mask = np.asarray(mask, bool)
    labels, _ = ndimage.label(mask, structure=np.ones((3, 3), dtype=bool))
    hit = np.unique(labels[np.asarray(anchor, bool) & mask])
    return np.isin(labels, hit[hit > 0])


# --- specks: the one owner -----------------------------------------------------------------------

SPECK_FRACTION = 0.001
"""A connected component (8-connectivity) with fewer than this fraction of the image's pixels is a
*speck*, noise rather than a lesion (0.1 %): the mask-noise metrics count them and F_seg's
promotion leaves them out of its prompts (:func:`speck_area_px`)."""

MIN_COMPONENT_PX = 16
"""The floor for ground truth in training data: components smaller than this (in mask pixels)
get no box. An absolute count, not :data:`SPECK_FRACTION`: phantom lesions go down to 0.06 % of
the image, and the builders must keep them."""


def speck_area_px(shape: Sequence[int], fraction: float = SPECK_FRACTION) -> float:
    """Components of an ``(H, W)`` mask with fewer pixels than this are specks."""
    return fraction * int(shape[0]) * int(shape[1])


def lesion_boxes(mask: NDArray[Any] | None, min_px: int = MIN_COMPONENT_PX) -> list[Box]:
    """One tight normalised box per ground-truth component (8-connectivity), specks skipped."""
    if mask is None or not mask.any():
        return []
    boxes = [mask_to_box(c) for c in connected_components(mask, min_area_px=min_px)]
    return [b for b in boxes if b is not None]  # a component is never empty
