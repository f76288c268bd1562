"""π_rev's on-policy training states (issue 35): the workflow's own Stage 1 boxes revised by the
oracle through the workflow's Stage 2 loop, stop-only where clicking does not pay."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.oracle import PAYS, OracleClicker
from monailabel_xflow.policy.protocol import BoxRef, Stage1Output, format_stage1
from monailabel_xflow.testing import ScriptedPolicy, ScriptedSegmenter, ellipse
from monailabel_xflow.training.builders import build, load_built, onpolicy_trajectories
from monailabel_xflow.workflow.xflow import XFlow

H, W = 128, 160
EDEMA = Instruction("edema", ("left lung",))
LESION = ellipse((H, W), 64, 80, 20, 40)
HALF = (40 / W, 44 / H, 80 / W, 84 / H)  # the left half of the lesion's box: clicks pay
WHOLE = (38 / W, 42 / H, 122 / W, 86 / H)  # the whole lesion: F_seg is already right, clicks cannot pay
ELSEWHERE = (0.05, 0.05, 0.15, 0.15)  # far from it (the nearest component is still its target)


def _stage1(boxes) -> str:
    lungs = [BoxRef("right lung", (0.1, 0.1, 0.45, 0.9)), BoxRef("left lung", (0.55, 0.1, 0.9, 0.9))]
    return format_stage1(Stage1Output(lungs, True, [BoxRef("edema", b) for b in boxes], ""))


def _flow(boxes, runs: int = 1) -> XFlow:
    return XFlow(ScriptedPolicy([_stage1(boxes)] * runs), None, ScriptedSegmenter(LESION, positive_radius_px=15))


def test_clicks_are_kept_where_they_pay_and_stop_only_where_they_do_not():
    image = np.random.default_rng(0).uniform(0, 1, (H, W)).astype(np.float32)
    case = EvalCase("c", "unused.png", EDEMA, True)
    got = onpolicy_trajectories(_flow([HALF, WHOLE]), image, case, LESION, OracleClicker())
    assert len(got) == 2
    (half, target), (whole, _) = got
    assert np.array_equal(target, LESION)
    # the half box: the oracle's clicks raised IoU by more than PAYS, so they are the trajectory
    assert half.initial_box == pytest.approx(HALF, abs=1e-3)
    assert half.steps and half.final_iou - half.initial_iou >= PAYS
    assert half.turns()[-1][1] is None and all(a is not None for _, a in half.turns()[:-1])
    # the whole box: stop at once on F_seg's own mask
    assert whole.steps == [] and whole.initial_iou > 0.9 and len(whole.turns()) == 1


def test_build_writes_sft_and_rl_rows_from_stage1_boxes(tmp_path):
    image = (np.random.default_rng(1).uniform(0, 1, (H, W)) * 255).astype(np.uint8)
    Image.fromarray(image).save(tmp_path / "i.png")
    Image.fromarray(LESION.astype(np.uint8) * 255).save(tmp_path / "m.png")
    case = EvalCase("q1", tmp_path / "i.png", EDEMA, True, mask_path=tmp_path / "m.png")
    negative = EvalCase("q2", tmp_path / "i.png", Instruction("edema", ("right lung",)), False)
    build("rev-sft", [case, negative], tmp_path / "sft", workflow=_flow([HALF, ELSEWHERE]), progress=False)
    rows = load_built(tmp_path / "sft")
    assert rows["case_id"] == ["q1_c0", "q1_c1"]
    assert [len(t) for t in rows["observations"]] == [len(t) for t in rows["targets"]]
    assert rows["targets"][0][0].startswith("<") and "click" in rows["targets"][0][0]  # the half box: a click
    assert rows["box"] == [pytest.approx(HALF, abs=1e-3), pytest.approx(ELSEWHERE, abs=1e-3)]
    for png in rows["observations"][0]:
        assert np.asarray(Image.open(png)).ndim == 3  # the overlay π_rev sees
    build("rev-rl", [case], tmp_path / "rl", workflow=_flow([HALF]), progress=False)
    rl = load_built(tmp_path / "rl")
    assert rl["start_box"] == [pytest.approx(HALF, abs=1e-3)]
    assert np.array_equal(np.asarray(Image.open(rl["gt_mask"][0])) > 127, LESION)


def test_a_higher_pays_threshold_teaches_stopping_where_clicks_gain_less(tmp_path):
    """``pays`` (recipe ``rev_pays``): the same half box whose clicks gain more than PAYS is
    stop-only once the threshold is above that gain; ``build`` passes it through."""
    image = np.random.default_rng(0).uniform(0, 1, (H, W)).astype(np.float32)
    case = EvalCase("c", "unused.png", EDEMA, True)
    ((half, _),) = onpolicy_trajectories(_flow([HALF]), image, case, LESION, OracleClicker())
    gain = half.final_iou - half.initial_iou
    ((strict, _),) = onpolicy_trajectories(_flow([HALF]), image, case, LESION, OracleClicker(), pays=gain + 0.01)
    assert half.steps and strict.steps == [] and len(strict.turns()) == 1
    pixels = (np.random.default_rng(1).uniform(0, 1, (H, W)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "i.png")
    Image.fromarray(LESION.astype(np.uint8) * 255).save(tmp_path / "m.png")
    stored = EvalCase("q1", tmp_path / "i.png", EDEMA, True, mask_path=tmp_path / "m.png")
    build("rev-sft", [stored], tmp_path / "sft", workflow=_flow([HALF]), progress=False, pays=1.0)
    assert [len(t) for t in load_built(tmp_path / "sft")["targets"]] == [1]  # stop at once
    assert "<stop/>" in load_built(tmp_path / "sft")["targets"][0][0]
