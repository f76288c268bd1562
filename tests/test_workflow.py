"""The XFlow workflow with scripted policies and a scripted segmenter (every mask predictable).

The image is asymmetric (256 x 320) so a transposition anywhere would move masks off target.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from monailabel_xflow import rle
from monailabel_xflow.geometry import (
    Click,
    GeometryError,
    box_from_text,
    box_to_mask,
    box_to_text,
    grow_box,
    mask_to_box,
    pixel_to_point,
)
from monailabel_xflow.instructions import Instruction, all_findings
from monailabel_xflow.policy.protocol import BoxRef, Stage1Output, Stage2Action, format_stage1, format_stage2
from monailabel_xflow.testing import ScriptedPolicy, ScriptedSegmenter, ellipse
from monailabel_xflow.workflow.trace import Trace, json_schema
from monailabel_xflow.workflow.xflow import WorkflowError, XFlow, infer_lesion_type, locate_regions

H, W = 256, 320
RIGHT_LUNG_BOX = (0.10, 0.15, 0.45, 0.85)  # the patient's right lung is on the image's left
LEFT_LUNG_BOX = (0.55, 0.15, 0.90, 0.85)
EFFUSION = Instruction("effusion", ("left lung",))


def lungs() -> list[BoxRef]:
    return [BoxRef("right lung", RIGHT_LUNG_BOX), BoxRef("left lung", LEFT_LUNG_BOX)]


def stage1_text(present: bool, lesions=(), label="effusion", think="") -> str:
    return format_stage1(Stage1Output(lungs(), present, [BoxRef(label, b) for b in lesions], think))


def click_text(positive: bool, x: float, y: float) -> str:
    return format_stage2(Stage2Action(Click(positive, x, y)))


STOP = format_stage2(Stage2Action(None))


@pytest.fixture()
def image() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.uniform(0.0, 1.0, size=(H, W)).astype(np.float32)


@pytest.fixture()
def target() -> np.ndarray:
    """Two lesions in the left lung base: a larger one and a small one to its right."""
    return ellipse((H, W), 190, 230, 18, 30) | ellipse((H, W), 190, 280, 10, 8)


def box_of(mask: np.ndarray):
    """The tight box of a mask on the protocol's 0-1000 grid (what a policy can say)."""
    return box_from_text(box_to_text(mask_to_box(mask)))


def test_absent_gives_empty_mask_and_sentence(image, target):
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy([stage1_text(False)])
    result = XFlow(policy, policy, seg).run(image, EFFUSION)
    assert not result.present
    assert result.mask.shape == (H, W) and result.mask.dtype == bool and not result.mask.any()
    assert result.answer == "There is no effusion in the left lung."
    assert seg.predict_calls == 0 and seg.set_image_calls == 1
    assert result.trace.stage1.present is False and len(result.trace.stage1.lungs) == 2
    assert result.trace.lesions == []


def test_two_boxes_one_batched_call_and_union(image, target):
    big = box_of(ellipse((H, W), 190, 230, 18, 30))
    small = box_of(ellipse((H, W), 190, 280, 10, 8))
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy([stage1_text(True, [big, small])])
    result = XFlow(policy, None, seg).run(image, EFFUSION)
    assert result.present and result.answer == ""
    assert seg.predict_calls == 1 and seg.calls[0].boxes == [big, small] and seg.calls[0].clicks is None
    first, second = seg.calls[0].result.masks
    assert first.any() and second.any() and not np.array_equal(first, second)
    np.testing.assert_array_equal(result.mask, first | second)
    assert [lesion.end for lesion in result.trace.lesions] == ["not_revised", "not_revised"]
    assert "Segmented the effusion in the left lung" in result.message


