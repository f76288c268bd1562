"""Overlays, boxes, clicks, the Stage 2 observation and contact sheets."""

from __future__ import annotations

import numpy as np
import pytest

from monailabel_xflow.geometry import Click, pixel_to_point
from monailabel_xflow.rendering import (
    NEGATIVE_COLOR,
    OBSERVATION_MASK_COLOR,
    POSITIVE_COLOR,
    RenderError,
    contact_sheet,
    draw_boxes,
    draw_clicks,
    overlay,
    render_observation,
)

H, W = 320, 256  # asymmetric on purpose


def _image():
    return np.tile(np.linspace(0, 1, W, dtype=np.float32), (H, 1))


def test_overlay_lands_on_mask_pixels():
    mask = np.zeros((H, W), bool)
    mask[200:260, 30:80] = True  # lower left: rows 200.., cols 30..
    out = overlay(_image(), [mask], colors=[(255, 0, 0)], outline=True, alpha=0.5)
    assert out.shape == (H, W, 3) and out.dtype == np.uint8
    assert (out[200, 50] == (255, 0, 0)).all()  # border pixel
    inside = out[230, 55]
    assert inside[0] > inside[1] == inside[2]  # tinted red
    grey = out[~mask]
    assert (grey[:, 0] == grey[:, 1]).all() and (grey[:, 1] == grey[:, 2]).all()
    with pytest.raises(RenderError):
        overlay(_image(), [np.zeros((W, H), bool)])


def test_clicks_at_their_pixels_and_deterministic():
    row, col = 250, 40
    x, y = pixel_to_point(row, col, (H, W))
    clicks = [Click(True, x, y), Click(False, *pixel_to_point(60, 200, (H, W)))]
    out = draw_clicks(overlay(_image(), []), clicks)
    assert (out[row, col] == POSITIVE_COLOR).all()
    assert (out[row - 4, col] == POSITIVE_COLOR).all()  # vertical arm of the plus
    assert (out[60, 200] == NEGATIVE_COLOR).all()
    assert not (out[56, 200] == NEGATIVE_COLOR).all()  # a minus has no vertical arm
    mask = np.zeros((H, W), bool)
    mask[100:150, 100:200] = True
    a = render_observation(_image(), mask, clicks)
    b = render_observation(_image(), mask, clicks)
    assert a.tobytes() == b.tobytes() and a.shape == (H, W, 3)
    assert (a[100, 150] == OBSERVATION_MASK_COLOR).all()


def test_boxes():
    box = (0.25, 0.5, 0.75, 0.75)  # x1, y1, x2, y2 normalised
    out = draw_boxes(overlay(_image(), []), [box], colors=[(0, 0, 255)], labels=["effusion"])
    assert (out[200, 64] == (0, 0, 255)).all()  # top-left corner: row 0.5*H, col 0.25*W
    assert (out[239, 191] == (0, 0, 255)).all()  # bottom-right corner pixel
    assert not (out[230, 128] == (0, 0, 255)).all()  # interior untouched


def test_contact_sheet_shape():
    tiles = [overlay(_image(), [])] * 5
    sheet = contact_sheet(
        tiles, [f"t{i}" for i in range(5)], ncols=3, tile_size=64, legend=[("effusion", (0, 220, 120))]
    )
    assert sheet.dtype == np.uint8 and sheet.shape[1] == 3 * 64 and sheet.shape[2] == 3
    assert sheet.shape[0] > 2 * 64
    with pytest.raises(RenderError):
        contact_sheet(tiles, ["only one"])
