"""Overlays, boxes, clicks and contact sheets: the ONE place pictures are drawn (numpy + PIL).

Conventions: images are ``(H, W)`` float in ``[0, 1]`` (MONOCHROME2) or ``uint8 (H, W, 3)`` RGB;
masks are bool ``(H, W)`` of the same shape; boxes and clicks are normalised as in
:mod:`monailabel_xflow.geometry`, and are turned into pixels only through it. Every function is
deterministic (no randomness, no fonts beyond PIL's built-in default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw, ImageFont

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import FULL_VIEW, Click, box_to_pixels, click_to_view, point_to_pixel, view_pixels

PALETTE: tuple[tuple[int, int, int], ...] = (
    (255, 64, 64),
    (64, 160, 255),
    (255, 200, 0),
    (0, 220, 120),
    (220, 80, 255),
    (255, 128, 0),
    (0, 230, 230),
    (180, 255, 60),
)
"""Default colours, cycled over masks and boxes."""

FINDING_COLOURS: tuple[tuple[int, int, int], ...] = (
    (230, 25, 75),
    (60, 180, 75),
    (255, 225, 25),
    (0, 130, 200),
    (245, 130, 48),
    (145, 30, 180),
    (70, 240, 240),
)
"""RGB of label value ``v`` at index ``v - 1`` (overlays and DICOM SEG segments alike)."""

POSITIVE_COLOR = (0, 255, 0)
NEGATIVE_COLOR = (255, 0, 0)
OBSERVATION_MASK_COLOR = (255, 64, 64)
OBSERVATION_ALPHA = 0.35


class RenderError(InputError):
    """Inputs that cannot be drawn together: wrong dtype, rank or mismatched shapes."""


def to_rgb(image: NDArray[Any]) -> NDArray[np.uint8]:
    """A float ``(H, W)`` image in ``[0, 1]`` (or uint8 ``(H, W)``/``(H, W, 3)``) as uint8 RGB."""
    a = np.asarray(image)
    if a.ndim == 3 and a.shape[2] == 3 and a.dtype == np.uint8:
        return a.copy()
    if a.ndim != 2:
        raise RenderError(f"expected an (H, W) image or uint8 (H, W, 3), got shape {a.shape}")
    if a.dtype != np.uint8:
        a = np.round(np.clip(a.astype(np.float32), 0, 1) * 255).astype(np.uint8)
    return np.repeat(a[:, :, None], 3, axis=2)


def _outline(mask: NDArray[np.bool_], width: int) -> NDArray[np.bool_]:
    """Pixels of ``mask`` within ``width`` pixels of its border (4-neighbour erosion)."""
    inner = mask.copy()
    for _ in range(width):
        shrunk = inner.copy()
        shrunk[1:] &= inner[:-1]
        shrunk[:-1] &= inner[1:]
        shrunk[:, 1:] &= inner[:, :-1]
        shrunk[:, :-1] &= inner[:, 1:]
        inner = shrunk
    return mask & ~inner


def _color(colors: Sequence[Sequence[int]] | None, i: int) -> tuple[int, int, int]:
    if colors is None:
        return PALETTE[i % len(PALETTE)]
    r, g, b = colors[i]
    return (r, g, b)


def overlay(
    image: NDArray[Any],
    masks: Sequence[NDArray[Any]],
    colors: Sequence[Sequence[int]] | None = None,
    outline: bool = True,
    alpha: float = 0.3,
) -> NDArray[np.uint8]:
    """Masks blended over a radiograph.

    Args:
        image: float ``(H, W)`` in ``[0, 1]`` or uint8 grey / RGB.
        masks: bool ``(H, W)`` each; drawn in order (later on top).
        colors: RGB triples, one per mask; default :data:`PALETTE` cycled.
        outline: also draw a solid border (width ~ H/256, at least 1 px).
        alpha: fill opacity in ``[0, 1]`` (0: outline only).

    Returns:
        uint8 ``(H, W, 3)``.

    Raises:
        RenderError: a mask whose shape differs from the image's.
    """
    rgb = to_rgb(image).astype(np.float32)
    h, w = rgb.shape[:2]
    width = max(1, round(max(h, w) / 256))
    for i, m in enumerate(masks):
        m = np.asarray(m, bool)
        if m.shape != (h, w):
            raise RenderError(f"mask {i} has shape {m.shape}, image is {(h, w)}")
        c = np.array(_color(colors, i), np.float32)
        if alpha > 0:
            rgb[m] = (1 - alpha) * rgb[m] + alpha * c
        if outline:
            rgb[_outline(m, width)] = c
    return np.round(rgb).astype(np.uint8)


def label_overlay_png(image: NDArray[Any], label: NDArray[Any]) -> bytes:
    """PNG bytes of ``image`` (float ``(H, W)`` in ``[0, 1]``) with a label map (``(H, W)``, value
    ``v`` in :data:`FINDING_COLOURS` ``[v - 1]``) tinted over it, no outlines."""
    import io

    masks = [label == value for value in range(1, len(FINDING_COLOURS) + 1)]
    rgb = overlay(image, masks, colors=FINDING_COLOURS, outline=False, alpha=0.45)
    buf = io.BytesIO()
    Image.fromarray(rgb, mode="RGB").save(buf, format="PNG")
    return buf.getvalue()


def draw_boxes(
    rgb: NDArray[Any],
    boxes: Sequence[Sequence[float]],
    colors: Sequence[Sequence[int]] | None = None,
    labels: Sequence[str] | None = None,
) -> NDArray[np.uint8]:
    """Normalised ``xyxy`` boxes drawn as rectangles (optional label above each); returns a copy."""
    rgb = to_rgb(rgb)
    h, w = rgb.shape[:2]
    im = Image.fromarray(rgb)
    draw = ImageDraw.Draw(im)
    width = max(1, round(max(h, w) / 256))
    font = ImageFont.load_default()
    for i, box in enumerate(boxes):
        x1, y1, x2, y2 = (int(v) for v in box_to_pixels(box, (h, w)))
        c = _color(colors, i)
        draw.rectangle([x1, y1, max(x1, x2 - 1), max(y1, y2 - 1)], outline=c, width=width)
        if labels is not None and i < len(labels) and labels[i]:
            draw.text((x1 + 2, max(0, y1 - 12)), labels[i], fill=c, font=font)
    return np.asarray(im)


def draw_clicks(rgb: NDArray[np.uint8], clicks: Sequence[Click]) -> NDArray[np.uint8]:
    """Clicks as markers: positive a green ``+``, negative a red ``-``; returns a copy.

    The marker is centred on the click's pixel (via :func:`geometry.point_to_pixel`); its arm
    is ~2.5 % of the image side (at least 3 px) and its stroke ~0.6 % (at least 1 px), drawn
    over a dark halo so it reads on bright and dark lungs alike.
    """
    rgb = to_rgb(rgb)
    h, w = rgb.shape[:2]
    im = Image.fromarray(rgb)
    draw = ImageDraw.Draw(im)
    arm = max(3, round(0.025 * max(h, w)))
    stroke = max(1, round(0.006 * max(h, w)))
    for click in clicks:
        r, c = point_to_pixel(click.x, click.y, (h, w))
        color = POSITIVE_COLOR if click.positive else NEGATIVE_COLOR
        segments = [((c - arm, r), (c + arm, r))]
        if click.positive:
            segments.append(((c, r - arm), (c, r + arm)))
        for halo, col in ((stroke + 2, (0, 0, 0)), (stroke, color)):
            for a, b in segments:
                draw.line([a, b], fill=col, width=halo)
    return np.asarray(im)


def render_observation(
    image: NDArray[Any], mask: NDArray[Any], clicks: Sequence[Click] = (), view: Sequence[float] = FULL_VIEW
) -> NDArray[np.uint8]:
    """The Stage 2 policy observation (training and inference alike).

    Definition: the part of the radiograph that ``view`` shows, as grey RGB; the current mask
    filled in :data:`OBSERVATION_MASK_COLOR` at opacity :data:`OBSERVATION_ALPHA` with a solid
    border of the same colour; then every click so far that lies in the view, in order, as
    :func:`draw_clicks` markers. Pure function of its inputs: the same arguments give the
    same bytes.

    Args:
        image: float ``(H, W)`` in ``[0, 1]``.
        mask: bool ``(H, W)`` (may be empty).
        clicks: normalised image clicks issued so far.
        view: the window shown, normalised xyxy (:func:`~monailabel_xflow.geometry.zoom_view`);
            the whole image by default.

    Returns:
        uint8 ``(h, w, 3)``: ``(H, W, 3)`` for the whole image, the view's pixels otherwise.
    """
    rows, cols = view_pixels(view, np.shape(image))
    rgb = overlay(
        np.asarray(image)[rows, cols],
        [np.asarray(mask)[rows, cols]],
        colors=[OBSERVATION_MASK_COLOR],
        outline=True,
        alpha=OBSERVATION_ALPHA,
    )
    shown = [v for v in (click_to_view(c, view) for c in clicks) if v is not None]
    return draw_clicks(rgb, shown)


def contact_sheet(
    tiles: Sequence[NDArray[Any]],
    titles: Sequence[str],
    ncols: int = 4,
    tile_size: int = 256,
    legend: Sequence[tuple[str, tuple[int, int, int]]] = (),
) -> NDArray[np.uint8]:
    """Tiles in a grid, each resized to ``tile_size`` square with its title below.

    Args:
        tiles: uint8 RGB ``(h, w, 3)`` (or float grey, converted).
        titles: one per tile (may be ""), drawn with PIL's default font.
        ncols: columns of the grid.
        tile_size: side of each tile in pixels.
        legend: optional ``(label, colour)`` swatches drawn in a strip at the bottom.

    Returns:
        uint8 RGB ``(rows*(tile_size+title_h) [+ legend_h], ncols*tile_size, 3)``.
    """
    if len(titles) != len(tiles):
        raise RenderError(f"{len(tiles)} tiles but {len(titles)} titles")
    font = ImageFont.load_default()
    title_h = 14
    ncols = max(1, min(ncols, len(tiles) or 1))
    nrows = max(1, -(-len(tiles) // ncols))
    legend_h = 18 if legend else 0
    sheet = Image.new("RGB", (ncols * tile_size, nrows * (tile_size + title_h) + legend_h), (0, 0, 0))
    draw = ImageDraw.Draw(sheet)
    for i, (tile, title) in enumerate(zip(tiles, titles, strict=True)):
        r, c = divmod(i, ncols)
        x0, y0 = c * tile_size, r * (tile_size + title_h)
        sheet.paste(Image.fromarray(to_rgb(tile)).resize((tile_size, tile_size), Image.Resampling.BILINEAR), (x0, y0))
        draw.text((x0 + 3, y0 + tile_size + 1), title, fill=(255, 255, 255), font=font)
    x = 4
    for label, color in legend:
        y = sheet.height - legend_h + 3
        draw.rectangle([x, y, x + 11, y + 11], fill=tuple(color))
        draw.text((x + 15, y), label, fill=(255, 255, 255), font=font)
        x += 15 + int(draw.textlength(label, font=font)) + 12
    return np.asarray(sheet)