def test_positive_click_outside_box_grows_it_and_passes_all_clicks(image, target):
    box = box_of(ellipse((H, W), 190, 230, 18, 30))
    outside = Click(True, *pixel_to_point(190, 280, (H, W)))  # the small lesion, right of the box
    inside_negative = Click(False, *pixel_to_point(190, 230, (H, W)))
    seg = ScriptedSegmenter(target, positive_radius_px=12, negative_radius_px=4)
    policy = ScriptedPolicy(
        [stage1_text(True, [box])],
        [[click_text(True, outside.x, outside.y), click_text(False, inside_negative.x, inside_negative.y), STOP]],
    )
    result = XFlow(policy, policy, seg).run(image, EFFUSION)

    lesion = result.trace.lesions[0]
    assert [s.action for s in lesion.steps] == ["click", "click", "stop"] and lesion.end == "stop"
    expected = grow_box(box, lesion.clicks[0])
    assert lesion.steps[0].box_grown and lesion.steps[0].box == pytest.approx(expected)
    assert not lesion.steps[1].box_grown and lesion.steps[1].box == pytest.approx(expected)
    assert expected[2] > box[2]  # it really grew to the right
    # Decoder calls after Stage 1: the grown box, all clicks so far, the previous low-res logits.
    stage2 = seg.calls[1:]
    assert len(stage2) == 2
    assert stage2[0].boxes == [pytest.approx(expected)] and len(stage2[0].clicks[0]) == 1
    assert len(stage2[1].clicks[0]) == 2 and stage2[1].clicks[0][1].positive is False
    np.testing.assert_array_equal(stage2[0].previous, seg.calls[0].result.low_res_logits[0:1])
    np.testing.assert_array_equal(stage2[1].previous, stage2[0].result.low_res_logits)
    # The small lesion (outside the initial box) is now in the mask; the negative click carved a hole.
    assert result.mask[190, 280] and not result.mask[190, 230]
    np.testing.assert_array_equal(result.mask, stage2[1].result.masks[0])


def test_stop_ends_stage2(image, target):
    box = box_of(target)
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy([stage1_text(True, [box])], [[STOP, click_text(True, 0.5, 0.5)]])
    result = XFlow(policy, policy, seg).run(image, EFFUSION)
    lesion = result.trace.lesions[0]
    assert [s.action for s in lesion.steps] == ["stop"] and lesion.end == "stop"
    assert seg.predict_calls == 1
    np.testing.assert_array_equal(result.mask, seg.calls[0].result.masks[0])


@pytest.mark.parametrize("budget", [0, 1, 3])
def test_max_clicks_caps_stage2(image, target, budget):
    box = box_of(target)
    clicks = [click_text(True, 0.7 + 0.01 * k, 0.7) for k in range(6)]
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy([stage1_text(True, [box])], [clicks])
    result = XFlow(policy, policy, seg, max_clicks=4).run(image, EFFUSION, max_clicks=budget)
    lesion = result.trace.lesions[0]
    assert len(lesion.steps) == budget and seg.predict_calls == 1 + budget
    assert lesion.end == ("not_revised" if budget == 0 else "max_clicks")
    assert result.trace.settings["max_clicks"] == budget


def test_revise_false_skips_stage2(image, target):
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy([stage1_text(True, [box_of(target)])], [[click_text(True, 0.5, 0.5)]])
    result = XFlow(policy, policy, seg).run(image, EFFUSION, revise=False)
    assert seg.predict_calls == 1 and result.trace.lesions[0].end == "not_revised"
    assert not any(name == "start" for name, _ in policy.calls)


@pytest.mark.parametrize(
    "text, warning",
    [
        ("I think there is an effusion somewhere", "no readable presence"),
        ("<think>x</think><answer>maybe</answer>", "no readable presence"),
        ("<think>x</think><answer>present</answer>", "no usable lesion box"),
        (
            "<think>x</think><answer>present</answer><ref>effusion</ref><|box_start|>(5,5),(5,9)<|box_end|>",
            "no usable lesion box",
        ),
        (None, "unreadable"),
    ],
)
def test_malformed_stage1_is_recorded_and_answered_absent(image, target, text, warning):
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy([text])
    result = XFlow(policy, policy, seg).run(image, EFFUSION)
    assert not result.present and not result.mask.any()
    assert result.answer == EFFUSION.absent_answer()
    assert any(warning in w for w in result.trace.warnings)
    assert result.trace.stage1.problems  # the parser's report is kept
    Trace.from_json(result.trace.to_json())  # and it still serialises


