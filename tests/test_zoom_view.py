"""π_rev's zoomed observation (issue 35): a window around the box that prompted the mask, in
which a missed or spilled region spans many of the policy's image tokens. The view is one
contract (``geometry.zoom_view``) shared by the builder's SFT rows, the Stage 2 loop and GRPO:
what π_rev sees, and the coordinates its box and clicks are read and written in."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.geometry import (
    FULL_VIEW,
    VIEW_MIN_SIDE,
    Click,
    box_to_pixels,
    box_to_view,
    click_from_view,
    click_to_view,
    from_view,
    to_view,
    view_pixels,
    zoom_view,
)
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.policy.base import RevisionState
from monailabel_xflow.policy.oracle import OracleClicker
from monailabel_xflow.policy.protocol import Stage2Action, format_stage2, parse_stage2
from monailabel_xflow.rendering import render_observation
from monailabel_xflow.testing import ScriptedSegmenter, ellipse
from monailabel_xflow.training.builders import build, load_built
from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError
from monailabel_xflow.workflow.revision import read_action, revise_mask

H, W = 200, 240
LESION = ellipse((H, W), 100, 120, 14, 22)
BOX = (100 / W, 88 / H, 130 / W, 112 / H)  # the lesion's left part: the mask it prompts misses the rest


@pytest.mark.parametrize(
    "box",
    [BOX, (0.0, 0.0, 0.05, 0.05), (0.9, 0.85, 1.0, 1.0), (0.1, 0.45, 0.9, 0.55), (0.4, 0.4, 0.4, 0.4)],
    ids=["inner", "top-left corner", "bottom-right corner", "wide", "a point"],
)
def test_the_view_is_a_pixel_square_inside_the_image_around_the_box(box):
    view = zoom_view(box, (H, W))
    x1, y1, x2, y2 = box_to_pixels(view, (H, W))
    assert x2 - x1 == pytest.approx(y2 - y1)  # square in pixels: the policy's picture is not stretched
    assert all(abs(v - round(v)) < 1e-9 for v in (x1, y1, x2, y2))  # whole pixels: crop and mapping agree
    assert x1 >= 0 and y1 >= 0 and x2 <= W and y2 <= H
    assert x2 - x1 >= round(VIEW_MIN_SIDE * H) - 1e-9
    bx1, by1, bx2, by2 = box_to_pixels(box, (H, W))
    if max(bx2 - bx1, by2 - by1) * 2 <= H:  # a box that fits with its margin is wholly in view
        assert x1 <= bx1 and y1 <= by1 and bx2 <= x2 and by2 <= y2


def test_view_coordinates_round_trip_and_the_whole_image_is_the_identity():
    view = zoom_view(BOX, (H, W))
    for x, y in [(0.5, 0.5), (0.45, 0.48), (0.52, 0.55)]:
        assert from_view(*to_view(x, y, view), view) == pytest.approx((x, y))
        assert to_view(x, y, FULL_VIEW) == (x, y)
    inside = Click(False, 0.5, 0.5)
    shown = click_to_view(inside, view)
    assert shown is not None and not shown.positive
    assert click_from_view(shown, view) == pytest.approx(inside)
    assert click_to_view(Click(True, 0.02, 0.02), view) is None  # outside: π_rev cannot make it
    x1, y1, x2, y2 = box_to_view(BOX, view)
    assert 0 < x1 < x2 < 1 and 0 < y1 < y2 < 1
    assert box_to_view(BOX, FULL_VIEW) == pytest.approx(BOX)


def test_the_zoomed_observation_is_the_view_with_its_clicks_and_the_whole_one_is_unchanged():
    image = np.random.default_rng(0).uniform(0, 1, (H, W)).astype(np.float32)
    mask = LESION & (np.arange(W) < 130)[None, :]
    view = zoom_view(BOX, (H, W))
    rows, cols = view_pixels(view, (H, W))
    zoomed = render_observation(image, mask, [], view)
    assert zoomed.shape == (rows.stop - rows.start, cols.stop - cols.start, 3)
    assert zoomed.shape[0] < H / 2  # the lesion fills far more of the picture than in the whole image
    whole = render_observation(image, mask, [])
    assert whole.shape == (H, W, 3)
    assert np.array_equal(render_observation(image, mask, [], FULL_VIEW), whole)
    # the mask's pixels are the whole observation's pixels, cropped
    inner = np.zeros((H, W), bool)
    inner[rows, cols] = True
    inner &= mask & ~np.pad(~mask, 1)[2:, 1:-1] & ~np.pad(~mask, 1)[:-2, 1:-1]  # away from the outline
    crop = np.zeros((H, W, 3), np.uint8)
    crop[rows, cols] = zoomed
    assert inner.any() and np.array_equal(crop[inner], whole[inner])
    # a click in the view is drawn there; one outside it is not drawn at all
    far = render_observation(image, mask, [Click(True, 0.05, 0.05)], view)
    near = render_observation(image, mask, [Click(True, 0.5, 0.5)], view)
    assert np.array_equal(far, zoomed) and not np.array_equal(near, zoomed)


class _ZoomedSession:
    """Looks at the zoomed view and clicks at its centre in the view's coordinates, then stops."""

    zoom = True

    def __init__(self) -> None:
        self.states: list[RevisionState] = []

    def step(self, state: RevisionState) -> str:
        self.states.append(state)
        click = Click(True, 0.5, 0.5) if not self.states[:-1] else None
        return format_stage2(Stage2Action(click))


