"""Metrics against values computed by hand on small masks (DESIGN §8)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from monailabel_xflow import metrics
from monailabel_xflow.metrics import MetricsError, SampleStats, level_average, sample_stats, summarize


def m(rows: str) -> np.ndarray:
    """Mask from a picture: '#' = lesion, '.' = background, rows separated by spaces."""
    return np.array([[c == "#" for c in row] for row in rows.split()], dtype=bool)


def test_iou_counts_by_hand():
    gt = m("##.. ##.. .... ....")
    pred = m(".#.. .##. .... ....")
    s = sample_stats(pred, gt)
    # intersection: (0,1),(1,1) = 2; union: gt 4 + pred 3 - 2 = 5
    assert (s.intersection, s.union, s.pred_area, s.gt_area, s.image_area) == (2, 5, 3, 4, 16)
    assert s.iou == pytest.approx(0.4)
    assert s.positive and s.predicted_positive


def test_empty_prediction_on_positive_scores_zero_and_is_a_miss():
    gt = m("##.. ##.. .... ....")
    s = sample_stats(np.zeros((4, 4), bool), gt)
    assert s.iou == 0.0 and s.union == 4 and not s.predicted_positive
    s_none = sample_stats(None, gt)
    assert s_none == s
    summary = summarize([s])
    assert summary["giou"] == 0.0 and summary["recall"] == 0.0 and summary["fn"] == 1
    assert math.isnan(summary["precision"])  # no positive calls at all
    assert summary["f1"] == 0.0


def test_one_stray_pixel_on_negative_fails_n_acc():
    stray = np.zeros((10, 10), bool)
    stray[9, 9] = True
    neg_hit = sample_stats(stray, None)
    neg_ok = sample_stats(np.zeros((10, 10), bool), np.zeros((10, 10), bool))
    assert not neg_hit.positive and neg_hit.predicted_positive
    summary = summarize([neg_hit, neg_ok])
    assert summary["n_acc"] == 0.5
    assert summary["fp"] == 1 and summary["tn"] == 1
    assert math.isnan(summary["giou"]) and math.isnan(summary["ciou"])  # no positives
    # ROSALIA's all-samples gIoU: stray pixel on empty GT = 0, empty on empty = 1
    assert summary["giou_all"] == 0.5


def test_summary_giou_ciou_f1_by_hand():
    gt1, pred1 = m("##.. ##.. .... ...."), m(".#.. .##. .... ....")  # I=2, U=5
    gt2, pred2 = m("#... .... .... ...."), m("#### #### #### ####")  # I=1, U=16
    neg_fp = sample_stats(m("...# .... .... ...."), None)
    neg_tn = sample_stats(None, m(".... .... .... ...."))
    s = [sample_stats(pred1, gt1), sample_stats(pred2, gt2), neg_fp, neg_tn]
    out = summarize(s)
    assert out["giou"] == pytest.approx((0.4 + 1 / 16) / 2)
    assert out["ciou"] == pytest.approx(3 / 21)
    assert (out["tp"], out["fp"], out["fn"], out["tn"]) == (2, 1, 0, 1)
    assert out["precision"] == pytest.approx(2 / 3)
    assert out["recall"] == 1.0
    assert out["f1"] == pytest.approx(2 * 2 / (2 * 2 + 1))
    assert out["n_acc"] == 0.5
    assert out["giou_all"] == pytest.approx((0.4 + 1 / 16 + 0 + 1) / 4)


def test_connectivity_diagonal_touch():
    diag = m("#... .#.. ..#. ....")
    assert sample_stats(diag, None).pred_components == 1  # 8-connectivity (default)
    assert sample_stats(diag, None, connectivity=4).pred_components == 3
    assert metrics.CONNECTIVITY == 8
    with pytest.raises(MetricsError):
        sample_stats(diag, None, connectivity=6)


def test_touching_components_merge_and_delta_c():
    gt = m("##...... ##...... ........ ........")
    # two blocks sharing an edge are one component; a separate pair is another
    pred = m("###..... ###..... ......## ......##")
    s = sample_stats(pred, gt)
    assert (s.pred_components, s.gt_components, s.delta_components) == (2, 1, 1)


def test_specks_outside_gt_and_area_share():
    # 100 x 100 image: speck threshold = 0.1 % of 10,000 = 10 pixels (strictly fewer is a speck)
    gt = np.zeros((100, 100), bool)
    gt[10:30, 10:30] = True
    pred = gt.copy()
    pred[50:53, 50:53] = True  # 9 px speck, outside GT
    pred[80:82, 80:85] = True  # 10 px: not a speck (not < 10)
    pred[29:31, 40:42] = True  # 4 px, not overlapping GT (GT ends at col 29) -> outside
    pred[5, 5] = True  # 1 px outside
    pred[30, 30] = True  # touches GT diagonally only -> joins the GT blob (8-connectivity)
    s = sample_stats(pred, gt)
    assert s.pred_components == 5  # blob(+corner pixel), 9px, 10px, 4px, 1px
    assert s.gt_components == 1 and s.delta_components == 4
    assert s.pred_specks == 3  # 9, 4, 1
    assert s.pred_specks_outside_gt == 3
    assert s.pred_speck_area == 14
    # a speck overlapping GT is not "outside"
    gt2 = gt.copy()
    gt2[5, 5] = True
    s2 = sample_stats(pred, gt2)
    assert s2.pred_specks_outside_gt == 2 and s2.gt_specks == 1 and s2.gt_speck_area == 1
    noise = summarize([s])["noise"]
    assert noise["delta_c"] == 4
    assert noise["speck_area_pct"] == pytest.approx(100 * 14 / s.pred_area)


def test_level_average_is_equal_weight_not_pooled():
    big = [sample_stats(np.zeros((4, 4), bool), None) for _ in range(9)]  # 9 correct negatives
    pos_good = sample_stats(m("#... .... .... ...."), m("#... .... .... ...."))
    pos_bad = sample_stats(m("...# .... .... ...."), m("#... .... .... ...."))
    per_level = {
        "chest": summarize([pos_good]),
        "lung": summarize([pos_bad] + big),
        "zone": summarize([pos_good, pos_bad]),
    }
    avg = level_average(per_level)
    assert avg["giou"] == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    # N-Acc is undefined at chest and zone (no negatives) -> averaged over the lung level only
    assert avg["n_acc"] == 1.0
    assert avg["levels_used"] == ["chest", "lung", "zone"]
    pooled = summarize([pos_good, pos_bad, *big, pos_good, pos_bad])
    assert pooled["giou"] == pytest.approx(0.5)  # differs from the equal-weight average


def test_shape_mismatch_and_bad_input():
    with pytest.raises(MetricsError, match="differ in shape"):
        sample_stats(np.zeros((4, 4)), np.zeros((4, 5)))
    with pytest.raises(MetricsError):
        sample_stats(None, None)
    with pytest.raises(MetricsError, match="2-D"):
        sample_stats(np.zeros((2, 2, 2)), None)


def test_stats_round_trip_and_non_bool_input():
    s = sample_stats(np.array([[0, 255], [255, 0]], np.uint8), np.array([[0, 1], [0, 0]]))
    assert s.pred_area == 2 and s.intersection == 1
    assert SampleStats.from_dict(s.to_dict()) == s


def test_crop_matches_uncropped_reference():
    rng = np.random.default_rng(0)
    for _ in range(20):
        gt = np.zeros((64, 48), bool)
        pred = np.zeros((64, 48), bool)
        gt[rng.integers(0, 40) :][:10, 5:20] = True
        pred[rng.random((64, 48)) < 0.02] = True
        pred[20:40, 10:30] |= rng.random((20, 20)) < 0.7
        s = sample_stats(pred, gt)
        assert s.intersection == np.count_nonzero(pred & gt)
        assert s.union == np.count_nonzero(pred | gt)
        from scipy import ndimage

        _, n = ndimage.label(pred, structure=np.ones((3, 3)))
        assert s.pred_components == n