@pytest.mark.parametrize("bad", ["<think>hmm</think><click>positive (12;x)</click>", "nonsense", "", 42])
def test_malformed_stage2_stops_that_lesion(image, target, bad):
    box = box_of(target)
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy(
        [stage1_text(True, [box])], [[click_text(True, 0.8, 0.74), bad, click_text(True, 0.5, 0.5)]]
    )
    result = XFlow(policy, policy, seg).run(image, EFFUSION)
    lesion = result.trace.lesions[0]
    assert [s.action for s in lesion.steps] == ["click", "malformed"] and lesion.end == "malformed"
    assert lesion.steps[1].problems and lesion.steps[1].mask is None
    np.testing.assert_array_equal(result.mask, seg.calls[1].result.masks[0])  # the last good mask
    assert seg.predict_calls == 2


def test_out_of_range_click_is_clipped_executed_and_recorded(image, target):
    seg = ScriptedSegmenter(target)
    text = "<think>t</think><click>positive (1200,500)</click>"
    policy = ScriptedPolicy([stage1_text(True, [box_of(target)])], [[text, STOP]])
    result = XFlow(policy, policy, seg).run(image, EFFUSION)
    step = result.trace.lesions[0].steps[0]
    assert step.action == "click" and step.click.x == 1.0 and any("clipped" in p for p in step.problems)


def test_segmenter_returning_nothing_is_answered_absent(image, target):
    seg = ScriptedSegmenter(np.zeros((H, W), bool))
    policy = ScriptedPolicy([stage1_text(True, [(0.6, 0.6, 0.8, 0.8)])])
    result = XFlow(policy, None, seg).run(image, EFFUSION)
    assert not result.present and result.answer == EFFUSION.absent_answer()
    assert any("empty mask" in w for w in result.trace.warnings)
    assert len(result.trace.lesions) == 1  # the attempt stays in the trace


def test_trace_round_trips_through_json(image, target):
    box = box_of(ellipse((H, W), 190, 230, 18, 30))
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy(
        [stage1_text(True, [box, box_of(ellipse((H, W), 190, 280, 10, 8))], think="fluid at the left base")],
        [[click_text(True, 0.9, 0.74), STOP], ["garbage"]],
    )
    flow = XFlow(policy, policy, seg, models={"segmenter": "scripted"})
    result = flow.run(image, EFFUSION)
    trace = result.trace
    again = Trace.from_json(trace.to_json())
    assert again == trace and again.to_dict() == trace.to_dict()
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(trace.to_json()), json_schema())
    np.testing.assert_array_equal(again.final_mask(), result.mask)
    d = trace.to_dict()
    assert d["schema"] == "xflow-trace/1" and d["image_size"] == [H, W] and d["models"] == {"segmenter": "scripted"}
    assert d["instruction"]["instruction"] == "Segment the effusion in the left lung."
    assert d["stage1"]["think"] == "fluid at the left base" and len(d["stage1"]["lesions"]) == 2
    step = d["lesions"][0]["steps"][0]
    assert step["click"] == {"polarity": "positive", "point": [0.9, 0.74]} and step["box_grown"]
    assert rle.decode(step["mask"]).shape == (H, W)
    assert d["lesions"][1]["end"] == "malformed"
    assert {"segmenter_encode", "stage1", "segmenter_decode", "stage2", "total"} <= set(d["timings"])
    assert all(v >= 0 for v in d["timings"].values())


def test_masks_are_rle_encoded_only_when_the_trace_is_written(monkeypatch, image, target):
    calls = []
    real = rle.encode
    monkeypatch.setattr(rle, "encode", lambda mask: calls.append(1) or real(mask))
    box = box_of(target)
    policy = ScriptedPolicy([stage1_text(True, [box])], [[click_text(True, 0.7, 0.74), STOP]])
    result = XFlow(policy, policy, ScriptedSegmenter(target)).run(image, EFFUSION)
    np.testing.assert_array_equal(result.trace.final_mask(), result.mask)
    assert calls == []  # a run without a written trace encodes nothing
    d = result.trace.to_dict()
    assert len(calls) == 4  # initial mask, the click's mask, the revised mask, the union
    np.testing.assert_array_equal(rle.decode(d["mask"]), result.mask)


