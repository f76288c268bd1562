"""Rewards of the RL phases, checked against values worked out by hand."""

import numpy as np
import pytest

from monailabel_xflow.geometry import Click
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.protocol import BoxRef, Stage1Output, Stage2Action, format_stage1, format_stage2
from monailabel_xflow.training.rewards import init_reward, matched_box_iou, revision_reward

A = (0.1, 0.1, 0.3, 0.3)
B = (0.6, 0.6, 0.8, 0.8)
A_SHIFT = (0.2, 0.1, 0.4, 0.3)  # IoU with A: 0.02 / 0.06 = 1/3


def _present(*boxes):
    return format_stage1(Stage1Output([], True, [BoxRef("edema", b) for b in boxes]))


def test_matching_is_one_to_one_and_order_free():
    assert matched_box_iou([B, A], [A, B]) == pytest.approx(1.0)
    assert matched_box_iou([A], [A, B]) == pytest.approx(0.5)  # one GT box missed
    assert matched_box_iou([A, A_SHIFT], [A]) == pytest.approx(0.5)  # extra box counts as 0
    assert matched_box_iou([A_SHIFT], [A]) == pytest.approx(1 / 3)
    assert matched_box_iou([], [A]) == 0.0


def test_positive_case():
    r = init_reward(_present(A_SHIFT, B), [A, B])
    assert r["box"] == pytest.approx((1 / 3 + 1) / 2)
    assert r["format"] == 1.0 and r["rep"] == 0.0
    assert r["total"] == pytest.approx(r["box"] + 1.0)


def test_absent_on_positive_case_scores_no_box_reward():
    r = init_reward(format_stage1(Stage1Output([], False, [])), [A])
    assert r["box"] == 0.0 and r["format"] == 1.0


def test_negative_case_is_binary():
    assert init_reward(format_stage1(Stage1Output([], False, [])), [])["box"] == 1.0
    assert init_reward(_present(A), [])["box"] == 0.0


def test_repetition_is_penalised_but_keeps_format():
    text = _present(A) + "\n<ref>edema</ref><|box_start|>(100,100),(300,300)<|box_end|>"
    r = init_reward(text, [A])
    assert r["rep"] == pytest.approx(-0.5)
    assert r["format"] == 1.0
    assert r["box"] == pytest.approx(1.0)


def test_malformed_text_loses_format_reward():
    r = init_reward("<answer>present</answer> edema somewhere", [A])
    assert r["format"] == 0.0 and r["box"] == 0.0


def test_revision_gain_and_format():
    gt = np.zeros((10, 10), bool)
    gt[2:8, 2:8] = True  # 36 px
    m0 = np.zeros_like(gt)
    m0[2:8, 2:5] = True  # 18 px -> IoU 0.5
    m1 = gt.copy()  # IoU 1
    turns = [format_stage2(Stage2Action(Click(True, 0.6, 0.5))), format_stage2(Stage2Action(None))]
    r = revision_reward(turns, m0, m1, gt)
    assert r["gain"] == pytest.approx(0.5) and r["format"] == 1.0 and r["total"] == pytest.approx(1.5)
    r = revision_reward(turns + ["garbage"], m1, m0, gt)
    assert r["gain"] == pytest.approx(-0.5) and r["format"] == 0.0


def test_mask_iou_empty_on_empty_is_one():
    e = np.zeros((4, 4), bool)
    assert mask_iou(e, e) == 1.0
