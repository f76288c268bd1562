"""Coordinates on an asymmetric image: every conversion must land on a known pixel."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from monailabel_xflow import geometry as g

H, W = 256, 320  # rows, columns: asymmetric on purpose


def test_pixel_point_round_trip_on_known_pixel():
    x, y = g.pixel_to_point(40, 300, (H, W))
    assert (x, y) == pytest.approx(((300 + 0.5) / W, (40 + 0.5) / H))
    assert g.point_to_pixel(x, y, (H, W)) == (40, 300)


@given(st.integers(0, H - 1), st.integers(0, W - 1))
def test_every_pixel_round_trips(row, col):
    assert g.point_to_pixel(*g.pixel_to_point(row, col, (H, W)), (H, W)) == (row, col)


def test_point_outside_image_is_refused():
    for x, y in [(-0.01, 0.5), (0.5, 1.01), (float("nan"), 0.2)]:
        with pytest.raises(g.GeometryError):
            g.point_to_pixel(x, y, (H, W))


def test_client_index_is_column_then_row():
    # Slicer/OHIF send [i, j, k] on the (W, H, 1) array MONAI's readers give: i is the column.
    image_whk = np.zeros((W, H, 1))
    image_whk[300, 40, 0] = 1  # column 300, row 40
    i, j, k = np.argwhere(image_whk)[0]
    x, y = g.client_index_to_point([i, j, k], (H, W))
    assert g.point_to_pixel(x, y, (H, W)) == (40, 300)
    assert g.point_to_client_index(x, y, (H, W)) == [300, 40, 0]


@pytest.mark.parametrize("index", [[W, 5, 0], [5, H, 0], [-1, 5, 0], [5, 5, 1], [5], [1, 2, 3, 4], [float("inf"), 1]])
def test_bad_client_clicks_are_refused(index):
    with pytest.raises(g.GeometryError):
        g.client_index_to_point(index, (H, W))


def test_mask_box_round_trip_on_asymmetric_image():
    mask = np.zeros((H, W), bool)
    mask[10:50, 200:310] = True  # rows 10..49, cols 200..309
    box = g.mask_to_box(mask)
    assert box == pytest.approx((200 / W, 10 / H, 310 / W, 50 / H))
    assert np.array_equal(g.box_to_mask(box, (H, W)), mask)
    assert g.box_to_pixels(box, (H, W)) == pytest.approx([200, 10, 310, 50])
    assert g.pixels_to_box([200, 10, 310, 50], (H, W)) == pytest.approx(box)
    assert g.mask_to_box(np.zeros((H, W), bool)) is None


def test_sam_scaling_is_per_axis():
    # A pixel-space box of the original image scales by 1008/W in x and 1008/H in y.
    box = g.pixels_to_box([32, 64, 160, 128], (H, W))
    assert g.box_to_sam(box) == pytest.approx([32 * 1008 / W, 64 * 1008 / H, 160 * 1008 / W, 128 * 1008 / H])
    assert g.point_to_sam(0.5, 0.25) == pytest.approx([504, 252])


def test_text_coordinates():
    assert g.to_text(0.1234) == 123
    assert g.to_text(1.7) == 1000 and g.to_text(-0.2) == 0
    assert g.box_from_text(g.box_to_text((0.1, 0.2, 0.3, 0.4))) == pytest.approx((0.1, 0.2, 0.3, 0.4))


def test_make_box_orders_and_clips():
    assert g.make_box(0.9, 1.2, 0.1, -0.1) == (0.1, 0.0, 0.9, 1.0)


def test_box_iou():
    assert g.box_iou((0, 0, 0.5, 0.5), (0, 0, 0.5, 0.5)) == pytest.approx(1)
    assert g.box_iou((0, 0, 0.5, 0.5), (0.25, 0, 0.75, 0.5)) == pytest.approx(1 / 3)
    assert g.box_iou((0, 0, 0.1, 0.1), (0.5, 0.5, 0.6, 0.6)) == 0


def test_box_growth_rule():
    box = (0.2, 0.2, 0.4, 0.4)
    assert g.grow_box(box, g.Click(True, 0.6, 0.1)) == (0.2, 0.1, 0.6, 0.4)  # outside: enclose
    assert g.grow_box(box, g.Click(True, 0.3, 0.3)) == box  # inside: unchanged
    assert g.grow_box(box, g.Click(False, 0.9, 0.9)) == box  # negative: unchanged


def test_check_image_is_the_one_image_rule_and_a_checked_image_passes_at_once():
    raw = np.linspace(0, 1, H * W, dtype=np.float32).reshape(H, W)
    checked = g.check_image(raw)
    assert checked.dtype == np.float32 and checked.shape == (H, W) and not checked.flags.writeable
    assert g.is_checked(checked) and not g.is_checked(raw)
    assert g.check_image(checked) is checked  # validated once: inner layers get it back as is
    assert raw.flags.writeable  # the caller's array is untouched
    assert g.check_image(raw.astype(np.float64)).dtype == np.float32
    assert g.check_image(np.zeros((4, 5, 3)), rgb=True).shape == (4, 5, 3)
    assert g.check_image(np.zeros((4, 5, 1)), rgb=True).shape == (4, 5)
    for bad, match in [
        (np.zeros((4, 5, 3)), "2-D"),
        (np.zeros((1, 5)), "too small"),
        (np.full((4, 5), np.nan), "NaN"),
        (np.full((4, 5), np.inf), "NaN or infinite"),
        (np.full((4, 5), -0.5), r"\[0, 1\]"),
        (np.zeros((4, 5), bool), "real-valued"),
    ]:
        with pytest.raises(g.GeometryError, match=match):
            g.check_image(bad)


def test_clicks_box_is_the_bounds_of_the_positive_clicks():
    from monailabel_xflow.geometry import Click, GeometryError, clicks_box

    assert clicks_box([Click(True, 0.5, 0.4)]) == pytest.approx((0.5, 0.4, 0.5, 0.4))
    box = clicks_box([Click(True, 0.5, 0.4), Click(False, 0.9, 0.9), Click(True, 0.3, 0.6)])
    assert box == pytest.approx((0.3, 0.4, 0.5, 0.6))
    assert clicks_box([Click(False, 0.9, 0.1), Click(False, 0.2, 0.3)]) == pytest.approx((0.2, 0.1, 0.9, 0.3))
    with pytest.raises(GeometryError, match="no click"):
        clicks_box([])


def test_components_touching_keeps_whole_components_by_any_pixel_in_the_anchor():
    mask = np.zeros((20, 20), bool)
    mask[2:6, 2:6] = True  # touched at one corner pixel
    mask[6, 6] = True  # diagonal neighbour: the same 8-connected component
    mask[12:16, 12:16] = True  # untouched
    anchor = np.zeros_like(mask)
    anchor[5, 5] = True
    anchor[0, 19] = True  # on background: selects nothing
    kept = g.components_touching(mask, anchor)
    assert kept[2:6, 2:6].all() and kept[6, 6] and not kept[12:16, 12:16].any()
    assert not g.components_touching(mask, np.zeros_like(mask)).any()