def test_the_loop_shows_the_view_and_reads_text_clicks_in_it():
    image = np.random.default_rng(1).uniform(0, 1, (H, W)).astype(np.float32)
    segmenter = ScriptedSegmenter(LESION, positive_radius_px=10)
    segmenter.set_image(image)
    first = segmenter.predict([BOX])
    mask0 = np.asarray(first.masks[0], bool)
    session = _ZoomedSession()
    run = revise_mask(segmenter, session, image, None, BOX, mask0, first.low_res_logits[0:1], budget=4)
    view = zoom_view(BOX, (H, W))
    assert [s.view for s in session.states] == [view, view]  # one window for the session
    rows, cols = view_pixels(view, (H, W))
    observation = session.states[0].observation
    assert observation is not None and observation.shape == (rows.stop - rows.start, cols.stop - cols.start, 3)
    # the click said at the view's centre is executed at the view's centre in the image
    centre = ((view[0] + view[2]) / 2, (view[1] + view[3]) / 2)
    assert run.turns[0].click == pytest.approx(Click(True, *centre), abs=1e-3)
    assert segmenter.calls[-1].clicks[0][0] == pytest.approx(Click(True, *centre), abs=1e-3)
    assert run.end == "stop"
    # an answer without words (the oracle's Stage2Action) is in image coordinates whatever the view
    exact = Click(True, 0.3, 0.3)
    assert read_action(Stage2Action(exact), view)[0] == exact
    assert read_action(format_stage2(Stage2Action(exact)), FULL_VIEW)[0] == pytest.approx(exact, abs=1e-3)


def test_zoomed_rows_write_the_oracles_clicks_in_the_view(tmp_path):
    image = (np.random.default_rng(2).uniform(0, 1, (H, W)) * 255).astype(np.uint8)
    Image.fromarray(image).save(tmp_path / "i.png")
    Image.fromarray(LESION.astype(np.uint8) * 255).save(tmp_path / "m.png")
    case = EvalCase("q1", tmp_path / "i.png", Instruction("edema", ("left lung",)), True, mask_path=tmp_path / "m.png")
    clicker = OracleClicker(tau=0.99, box_noise=0.3)
    rows = {}
    for zoom in (False, True):
        segmenter = ScriptedSegmenter(LESION, positive_radius_px=6, negative_radius_px=3)
        report = build("rev-sft", [case], tmp_path / str(zoom), segmenter=segmenter, clicker=clicker, zoom=zoom)
        assert report.rows == 1, report.rejected
        rows[zoom] = load_built(tmp_path / str(zoom))[0]
    whole, zoomed = rows[False], rows[True]
    assert len(whole["targets"]) >= 2  # the oracle clicked
    assert whole["view"] == list(FULL_VIEW)
    view = tuple(zoomed["view"])
    start = tuple(whole["box"])  # the same trajectory (same seed): its box in image coordinates
    assert view == zoom_view(start, (H, W))
    assert zoomed["box"] == pytest.approx(box_to_view(start, view))
    assert len(zoomed["targets"]) == len(whole["targets"])
    side = round((view[2] - view[0]) * W)
    for png in zoomed["observations"]:
        assert np.asarray(Image.open(png)).shape == (side, side, 3)
    for said_whole, said_zoomed in zip(whole["targets"], zoomed["targets"], strict=True):
        a, b = parse_stage2(said_whole).value.click, parse_stage2(said_zoomed).value.click
        assert (a is None) == (b is None)
        if a is not None and b is not None:  # the same click, written in the view (text rounds to 1/1000)
            assert click_from_view(b, view) == pytest.approx(a, abs=2e-3)
            assert (b.x, b.y) != pytest.approx((a.x, a.y), abs=1e-2)


def test_the_models_file_names_the_view_and_refuses_others(tmp_path):
    assert ModelConfig().revision_view == "full"
    assert ModelConfig(revision_view="zoom").revision_view == "zoom"
    with pytest.raises(ModelConfigError, match="revision_view"):
        ModelConfig(revision_view="../../etc/passwd")
    (tmp_path / "m.yaml").write_text("revision_view: zoom\nsegmenter: ./s\n")
    assert ModelConfig.from_file(tmp_path / "m.yaml").revision_view == "zoom"
