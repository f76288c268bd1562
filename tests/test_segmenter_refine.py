"""Click refinement (``segmenter/refine.py``): F_seg's masks made to agree with their clicks.

The committed demo F_seg answers a tight box and ignores a negative click on it (its diagnosis in
``reports/click-efficiency/README.md``); with the backpropagating refinement the same weights clear
the clicked region. Sample: ``sample-data/phantom_1_00006.png``'s left effusion (seed 1, no model
choice was made on it).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.geometry import Click, mask_to_box, point_to_pixel
from monailabel_xflow.segmenter.loading import load_segmenter
from monailabel_xflow.segmenter.refine import ClickRefinement, refinement_for
from monailabel_xflow.workflow.model_config import DEMO_DIR, ModelConfig, ModelConfigError

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "sample-data" / "phantom_1_00006.png"
TRUTH = ROOT / "sample-data" / "ground-truth" / "lesion_mask" / "s50010006" / "effusion_left_lung.png"


@pytest.fixture(scope="module")
def effusion():
    """The image, the lesion, its box, a negative click at its deepest pixel and that pixel."""
    image = np.asarray(Image.open(STUDY).convert("L"), np.float32) / 255.0
    truth = np.asarray(Image.open(TRUTH)) > 0
    click = deepest(truth)
    return image, truth, mask_to_box(truth), click, point_to_pixel(click.x, click.y, truth.shape)


@pytest.fixture(scope="module")
def demo_pair():
    plain = load_segmenter(DEMO_DIR / "segmenter", device="cpu")
    refined = load_segmenter(DEMO_DIR / "segmenter", device="cpu", refinement=ClickRefinement())
    return plain, refined


def deepest(mask: np.ndarray) -> Click:
    """A negative click at the pixel of ``mask`` farthest from its edge."""
    from scipy.ndimage import distance_transform_edt

    r, c = np.unravel_index(np.argmax(distance_transform_edt(mask)), mask.shape)
    return Click(False, (c + 0.5) / mask.shape[1], (r + 0.5) / mask.shape[0])


def test_settings_are_bounded_and_named():
    assert refinement_for(None) is None and refinement_for("none") is None
    assert refinement_for("brs") == ClickRefinement()
    with pytest.raises(ValueError, match="not one of"):
        refinement_for("f-brs-c")
    for bad in ({"iterations": 0}, {"iterations": 101}, {"iterations": 2.5}, {"iterations": True}):
        with pytest.raises(ValueError, match="iterations"):
            ClickRefinement(**bad)
    for bad in ({"radius": 0.1}, {"radius": float("nan")}, {"weight_decay": -1.0}, {"weight_decay": 1e9}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ClickRefinement(**bad)


def test_a_negative_click_clears_what_the_model_alone_keeps(demo_pair, effusion):
    plain, refined = demo_pair
    image, _, box, click, pixel = effusion
    answers = {}
    for name, seg in (("plain", plain), ("refined", refined)):
        seg.set_image(image)
        alone = seg.predict([box]).masks[0]
        answers[name] = (alone, seg.predict([box], clicks=[[click]]).masks[0])
    (plain_box, plain_click), (refined_box, refined_click) = answers["plain"], answers["refined"]
    # a box alone is the model's own answer either way: nothing to agree with
    np.testing.assert_array_equal(plain_box, refined_box)
    assert plain_box[pixel] and plain_click[pixel], "the model alone keeps the clicked pixel (the diagnosis)"
    assert not refined_click[pixel], "refined, the negative click clears its pixel"
    # the click removes a region around it, not the whole mask
    removed = plain_box & ~refined_click
    assert removed.sum() >= 50, removed.sum()
    assert refined_click.sum() >= 0.3 * plain_box.sum(), (refined_click.sum(), plain_box.sum())


def test_a_positive_click_adds_the_missed_region_and_weights_stay_clean(demo_pair, effusion):
    _, refined = demo_pair
    image, truth, box, _, _ = effusion
    refined.set_image(image)
    alone = refined.predict([box]).masks[0]
    missed = truth & ~alone
    assert missed.any()
    r, c = np.unravel_index(np.argmax(np.where(missed, 1.0, 0.0)), missed.shape)
    click = Click(True, (c + 0.5) / truth.shape[1], (r + 0.5) / truth.shape[0])
    answer = refined.predict([box], clicks=[[click]]).masks[0]
    assert answer[r, c], "the positive click's pixel is added"
    # the correction is decoded, never learned: the shared model's weights keep no gradient
    assert all(p.grad is None for p in refined.model.parameters())


def test_batched_prompts_are_refined_each_by_its_own_clicks(demo_pair, effusion):
    plain, refined = demo_pair
    image, _, box, click, pixel = effusion
    plain.set_image(image)
    unrefined = plain.predict([box, box], clicks=[[click], []])
    refined.set_image(image)
    both = refined.predict([box, box], clicks=[[click], []])
    one = refined.predict([box], clicks=[[click]])
    np.testing.assert_array_equal(both.masks[1], unrefined.masks[1])  # no clicks: no correction
    assert not both.masks[0][pixel]
    assert (both.masks[0] == one.masks[0]).mean() > 0.99


@pytest.mark.parametrize("field", ["click_refinement", "stage2_click_refinement"])
def test_models_file_turns_it_on_for_the_transformers_backend_only(field):
    demo = json.loads(json.dumps({"segmenter": str(DEMO_DIR / "segmenter"), "init_model": str(DEMO_DIR / "base")}))
    assert getattr(ModelConfig.from_dict(demo), field) == "none"
    assert field not in ModelConfig.from_dict(demo).identities()
    config = ModelConfig.from_dict({**demo, field: "brs"})
    assert config.identities()[field] == "brs"
    with pytest.raises(ModelConfigError, match=field):
        ModelConfig.from_dict({**demo, field: "always"})
    with pytest.raises(ModelConfigError, match="transformers"):
        ModelConfig.from_dict({**demo, field: "brs", "segmenter_backend": "official"})
    with pytest.raises(ValueError, match="transformers backend"):
        load_segmenter(DEMO_DIR / "segmenter", backend="official", refinement=ClickRefinement())
    env = ModelConfig.from_env({"XFLOW_SEGMENTER": str(DEMO_DIR / "segmenter"), f"XFLOW_{field.upper()}": "brs"})
    assert getattr(env, field) == "brs"


def test_the_click_tool_refines_and_stage_2_keeps_the_model_alone(demo_pair, effusion):
    from monailabel_xflow.workflow.model_config import DEMO_MODELS_FILE
    from monailabel_xflow.workflow.xflow import XFlow

    plain, _ = demo_pair
    image, _, box, click, pixel = effusion
    tool = XFlow(None, None, plain, click_refinement=ClickRefinement())  # type: ignore[arg-type]
    assert not tool.revise(image, [click], box=box).mask[pixel]
    assert tool.segmenter.refinement is None  # Stage 2's segmenter: π_rev learned the model's answers
    assert XFlow(None, None, plain).revise(image, [click], box=box).mask[pixel]  # type: ignore[arg-type]
    # the demo's models file turns it on for the click tool
    demo = XFlow.from_config(DEMO_MODELS_FILE)
    assert demo.click_refinement == ClickRefinement() and demo.segmenter.refinement is None


def test_stage2_refines_pi_revs_clicks_and_the_click_tool_keeps_its_own_setting(demo_pair, effusion):
    """``stage2_click_refinement`` refines the segmenter Stage 2 clicks on (its box answers are the
    model's); the click tool follows ``click_refinement`` whatever Stage 2 does."""
    from monailabel_xflow.workflow.model_config import load_models
    from monailabel_xflow.workflow.xflow import XFlow

    plain, refined = demo_pair
    image, _, box, click, pixel = effusion
    models = {name: str(DEMO_DIR / name) for name in ("base", "init", "segmenter")}
    models = {"vlm_base": models["base"], "init_adapter": models["init"], "segmenter": models["segmenter"]}
    stage2 = load_models(ModelConfig.from_dict({**models, "stage2_click_refinement": "brs"})).segmenter
    assert stage2.refinement == ClickRefinement()
    stage2.set_image(image)
    plain.set_image(image)
    np.testing.assert_array_equal(stage2.predict([box]).masks[0], plain.predict([box]).masks[0])
    assert not stage2.predict([box], clicks=[[click]]).masks[0][pixel]  # π_rev's negative click obeyed
    # a click tool without refinement answers with the model alone, on Stage 2's refined segmenter too
    assert XFlow(None, None, refined).revise(image, [click], box=box).mask[pixel]  # type: ignore[arg-type]
    assert refined.refinement == ClickRefinement()  # the fork's setting did not leak into it


def test_the_app_conf_overrides_the_models_file():
    from monailabel_xflow.workflow.runtime import XFlowRuntime

    assert XFlowRuntime({}, environ={}, preload=False).config.click_refinement == "brs"  # the demo's
    off = XFlowRuntime({"click_refinement": "none"}, environ={}, preload=False)
    assert off.config.click_refinement == "none" and off.config.is_demo
    bad = XFlowRuntime({"click_refinement": "../../etc/passwd"}, environ={}, preload=False)
    assert "click_refinement" in bad.status()["error"]