def test_run_all_encodes_once_and_answers_seven(image, target):
    texts = [stage1_text(False)] * 6 + [stage1_text(True, [box_of(target)])]
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy(texts)
    results = XFlow(policy, None, seg).run_all(image)
    assert seg.set_image_calls == 1 and seg.predict_calls == 1
    assert [r.instruction for r in results] == all_findings()
    assert [r.present for r in results] == [False] * 6 + [True]
    assert results[0].answer == "There is no cardiomegaly."
    assert results[-1].answer.startswith("It is located in the left lung")
    assert [r.trace.batch for r in results] == [{"index": k, "size": 7} for k in range(7)]


def test_global_answer_names_where_the_mask_lies(image, target):
    seg = ScriptedSegmenter(ellipse((H, W), 190, 230, 18, 30))
    policy = ScriptedPolicy([stage1_text(True, [box_of(target)])])
    result = XFlow(policy, None, seg).run(image, Instruction("effusion", (), "global"))
    assert result.answer == "It is located in the left lung base."


def test_locate_regions_rules():
    lung_refs = lungs()
    # Both sides: each lung named; a mask over a whole lung names the lung, not its four zones.
    both = box_to_mask((0.15, 0.2, 0.4, 0.8), (H, W)) | ellipse((H, W), 190, 230, 18, 40)
    assert locate_regions(both, lung_refs, "edema") == ("right lung", "left lung base")
    # No lung boxes: the image half decides the side and no zone is named.
    assert locate_regions(ellipse((H, W), 100, 60, 10, 10), [], "opacity") == ("right lung",)
    # Upper zone of the left lung (second quarter of its box).
    upper = ellipse((H, W), int(256 * 0.36), 230, 5, 10)
    assert locate_regions(upper, lung_refs, "opacity") == ("left upper zone lung",)
    assert locate_regions(upper, lung_refs, "cardiomegaly") == ("heart",)


def test_lesion_inference_answer(image, target):
    instr = Instruction("opacity", ("left lung",), "lesion_inference")
    box = box_of(target)
    seg = ScriptedSegmenter(target)
    policy = ScriptedPolicy(
        [
            stage1_text(True, [box], label="pneumonia"),
            format_stage1(Stage1Output(lungs(), True, [BoxRef("opacity", box)], "likely atelectasis")),
        ]
    )
    flow = XFlow(policy, None, seg)
    assert flow.run(image, instr).answer == "It is highly suggestive of pneumonia."
    assert flow.run(image, instr).answer == "It possibly reflects atelectasis."


def test_infer_lesion_type_mixed_labels_is_not_confident():
    from monailabel_xflow.workflow.trace import Stage1Record

    rec = Stage1Record(
        raw="",
        lesions=[
            BoxRef("edema", (0, 0, 1, 1)),
            BoxRef("edema", (0, 0, 0.5, 0.5)),
            BoxRef("pneumonia", (0, 0, 0.2, 0.2)),
        ],
    )
    assert infer_lesion_type(rec) == ("edema", False)
    assert infer_lesion_type(Stage1Record(raw="")) is None


def test_human_revise_uses_mask_box_grown_by_clicks(image, target):
    seg = ScriptedSegmenter(target, positive_radius_px=12)
    flow = XFlow(ScriptedPolicy(), None, seg)
    previous = ellipse((H, W), 190, 230, 18, 30)
    click = Click(True, *pixel_to_point(190, 280, (H, W)))
    out = flow.revise(image, [click], previous_mask=previous)
    assert out.box == pytest.approx(grow_box(mask_to_box(previous), click))
    assert out.mask[190, 280] and out.mask[190, 230] and out.mask.shape == (H, W)
    assert seg.calls[-1].clicks == [[click]]
    # Without a mask the clicks' bounds make the box; a given box wins over the mask.
    flow.revise(image, [Click(True, 0.6, 0.7), Click(True, 0.8, 0.8)])
    assert seg.calls[-1].boxes == [pytest.approx((0.6, 0.7, 0.8, 0.8))]
    # ... of the positive clicks: a negative click says "not here" and does not widen it
    # (3D Slicer and OHIF send every click so far and no mask, so this is their box)
    flow.revise(image, [Click(True, 0.6, 0.7), Click(False, 0.1, 0.1), Click(True, 0.8, 0.8)])
    assert seg.calls[-1].boxes == [pytest.approx((0.6, 0.7, 0.8, 0.8))] and len(seg.calls[-1].clicks[0]) == 3
    flow.revise(image, [Click(False, 0.2, 0.3), Click(False, 0.4, 0.5)])  # negatives only: their bounds
    assert seg.calls[-1].boxes == [pytest.approx((0.2, 0.3, 0.4, 0.5))]
    flow.revise(image, [], previous_mask=previous, box=(0.1, 0.1, 0.2, 0.2))
    assert seg.calls[-1].boxes == [pytest.approx((0.1, 0.1, 0.2, 0.2))] and seg.calls[-1].clicks is None
    with pytest.raises(WorkflowError, match="nothing to revise"):
        flow.revise(image, [])
    with pytest.raises(GeometryError, match="outside the image"):  # the one click check
        flow.revise(image, [Click(True, 1.5, 0.2)])


