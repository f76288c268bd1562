"""Tests of the simulated user (Algorithm 1, DESIGN §7) against test doubles and synthetic shapes.

Expected clicks are recomputed here independently: a full-image EDT of the zero-padded region
(scipy), exclusion discs applied by brute force, first maximum in row-major order.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.ndimage import distance_transform_edt

from monailabel_xflow.geometry import Click, connected_components, grow_box, mask_to_box, point_to_pixel
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.oracle import OracleClicker, OracleError, Trajectory, perturb_box
from monailabel_xflow.testing import ScriptedSegmenter, SequenceSegmenter, disk, ellipse
from monailabel_xflow.workflow.revision import oracle_trajectory, simulate_trajectories

S = 256
SHAPE = (S, S)


def expected_click(mask, gt, previous=(), radius=25.0):
    """Independent Algorithm 1 click: padded EDTs, same-polarity discs zeroed, ``>=`` to positive."""
    rr, cc = np.indices(gt.shape)

    def depth(region, polarity):
        d = distance_transform_edt(np.pad(region, 1))[1:-1, 1:-1]
        for c in previous:
            if c.positive == polarity:
                r0, c0 = point_to_pixel(c.x, c.y, gt.shape)
                d[np.hypot(rr - r0, cc - c0) < radius] = 0.0
        return d

    d_miss, d_over = depth(gt & ~mask, True), depth(mask & ~gt, False)
    if d_miss.max() == 0 and d_over.max() == 0:
        return None
    positive = bool(d_miss.max() >= d_over.max())
    d = d_miss if positive else d_over
    r, c = np.unravel_index(np.argmax(d), d.shape)
    return Click(positive, (c + 0.5) / gt.shape[1], (r + 0.5) / gt.shape[0])


def pixel_distance(a: Click, b: Click, shape=SHAPE) -> float:
    return float(np.hypot(*np.subtract(point_to_pixel(a.x, a.y, shape), point_to_pixel(b.x, b.y, shape))))


# --- one click ------------------------------------------------------------------------------


def test_positive_click_at_deepest_missed_pixel():
    gt = ellipse(SHAPE, 120, 140, 50, 70)
    mask = gt & (np.arange(S)[None, :] < 120)  # left part found, right part missed
    click = OracleClicker().next_click(mask, gt)
    assert click == expected_click(mask, gt)
    assert click.positive
    row, col = point_to_pixel(click.x, click.y, SHAPE)
    assert gt[row, col] and not mask[row, col]


def test_negative_click_at_deepest_over_segmented_pixel():
    gt = disk(SHAPE, 128, 128, 40)
    mask = gt | ellipse(SHAPE, 60, 60, 30, 45)  # a large false positive
    mask[128, 128] = False  # a 1-px miss: depth 1, far less than the blob's
    click = OracleClicker().next_click(mask, gt)
    assert click == expected_click(mask, gt)
    assert not click.positive
    row, col = point_to_pixel(click.x, click.y, SHAPE)
    assert mask[row, col] and not gt[row, col]


def test_equal_depths_click_positive():
    gt = np.zeros(SHAPE, bool)
    mask = np.zeros(SHAPE, bool)
    gt[40:80, 40:80] = True  # missed square
    mask[140:180, 140:180] = True  # over-segmented square of the same size
    click = OracleClicker().next_click(mask, gt)
    assert click.positive
    assert click == expected_click(mask, gt)


def test_image_border_counts_as_region_boundary():
    gt = np.zeros(SHAPE, bool)
    gt[60:200, :30] = True  # a missed strip along the left image edge
    mask = np.zeros(SHAPE, bool)
    click = OracleClicker().next_click(mask, gt)
    row, col = point_to_pixel(click.x, click.y, SHAPE)
    unpadded = distance_transform_edt(gt)
    assert click == expected_click(mask, gt)
    assert 10 <= col <= 20  # middle of the strip, not its image-border column
    assert np.argmax(unpadded) % S == 0  # without padding the deepest pixel sits on the border


def test_same_polarity_guard_moves_click_to_next_best_admissible_pixel():
    gt = ellipse(SHAPE, 128, 128, 60, 90)
    mask = np.zeros(SHAPE, bool)
    oracle = OracleClicker()
    first = oracle.next_click(mask, gt)
    second = oracle.next_click(mask, gt, [first])
    assert second.positive
    assert pixel_distance(first, second) >= 25
    assert second == expected_click(mask, gt, [first])
    # a negative click at the same spot does not exclude positives
    assert oracle.next_click(mask, gt, [Click(False, first.x, first.y)]) == first
    # the radius is configurable
    near = OracleClicker(min_click_distance_px=3).next_click(mask, gt, [first])
    assert 3 <= pixel_distance(first, near) < 25


def test_guard_can_switch_polarity_or_stop():
    gt = disk(SHAPE, 128, 128, 12)  # fully missed, every pixel within 25 px of its centre
    mask = disk(SHAPE, 40, 40, 5)  # small over-segmentation
    oracle = OracleClicker()
    first = oracle.next_click(mask, gt)
    assert first.positive
    second = oracle.next_click(mask, gt, [first])
    assert not second.positive and second == expected_click(mask, gt, [first])
    assert oracle.next_click(mask, gt, [first, second]) is None
    assert oracle.decide(mask, gt, [first, second]) == (None, "no-click")


def test_decide_stops_on_tau_then_budget():
    gt = disk(SHAPE, 128, 128, 40)
    good = disk(SHAPE, 128, 131, 40)
    bad = disk(SHAPE, 128, 128, 20)
    assert mask_iou(good, gt) >= 0.7 > mask_iou(bad, gt)
    oracle = OracleClicker()
    clicks4 = [Click(True, 0.1 * i, 0.1) for i in range(1, 5)]
    assert oracle.decide(good, gt) == (None, "tau")
    assert oracle.decide(good, gt, clicks4) == (None, "tau")
    assert oracle.decide(bad, gt, clicks4) == (None, "T")
    click, reason = oracle.decide(bad, gt, clicks4[:3])
    assert reason is None and click == expected_click(bad, gt, clicks4[:3])


def test_bad_input_raises_oracle_error():
    oracle = OracleClicker()
    with pytest.raises(OracleError, match="2-D"):
        oracle.next_click(np.zeros((4, 4, 3)), np.zeros((4, 4)))
    with pytest.raises(OracleError, match="shape"):
        oracle.next_click(np.zeros((4, 4)), np.zeros((4, 5)))
    with pytest.raises(OracleError, match="empty"):
        oracle_trajectory(ScriptedSegmenter(np.zeros(SHAPE)), np.zeros(SHAPE, bool), oracle)
    with pytest.raises(OracleError, match="noise"):
        OracleClicker(box_noise=0.5)
    with pytest.raises(OracleError, match="tau"):
        OracleClicker(tau=0)


# --- box perturbation -----------------------------------------------------------------------


def test_perturb_box_moves_each_edge_within_fraction_of_side():
    box = (0.2, 0.3, 0.6, 0.5)
    w, h = 0.4, 0.2
    rng = np.random.default_rng(0)
    boxes = np.array([perturb_box(box, SHAPE, rng, noise=0.1) for _ in range(500)])
    moves = np.abs(boxes - np.array(box)) / np.array([w, h, w, h])
    assert moves.max() <= 0.1 + 1e-12
    assert moves.max() > 0.09  # the whole range is used
    assert perturb_box(box, SHAPE, rng, noise=0.0) == box


def test_perturb_box_is_clipped_and_never_degenerate():
    rng = np.random.default_rng(1)
    for _ in range(200):
        x1, y1, x2, y2 = perturb_box((0.0, 0.9, 0.05, 1.0), SHAPE, rng, noise=0.45, shift=1.0)
        assert 0.0 <= x1 < x2 <= 1.0 and 0.0 <= y1 < y2 <= 1.0
        assert x2 - x1 >= 1 / S - 1e-12 and y2 - y1 >= 1 / S - 1e-12


# --- whole trajectories ---------------------------------------------------------------------


def _scene():
    """GT lesion and a hidden object that overlaps it imperfectly (misses a lobe, adds a blob)."""
    gt = ellipse(SHAPE, 120, 130, 45, 70) | disk(SHAPE, 170, 190, 25)
    obj = ellipse(SHAPE, 115, 125, 45, 65) | disk(SHAPE, 60, 60, 30)
    return gt, obj


def test_doubles_implement_the_segmenter_protocol():
    from monailabel_xflow.segmenter.base import PromptableSegmenter
    from monailabel_xflow.testing import RecordingSegmenter

    double = ScriptedSegmenter(np.zeros(SHAPE))
    assert isinstance(double, PromptableSegmenter)
    assert isinstance(SequenceSegmenter([np.zeros(SHAPE)]), PromptableSegmenter)
    assert isinstance(RecordingSegmenter(double), PromptableSegmenter)
    with pytest.raises(RuntimeError, match="set_image"):
        double.predict([(0.1, 0.1, 0.5, 0.5)])


def test_trajectory_follows_algorithm_1_call_by_call():
    gt, obj = _scene()
    oracle = OracleClicker(box_noise=0.3)
    n_clicked = 0
    for seed in range(12):
        seg = ScriptedSegmenter(obj)
        seg.set_image(np.zeros(SHAPE))
        traj = oracle_trajectory(seg, gt, oracle, seed)
        calls = seg.calls
        assert len(calls) == len(traj.steps) + 1 <= 5
        # M_0 from the perturbed box alone
        assert calls[0].boxes == [traj.initial_box] and calls[0].clicks is None and calls[0].previous is None
        assert np.array_equal(traj.initial_mask, calls[0].result.masks[0])
        box, mask, clicks = traj.initial_box, traj.initial_mask, []
        for t, step in enumerate(traj.steps, start=1):
            assert mask_iou(mask, gt) < 0.7
            assert step.click == expected_click(mask, gt, clicks)
            clicks.append(step.click)
            box = grow_box(box, step.click)
            assert step.box == box and calls[t].boxes == [box]
            assert calls[t].clicks == [clicks]  # every click so far
            np.testing.assert_array_equal(calls[t].previous, calls[t - 1].result.low_res_logits)
            assert np.array_equal(step.mask, calls[t].result.masks[0])
            assert step.iou == pytest.approx(mask_iou(step.mask, gt))
            mask = step.mask
        if traj.stop_reason == "tau":
            assert traj.final_iou >= 0.7
        else:
            assert traj.stop_reason == "T" and len(traj.steps) == 4 and traj.final_iou < 0.7
        n_clicked += bool(traj.steps)
    assert n_clicked >= 6  # the scene does need clicks


def test_same_polarity_clicks_keep_25_px_apart_over_many_trajectories():
    gt, obj = _scene()
    # small click discs: many clicks are needed, so the guard is exercised
    oracle = OracleClicker(box_noise=0.3, tau=0.95)
    pairs = 0
    for seed in range(10):
        seg = ScriptedSegmenter(obj, positive_radius_px=6, negative_radius_px=6)
        for traj in simulate_trajectories(seg, np.zeros(SHAPE), gt, oracle, seed=seed, keep_discarded=True):
            for i, a in enumerate(traj.clicks):
                for b in traj.clicks[:i]:
                    if a.positive == b.positive:
                        pairs += 1
                        assert pixel_distance(a, b) >= 25
    assert pairs > 10


def test_positive_click_outside_box_grows_it():
    gt = ellipse(SHAPE, 128, 128, 50, 90)
    oracle = OracleClicker(box_noise=0.45)
    grown = 0
    for seed in range(20):
        seg = ScriptedSegmenter(gt, positive_radius_px=15)
        seg.set_image(np.zeros(SHAPE))
        traj = oracle_trajectory(seg, gt, oracle, seed)
        box = traj.initial_box
        for step in traj.steps:
            c = step.click
            outside = not (box[0] <= c.x <= box[2] and box[1] <= c.y <= box[3])
            if c.positive and outside:
                grown += 1
                assert step.box != box
                assert step.box[0] <= c.x <= step.box[2] and step.box[1] <= c.y <= step.box[3]
                assert step.box[0] <= box[0] and step.box[2] >= box[2]
            else:
                assert step.box == box
            box = step.box
    assert grown > 0


def test_trajectory_that_does_not_improve_is_flagged_and_dropped():
    gt = disk(SHAPE, 128, 128, 30)
    # a positive click floods 120 px around itself: clicking only makes things worse
    oracle = OracleClicker(box_noise=0.45)
    seeds_with_clicks = []
    for seed in range(10):
        seg = ScriptedSegmenter(gt, positive_radius_px=120, negative_radius_px=5)
        kept = simulate_trajectories(seg, np.zeros(SHAPE), gt, oracle, seed=seed)
        seg = ScriptedSegmenter(gt, positive_radius_px=120, negative_radius_px=5)
        (traj,) = simulate_trajectories(seg, np.zeros(SHAPE), gt, oracle, seed=seed, keep_discarded=True)
        if traj.steps:
            seeds_with_clicks.append(seed)
            assert traj.final_iou <= traj.initial_iou
            assert traj.discarded and "without improving" in traj.discard_reason
            assert kept == []
        else:
            assert not traj.discarded and len(kept) == 1
    assert seeds_with_clicks


def test_every_click_rule_discards_a_dip():
    gt = np.zeros(SHAPE, bool)
    gt[28:228, 28:228] = True

    def part(rows):  # gt restricted to its first `rows` rows: IoU = rows / 200
        m = np.zeros(SHAPE, bool)
        m[28 : 28 + rows, 28:228] = True
        return m

    masks = [part(60), part(40), part(100), part(120), part(130)]  # IoU .30 .20 .50 .60 .65
    for rule, discarded in (("net", False), ("every-click", True)):
        seg = SequenceSegmenter(masks, reference=gt)
        traj = oracle_trajectory(seg, gt, OracleClicker(discard_rule=rule), 0)
        assert traj.ious == pytest.approx([0.3, 0.2, 0.5, 0.6, 0.65])
        assert traj.stop_reason == "T" and traj.discarded is discarded
    assert "click 1" in traj.discard_reason


def test_no_click_needed_is_kept_and_stops_on_tau():
    gt = disk(SHAPE, 128, 128, 40)
    seg = ScriptedSegmenter(gt)
    (traj,) = simulate_trajectories(seg, np.zeros(SHAPE), gt, OracleClicker(box_noise=0.0))
    assert traj.steps == [] and traj.stop_reason == "tau" and not traj.discarded
    assert traj.initial_iou == pytest.approx(1.0)
    ((mask, action),) = traj.turns()
    assert action is None and mask is traj.initial_mask


def test_turns_pair_each_observation_with_its_action():
    gt, obj = _scene()
    seg = ScriptedSegmenter(obj)
    trajs = simulate_trajectories(seg, np.zeros(SHAPE), gt, OracleClicker(box_noise=0.3), seed=3, keep_discarded=True)
    traj = max(trajs, key=lambda t: len(t.steps))
    assert traj.steps
    turns = traj.turns()
    assert [a for _, a in turns] == traj.clicks + [None]
    assert all(m is n for (m, _), n in zip(turns, traj.masks, strict=False))


def test_determinism_by_seed():
    gt, obj = _scene()
    oracle = OracleClicker(box_noise=0.3)

    def run(seed):
        return [
            t.to_dict()
            for t in simulate_trajectories(
                ScriptedSegmenter(obj), np.zeros(SHAPE), gt, oracle, seed=seed, keep_discarded=True
            )
        ]

    assert run(7) == run(7)
    assert run(7) != run(8)


# --- components and serialisation -----------------------------------------------------------


def test_components_are_8_connected_and_each_gets_a_trajectory():
    gt = np.zeros(SHAPE, bool)
    gt[20:60, 20:60] = True
    gt[60:100, 60:100] = True  # touches the first square only at a corner: same component
    gt[150:200, 150:210] = True
    gt[250, 5] = True  # a 1-px speck
    comps = connected_components(gt)
    assert len(comps) == 3
    # ordered by first pixel in row-major order
    assert comps[0][20, 20] and comps[0][99, 99] and comps[1][150, 150] and comps[2][250, 5]
    assert len(connected_components(gt, min_area_px=2)) == 2
    assert np.array_equal(np.logical_or.reduce(comps), gt)

    seg = ScriptedSegmenter(gt)
    trajs = simulate_trajectories(seg, np.zeros(SHAPE), gt, OracleClicker(), seed=0, min_area_px=2, keep_discarded=True)
    assert [t.component_id for t in trajs] == [0, 1]
    assert seg.set_image_calls == 1  # the image is encoded once for all components
    assert trajs[1].gt_box == mask_to_box(comps[1])
    # components are revised independently: dropping the speck changes no other trajectory
    with_speck = simulate_trajectories(
        ScriptedSegmenter(gt), np.zeros(SHAPE), gt, OracleClicker(), seed=0, keep_discarded=True
    )
    assert len(with_speck) == 3
    assert [t.to_dict() for t in with_speck[:2]] == [t.to_dict() for t in trajs]


def test_to_dict_round_trip_through_json():
    gt, obj = _scene()
    trajs = simulate_trajectories(
        ScriptedSegmenter(obj), np.zeros(SHAPE), gt, OracleClicker(box_noise=0.3), seed=3, keep_discarded=True
    )
    traj = max(trajs, key=lambda t: len(t.steps))
    data = json.loads(json.dumps(traj.to_dict()))
    assert isinstance(data["initial_mask"]["counts"], str)  # COCO compressed RLE
    back = Trajectory.from_dict(data)
    assert back.to_dict() == traj.to_dict()
    assert back.clicks == traj.clicks and back.stop_reason == traj.stop_reason
    for a, b in zip(back.masks, traj.masks, strict=True):
        assert a.dtype == bool and np.array_equal(a, b)
    with pytest.raises(OracleError, match="malformed"):
        Trajectory.from_dict({k: v for k, v in data.items() if k != "steps"})
    with pytest.raises(OracleError, match="stop_reason"):
        Trajectory.from_dict({**data, "stop_reason": "bored"})
    with pytest.raises(OracleError, match="malformed"):
        Trajectory.from_dict({**data, "initial_mask": {"size": [3, 3], "counts": [1]}})


# --- phantom lesions ------------------------------------------------------------------------


def test_phantom_lesion_trajectories():
    from monailabel_xflow.data.phantom import generate_phantom

    ph = generate_phantom(5, size=S, findings=("pneumonia", "effusion"))
    oracle = OracleClicker(box_noise=0.2)
    n_steps = 0
    for k, finding in enumerate(ph.findings):
        gt = ph.finding_mask(finding)
        hidden = np.roll(gt, (8, -8), axis=(0, 1)) | disk(SHAPE, 40, 128, 12)
        seg = ScriptedSegmenter(hidden, positive_radius_px=10, negative_radius_px=10)
        trajs = simulate_trajectories(seg, ph.image, gt, oracle, seed=k, min_area_px=20, keep_discarded=True)
        comps = connected_components(gt, min_area_px=20)
        assert len(trajs) == len(comps) >= 1 and seg.set_image_calls == 1
        for traj in trajs:
            g = comps[traj.component_id]
            mask, clicks = traj.initial_mask, []
            for step in traj.steps:
                assert step.click == expected_click(mask, g, clicks)
                clicks.append(step.click)
                mask = step.mask
            assert len(traj.steps) <= 4
            if traj.stop_reason == "no-click":
                assert expected_click(mask, g, clicks) is None
            assert traj.discarded == (bool(traj.steps) and traj.gain <= 0)
            n_steps += len(traj.steps)
    assert n_steps > 0


# --- the tiny random SAM3 through the real loading path --------------------------------------


@pytest.fixture(scope="module")
def loaded_sam3(tiny_sam3):
    from monailabel_xflow.segmenter.loading import load_segmenter

    return load_segmenter(tiny_sam3, device="cpu")


def test_trajectories_with_tiny_sam3(loaded_sam3):
    from monailabel_xflow.data.phantom import generate_phantom
    from monailabel_xflow.testing import RecordingSegmenter

    ph = generate_phantom(2, size=S, findings=("consolidation",))
    gt = ph.finding_mask("consolidation")
    seg = RecordingSegmenter(loaded_sam3)
    oracle = OracleClicker(tau=0.99)  # random weights: ask for clicks whatever the mask
    trajs = simulate_trajectories(seg, ph.image, gt, oracle, seed=0, min_area_px=20, keep_discarded=True)
    assert trajs and seg.set_image_calls == 1
    assert any(t.steps for t in trajs)
    assert seg.predict_calls == sum(len(t.steps) + 1 for t in trajs)
    calls = iter(seg.calls)
    comps = connected_components(gt, min_area_px=20)
    for traj in trajs:
        first = next(calls)
        assert first.previous is None and first.clicks is None and first.boxes == [traj.initial_box]
        assert traj.initial_mask.shape == SHAPE
        prev, mask, clicks, box = first, traj.initial_mask, [], traj.initial_box
        for step in traj.steps:
            call = next(calls)
            assert step.click == expected_click(mask, comps[traj.component_id], clicks)
            clicks.append(step.click)
            box = grow_box(box, step.click)
            assert call.boxes == [box] and call.clicks == [clicks]
            assert call.previous.shape == (1, 1, 288, 288)
            np.testing.assert_array_equal(call.previous, prev.result.low_res_logits)
            assert np.array_equal(step.mask, call.result.masks[0])
            prev, mask = call, step.mask
        assert traj.stop_reason in ("T", "no-click", "tau")
        assert Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))).to_dict() == traj.to_dict()
