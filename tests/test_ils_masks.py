"""Algorithm 1 of MIMIC-ILS on hand-worked masks (monailabel_xflow/ils/masks.py).

The reference scene (20 x 20 pixels, x = column, y = row):

* right lung: rows 2..17, columns 1..8 (128 px); left lung: rows 2..17, columns 11..18 (128 px);
* reported location "right lung base": rows 14..17, columns 1..8 (32 px);
* box B = (x1, y1, x2, y2) = (1, 12, 9, 18): rows 12..17, columns 1..8 (48 px);
* anomaly: rows 13..16, columns 2..6 (20 px), all inside B.

So c1 = IoU(B, M) = 32/48 = 0.667, c3 = 20/48 = 0.417, c4 = IoU(B, right lung) = 48/128 = 0.375.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from monailabel_xflow.ils import masks as alg
from monailabel_xflow.ils.masks import Detection, RefineParams, Thresholds

N = 20


def rect(r0, r1, c0, c1, n=N):
    """Rows r0..r1 and columns c0..c1, inclusive."""
    m = np.zeros((n, n), bool)
    m[r0 : r1 + 1, c0 : c1 + 1] = True
    return m


RIGHT, LEFT = rect(2, 17, 1, 8), rect(2, 17, 11, 18)
BASE = rect(14, 17, 1, 8)
BOX = Detection((1.0, 12.0, 9.0, 18.0), 0.5)
BLOB = rect(13, 16, 2, 6)


def check(box=BOX, anomaly=BLOB, reported=BASE, finding="pneumonia", thresholds=alg.DEFAULT_THRESHOLDS):
    return alg.check_box(box.mask((N, N)), box.confidence, anomaly, reported, RIGHT, LEFT, finding, thresholds)


def test_table7_thresholds_and_the_halved_variant():
    t = alg.DEFAULT_THRESHOLDS
    assert (t.anomaly, t.anomaly_edema, t.anatomy, t.confidence, t.confidence_edema, t.signal, t.size) == (
        0.10,
        0.01,
        0.25,
        0.20,
        0.01,
        0.20,
        0.10,
    )
    h = alg.HIGH_RECALL_THRESHOLDS
    assert (h.anomaly, h.anomaly_edema, h.anatomy, h.confidence, h.confidence_edema, h.signal, h.size) == (
        0.05,
        0.005,
        0.125,
        0.10,
        0.005,
        0.10,
        0.05,
    )
    assert t.anomaly_for("edema") == 0.01 and t.anomaly_for("effusion") == 0.10
    assert t.confidence_for("edema") == 0.01 and t.confidence_for("atelectasis") == 0.20


def test_anomaly_image_and_map_thresholds_in_grey_levels():
    x_hat = np.full((2, 3), 100, np.uint8)
    x = np.array([[126, 125, 100], [103, 102, 90]], np.uint8)  # +26, +25, 0 / +3, +2, -10 levels
    x_ano = alg.anomaly_image(x, x_hat)
    assert x_ano[1, 2] == pytest.approx(-10 / 255)
    # tau_ano 0.10 of 255 = 25.5 levels: 26 is anomalous, 25 is not
    assert alg.anomaly_map(x_ano, 0.10).tolist() == [[True, False, False], [False, False, False]]
    # edema's 0.01 = 2.55 levels: 3 is anomalous, 2 is not
    assert alg.anomaly_map(x_ano, 0.01).tolist() == [[True, True, False], [True, False, False]]
    with pytest.raises(ValueError):
        alg.anomaly_image(x, x_hat[:, :2])


def test_reference_box_passes_all_four_with_the_worked_values():
    c = check()
    assert c.anatomy_iou == pytest.approx(32 / 48)
    assert c.signal == pytest.approx(20 / 48)
    assert c.lung_iou == pytest.approx(48 / 128)
    assert c.passed and c.failed() == []


def test_c1_fails_alone_when_the_box_is_not_in_the_reported_anatomy():
    c = check(reported=rect(2, 5, 1, 8))  # right apical zone: no overlap
    assert c.failed() == ["c1"]
    assert c.anatomy_iou == 0.0


def test_c2_fails_alone_below_the_confidence_threshold_but_not_for_edema():
    weak = Detection(BOX.box, 0.19)
    assert check(box=weak).failed() == ["c2"]
    assert check(box=Detection(BOX.box, 0.20)).passed  # >= : the threshold itself passes
    assert check(box=weak, finding="edema").passed  # edema: tau_conf 0.01
    assert check(box=Detection(BOX.box, 0.004), finding="edema").failed() == ["c2"]


def test_c3_fails_alone_with_too_little_anomaly_and_passes_halved():
    sparse = rect(13, 15, 2, 4)  # 9 px: 9/48 = 0.1875 < 0.20
    assert check(anomaly=sparse).failed() == ["c3"]
    assert check(anomaly=sparse, thresholds=alg.HIGH_RECALL_THRESHOLDS).passed  # >= 0.10


def test_c4_fails_alone_for_a_small_box_and_passes_halved():
    small = Detection((2.0, 13.0, 5.0, 17.0), 0.5)  # rows 13..16, columns 2..4: 12 px
    c = check(box=small)
    # c1: |B & M| = 3 x 3 = 9, union 12 + 32 - 9 = 35 -> 0.257; c3: 12/12; c4: 12/128 = 0.094
    assert c.anatomy_iou == pytest.approx(9 / 35)
    assert c.lung_iou == pytest.approx(12 / 128)
    assert c.failed() == ["c4"]
    assert check(box=small, thresholds=alg.HIGH_RECALL_THRESHOLDS).passed


def test_c4_takes_either_lung():
    right_only = check()
    assert right_only.c4
    box = Detection((11.0, 12.0, 19.0, 18.0), 0.5)  # the same box over the left lung
    c = alg.check_box(box.mask((N, N)), 0.5, np.zeros((N, N), bool), BASE, RIGHT, LEFT, "pneumonia")
    assert c.c4 and c.lung_iou == pytest.approx(48 / 128)
    assert c.failed() == ["c1", "c3"]


def test_components_touching_the_box_are_kept_whole_others_dropped():
    anomaly = np.zeros((N, N), bool)
    anomaly[10:14, 3:5] = True  # crosses the box's top edge (row 12): kept whole, rows 10..13
    anomaly[14, 5] = True  # diagonal neighbour of (13, 4): 8-connected, kept
    anomaly[3:5, 14:16] = True  # far away in the left lung: dropped
    got = alg.components_touching(anomaly, BOX.mask((N, N)))
    want = np.zeros((N, N), bool)
    want[10:14, 3:5] = True
    want[14, 5] = True
    assert np.array_equal(got, want)
    assert not alg.components_touching(anomaly, np.zeros((N, N), bool)).any()


def test_refine_opening_removes_a_thin_tail_and_a_speck():
    comp = rect(8, 12, 3, 7)  # 5 x 5 block
    comp[10, 8:12] = True  # a 1-px tail
    flat = np.zeros((N, N), np.uint8)  # no similar-intensity growth: nothing to grow into
    out = alg.refine(comp, flat, (np.zeros((N, N), bool),), "pneumonia")
    # a radius-1 disk is a cross: erosion leaves rows 9..11 x columns 4..7 (column 7 keeps its
    # tail neighbour), dilation rounds the block's corners and keeps one tail pixel (10, 8)
    want = rect(8, 12, 3, 7)
    for r, c in ((8, 3), (8, 7), (12, 3), (12, 7)):
        want[r, c] = False
    want[10, 8] = True
    assert np.array_equal(out, want)
    speck = np.zeros((N, N), bool)
    speck[5, 5] = True
    assert not alg.refine(speck, flat, (RIGHT,), "pneumonia").any()


def test_refine_grows_into_adjacent_similar_intensity_inside_the_lungs_only():
    image = np.full((N, N), 60, np.uint8)
    comp = rect(8, 12, 3, 6)
    image[comp] = 200
    image[8:13, 7] = 195  # similar (5 levels), adjacent, in the lung: grown
    image[8:13, 8] = 150  # dissimilar: not grown, and blocks the way on
    image[8:13, 0] = 205  # similar but outside the lungs (column 0): not grown
    image[8:13, 2] = 190  # similar (10 levels): grown
    params = RefineParams(open_radius=50, grow_radius=200, grow_tolerance=12)  # 1 px and 4 px at 20 px
    out = alg.refine(comp, image, (RIGHT, LEFT), "pneumonia", params)
    assert np.array_equal(out, rect(8, 12, 2, 7))


def test_effusion_is_extended_to_the_costophrenic_angle():
    comp = rect(12, 14, 3, 8)  # misses the lateral recess (columns 1, 2) and rows 15..17
    got = alg.extend_to_costophrenic_angle(comp, RIGHT)
    assert np.array_equal(got, rect(12, 17, 1, 8))
    # an upper-half mask does not pull the fill above the lung's middle row (9.5 -> row 10)
    high = rect(4, 6, 3, 8)
    assert np.array_equal(alg.extend_to_costophrenic_angle(high, RIGHT), high | rect(10, 17, 1, 8))
    # refine does it for effusion only; this component is open for the radius-1 disk (a cross),
    # so the opening keeps it: columns 3 and 8 start at row 13, as do the recess columns 1, 2
    rounded = comp.copy()
    for r, c in ((12, 3), (12, 8), (14, 3), (14, 8)):
        rounded[r, c] = False
    image = np.where(rounded, 200, 0).astype(np.uint8)  # no similar pixels to grow into
    params = RefineParams(open_radius=50, grow_radius=50, grow_tolerance=10)
    want = rect(12, 17, 4, 7) | rect(13, 17, 1, 3) | rect(13, 17, 8, 8)
    assert np.array_equal(alg.refine(rounded, image, (RIGHT, LEFT), "effusion", params), want)
    assert np.array_equal(alg.refine(rounded, image, (RIGHT, LEFT), "atelectasis", params), rounded)


def test_lesion_mask_unions_components_of_passing_boxes_only():
    x_hat = np.full((N, N), 80, np.uint8)
    x = x_hat.copy()
    x[13:17, 2:7] = 120  # BLOB, +40 levels: in A at tau 0.10
    x[3:6, 12:17] = 120  # a blob in the left upper lung
    x_ano = alg.anomaly_image(x, x_hat)
    far = Detection((11.0, 2.0, 19.0, 8.0), 0.9)  # around the upper-left blob: fails c1 (not the base)
    params = RefineParams(open_radius=50, grow_radius=50, grow_tolerance=0)
    res = alg.lesion_mask("atelectasis", x, x_ano, [BASE], [BOX, far], RIGHT, LEFT, refine_params=params)
    assert res.kept == [0]
    assert [c.failed() for c in res.checks] == [[], ["c1"]]
    assert np.array_equal(res.mask, BLOB)
    assert res.generated and res.why_not() == ""
    none = alg.lesion_mask("atelectasis", x, x_ano, [BASE], [far], RIGHT, LEFT, refine_params=params)
    assert not none.generated and none.why_not() == "no box passed c1-c4 (failures: c1 x1)"
    assert alg.lesion_mask("atelectasis", x, x_ano, [BASE], [], RIGHT, LEFT).why_not() == "no lesion box"


def test_edema_uses_its_own_anomaly_threshold():
    x_hat = np.full((N, N), 80, np.uint8)
    x = x_hat.copy()
    x[12:18, 1:9] = 84  # +4 levels: edema's 0.01 (2.55 levels) sees it, 0.10 does not
    x_ano = alg.anomaly_image(x, x_hat)
    params = RefineParams(open_radius=50, grow_radius=50, grow_tolerance=0)
    edema = alg.lesion_mask("edema", x, x_ano, [BASE], [BOX], RIGHT, LEFT, refine_params=params)
    assert np.array_equal(edema.mask, rect(12, 17, 1, 8))
    other = alg.lesion_mask("pneumonia", x, x_ano, [BASE], [BOX], RIGHT, LEFT, refine_params=params)
    assert not other.generated and other.checks[0].failed() == ["c3"]


def test_thresholds_are_a_frozen_value():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Thresholds().anomaly = 0.3  # type: ignore[misc]