def test_human_revise_uses_a_fork_of_the_segmenter_when_offered(image, target):
    class Forking(ScriptedSegmenter):
        def fork(self):
            twin = ScriptedSegmenter(self.target)
            self.forks.append(twin)
            return twin

    seg = Forking(target)
    seg.forks = []
    out = XFlow(ScriptedPolicy(), None, seg).revise(image, [Click(True, 0.7, 0.74)], box=box_of(target))
    assert seg.set_image_calls == 0 and len(seg.forks) == 1 and seg.forks[0].predict_calls == 1
    np.testing.assert_array_equal(out.mask, seg.forks[0].calls[0].result.masks[0])


@pytest.mark.parametrize("bad", [np.zeros((4, 4, 3)), np.full((8, 8), 2.0), np.full((8, 8), np.nan)])
def test_bad_images_raise(bad):
    flow = XFlow(ScriptedPolicy(), None, ScriptedSegmenter(np.zeros((8, 8), bool)))
    with pytest.raises(GeometryError, match="image"):  # the one image check, at the entry
        flow.run(bad, EFFUSION)


def test_free_text_instruction_is_parsed(image, target):
    policy = ScriptedPolicy([stage1_text(False)])
    result = XFlow(policy, None, ScriptedSegmenter(target)).run(image, "is there fluid on the left?")
    assert result.instruction == EFFUSION and policy.calls[0] == ("stage1", EFFUSION)


# --- tiny real models, loaded the way users load theirs -------------------------------------


@pytest.fixture(scope="module")
def tiny_config(tiny_vlm, tiny_sam3) -> dict:
    """The session's tiny random SAM3 + Gemma3 (two LoRA adapters) as a model configuration."""
    return {
        "vlm_base": str(tiny_vlm.base),
        "init_adapter": str(tiny_vlm.init),
        "rev_adapter": str(tiny_vlm.rev),
        "segmenter": str(tiny_sam3),
        "device": "cpu",
        "max_new_tokens": 24,
    }


@pytest.fixture(scope="module")
def tiny_flow(tiny_config):
    from monailabel_xflow.testing import RecordingSegmenter

    flow = XFlow.from_config(tiny_config)
    flow.segmenter = RecordingSegmenter(flow.segmenter)
    return flow


def _check_valid(result, shape):
    assert result.mask.shape == shape and result.mask.dtype == bool
    assert result.present == bool(result.mask.any())
    if not result.present:
        assert result.answer == result.instruction.absent_answer()
    trace = result.trace
    assert Trace.from_json(trace.to_json()) == trace
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(json.loads(trace.to_json()), json_schema())
    np.testing.assert_array_equal(trace.final_mask(), result.mask)
    union = np.zeros(shape, bool)
    for lesion in trace.lesions:
        assert len(lesion.steps) <= trace.settings["max_clicks"]
        union |= rle.decode(lesion.mask)
    np.testing.assert_array_equal(union, result.mask)


def test_real_tiny_models_on_a_radiograph(tiny_flow, tiny_config, cxr_samples):
    from monailabel_xflow.transforms import load_cxr

    image, _ = load_cxr(cxr_samples / "nih" / "images" / "00000129_000.png")
    assert tiny_flow.models["segmenter"] == tiny_config["segmenter"]
    before = tiny_flow.segmenter.set_image_calls
    result = tiny_flow.run(image, "Segment the effusion in the left lung.")
    _check_valid(result, image.shape)
    assert tiny_flow.segmenter.set_image_calls == before + 1
    assert result.trace.stage1.raw == tiny_flow.stage1.stage1(image, EFFUSION)  # greedy: reproducible

    # Whatever the random π_init says, force Stage 2 to run with the real π_rev and SAM3.
    boxes = [(0.55, 0.55, 0.85, 0.8), (0.6, 0.25, 0.75, 0.4)]
    real_stage1 = tiny_flow.stage1
    try:
        tiny_flow.stage1 = ScriptedPolicy([stage1_text(True, boxes)])
        forced = tiny_flow.run(image, EFFUSION, max_clicks=2)
    finally:
        tiny_flow.stage1 = real_stage1
    assert len(forced.trace.lesions) == 2 and forced.trace.stage1.present is True
    _check_valid(forced, image.shape)
    for lesion in forced.trace.lesions:
        assert lesion.steps, "the real reviser took at least one turn"
        assert all(s.raw is not None and s.action in ("click", "stop", "malformed") for s in lesion.steps)


def test_real_tiny_models_on_a_phantom_all_findings(tiny_flow):
    phantom = pytest.importorskip("monailabel_xflow.data.phantom").generate_phantom(3, size=256)
    before = tiny_flow.segmenter.set_image_calls
    results = tiny_flow.run_all(phantom.image, max_clicks=1)
    assert tiny_flow.segmenter.set_image_calls == before + 1
    assert len(results) == 7
    for result in results:
        _check_valid(result, phantom.image.shape)


def test_stage2_drops_new_components_away_from_the_mask_and_the_click():
    from monailabel_xflow.workflow.revision import keep_connected_to

    prev = np.zeros((40, 40), bool)
    prev[10:20, 10:20] = True
    revised = prev.copy()
    revised[10:20, 20:24] = True  # grown from the previous mask: kept
    revised[30:33, 30:33] = True  # a new blob away from both: dropped
    revised[2:5, 34:37] = True  # a new blob under a positive click: kept for that click only
    on_blob = Click(True, *pixel_to_point(3, 35, (40, 40)))
    kept = keep_connected_to(revised, prev, on_blob)
    assert kept[10:20, 10:24].all() and kept[2:5, 34:37].all() and not kept[30:33, 30:33].any()
    negative = keep_connected_to(revised, prev, Click(False, *pixel_to_point(3, 35, (40, 40))))
    assert not negative[2:5, 34:37].any() and not negative[30:33, 30:33].any() and negative[10:20, 10:24].all()
    elsewhere = np.zeros_like(prev)
    elsewhere[30:35, 0:5] = True  # the mask moved entirely: F_seg's answer is kept as it is
    assert np.array_equal(keep_connected_to(elsewhere, prev, Click(False, 0.5, 0.5)), elsewhere)


def test_revision_pruning_is_on_by_default_and_recorded_in_the_trace(image, target):
    """A segmenter that sprouts a speck far from the lesion on every click: the workflow drops it
    (and records the pruned mask); with pruning off the speck stays in the answer."""

    class Sprouting(ScriptedSegmenter):
        def predict(self, boxes, clicks=None, previous=None, multimask=False):
            res = super().predict(boxes, clicks, previous, multimask)
            if clicks:
                res.masks[:, 20:24, 20:24] = True
            return res

    box = box_of(target)
    click = click_text(True, *pixel_to_point(190, 230, (H, W)))
    runs = {}
    for prune in (True, False):
        policy = ScriptedPolicy([stage1_text(True, [box])], [[click, STOP]])
        flow = XFlow(policy, policy, Sprouting(target), prune_revisions=prune)
        runs[prune] = flow.run(image, EFFUSION)
    assert not runs[True].mask[20:24, 20:24].any() and runs[False].mask[20:24, 20:24].all()
    step = runs[True].trace.lesions[0].steps[0]
    assert not rle.decode(step.mask)[20:24, 20:24].any()
    speck = np.zeros((H, W), bool)
    speck[20:24, 20:24] = True
    assert np.array_equal(runs[True].mask, runs[False].mask & ~speck)  # nothing else removed
