"""Zoom-in F_seg (``segmenter/zoom.py``): the window, the coordinates in and out, the previous
logits, the weights' own record of it, and training that crops with the same rule."""

from __future__ import annotations

import json

import numpy as np
import pytest

from monailabel_xflow.geometry import FULL_VIEW, Click, box_to_mask, mask_to_box, view_pixels
from monailabel_xflow.segmenter.base import SegmentationResult, SegmenterInputError, build_prompts
from monailabel_xflow.segmenter.zoom import (
    OUTSIDE_LOGIT,
    VIEW_FILE,
    ZoomedSegmenter,
    prompt_view,
    read_view,
    write_view,
    zoom_sample,
)
from monailabel_xflow.testing import disk

H = W = 128


class BoxDrawer:
    """Inner double of any image size: the mask is the box, plus a 2-px disc per positive click,
    minus one per negative click; it records what it was given."""

    def __init__(self):
        self.shapes, self.boxes, self.clicks, self.previous = [], [], [], []
        self.image = None

    def fork(self):
        return BoxDrawer()

    def set_image(self, image):
        self.image = np.asarray(image)

    def predict(self, boxes, clicks=None, previous=None, multimask=False):
        build_prompts(boxes, clicks, previous)
        shape = self.image.shape[:2]
        self.shapes.append(shape)
        self.boxes.append(list(boxes))
        self.clicks.append([list(c) for c in clicks] if clicks is not None else None)
        self.previous.append(previous)
        masks = np.stack([box_to_mask(b, shape) for b in boxes])
        for m, box_clicks in zip(masks, clicks or [[] for _ in boxes], strict=True):
            for c in box_clicks:
                d = disk(shape, c.y * shape[0], c.x * shape[1], 2)
                m[...] = (m | d) if c.positive else (m & ~d)
        logits = np.where(masks, 5.0, -5.0).astype(np.float32)
        low = np.full((len(boxes), 1, 16, 16), float(len(self.shapes)), np.float32)
        return SegmentationResult(logits, masks, np.ones(len(boxes), np.float32), low)


def inner_mask(inner, box):
    """The coarse mask BoxDrawer gave for ``box`` on the whole image (the box itself, plus discs)."""
    return box_to_mask(box, (H, W)) | disk((H, W), 0.5 * H, 0.5 * W, 2)


def image():
    return np.random.default_rng(0).random((H, W)).astype(np.float32)


class TestWindow:
    def test_a_box_gets_twice_its_side_and_a_point_the_whole_image(self):
        box = (0.40, 0.40, 0.60, 0.60)  # 25.6 px: the window is 2 x 25.6 -> 51 px, centred
        view = prompt_view(box, [], (H, W))
        rows, cols = view_pixels(view, (H, W))
        assert rows.stop - rows.start == cols.stop - cols.start == 51
        assert view[0] < box[0] and view[2] > box[2]
        assert prompt_view((0.5, 0.5, 0.5, 0.5), [], (H, W)) == FULL_VIEW
        # a small box gets the floor of a quarter of the image
        rows, _ = view_pixels(prompt_view((0.5, 0.5, 0.55, 0.55), [], (H, W)), (H, W))
        assert rows.stop - rows.start == 32

    def test_a_window_wider_than_max_side_is_the_whole_image(self):
        box = (0.2, 0.2, 0.6, 0.6)  # the window would be 0.8 of the image
        assert prompt_view(box, [], (H, W)) == FULL_VIEW  # MAX_ZOOM_SIDE = 0.5
        assert prompt_view(box, [], (H, W), max_side=1.0) != FULL_VIEW

    def test_positive_clicks_widen_the_window_negative_ones_do_not(self):
        box = (0.40, 0.40, 0.45, 0.45)
        alone = prompt_view(box, [], (H, W))
        assert prompt_view(box, [Click(False, 0.95, 0.95)], (H, W)) == alone
        widened = prompt_view(box, [Click(True, 0.95, 0.95)], (H, W))
        assert widened[2] >= 0.95 and widened[3] >= 0.95

    def test_a_training_sample_is_cropped_by_the_same_window(self):
        img = image()
        mask = box_to_mask((0.3, 0.3, 0.5, 0.5), (H, W))
        box = mask_to_box(mask)
        crop, crop_mask = zoom_sample(img, mask, box)
        rows, cols = view_pixels(prompt_view(box, [], (H, W)), (H, W))
        np.testing.assert_array_equal(crop, img[rows, cols])
        assert crop_mask.sum() == mask.sum()  # the window holds the whole component


class TestZoomedSegmenter:
    def test_box_and_clicks_go_in_in_window_coordinates_and_the_mask_comes_out_in_the_image(self):
        inner = BoxDrawer()
        seg = ZoomedSegmenter(inner)
        seg.set_image(image())
        box = (0.40, 0.40, 0.60, 0.60)
        clicks = [Click(True, 0.5, 0.5), Click(False, 0.02, 0.02)]  # the negative one lies outside the window
        res = seg.predict([box], [clicks])
        assert inner.shapes[0] == (H, W)  # the coarse pass sees the whole image
        view = prompt_view(box, clicks, (H, W), inner_mask(inner, box))
        rows, cols = view_pixels(view, (H, W))
        assert inner.shapes[-1] == (rows.stop - rows.start, cols.stop - cols.start)
        sent = inner.boxes[-1][0]
        assert sent[0] == pytest.approx(0.25, abs=0.02) and sent[2] == pytest.approx(0.75, abs=0.02)
        assert [c.positive for c in inner.clicks[-1][0]] == [True]  # the far negative click is dropped
        assert inner.clicks[-1][0][0].x == pytest.approx(0.5, abs=0.02)
        assert res.masks.shape == (1, H, W) and res.logits.dtype == np.float32
        expected = box_to_mask(box, (H, W))
        assert (res.masks[0] ^ expected).sum() <= 4 * W / 50  # one-pixel rounding along the edges
        outside = np.ones((H, W), bool)
        outside[rows, cols] = False
        assert (res.logits[0][outside] == OUTSIDE_LOGIT).all()

    def test_previous_logits_are_passed_on_only_for_the_same_window(self):
        inner = BoxDrawer()
        seg = ZoomedSegmenter(inner)
        seg.set_image(image())
        box = (0.40, 0.40, 0.60, 0.60)
        first = seg.predict([box])
        seg.predict([box], [[Click(True, 0.5, 0.5)]], first.low_res_logits)
        assert inner.previous[-1] is not None  # same window: the logits line up
        third = seg.predict([box], [[Click(True, 0.9, 0.9)]], seg.predict([box]).low_res_logits)
        assert inner.previous[-1] is None  # the click outside moved the window
        assert third.masks[0][int(0.9 * H), int(0.9 * W)]
        seg.predict([box], [[]], np.zeros_like(first.low_res_logits))
        assert inner.previous[-1] is None  # logits it did not return are not trusted

    def test_a_first_click_is_zoomed_around_the_coarse_mask(self):
        inner = BoxDrawer()
        seg = ZoomedSegmenter(inner)
        seg.set_image(image())
        # a point box and its click: the coarse pass draws only the click's disc, so the window is
        # the floor (a quarter of the image) around it, and the answer lies inside it
        res = seg.predict([(0.3, 0.3, 0.3, 0.3)], [[Click(True, 0.3, 0.3)]])
        assert inner.shapes == [(H, W), (32, 32)]
        assert res.masks[0][int(0.3 * H), int(0.3 * W)] and res.masks[0].sum() < 32 * 32

    def test_the_window_holds_the_coarse_objects_reach(self):
        coarse = box_to_mask((0.3, 0.3, 0.5, 0.5), (H, W))
        coarse |= box_to_mask((0.85, 0.85, 0.95, 0.95), (H, W))  # a separate blob far away is left out
        view = prompt_view((0.4, 0.4, 0.45, 0.45), [], (H, W), coarse)
        assert view[0] <= 0.3 and view[2] >= 0.5 and view[2] < 0.85
        # a lone blob away from the prompt is not the object either
        far = box_to_mask((0.85, 0.85, 0.95, 0.95), (H, W))
        assert prompt_view((0.4, 0.4, 0.45, 0.45), [], (H, W), far) == prompt_view((0.4, 0.4, 0.45, 0.45), [], (H, W))

    def test_a_whole_image_window_is_answered_by_the_coarse_pass_alone(self):
        inner = BoxDrawer()
        seg = ZoomedSegmenter(inner)
        seg.set_image(image())
        box = (0.2, 0.2, 0.6, 0.6)  # the window would be 0.8 of the image: not worth zooming
        first = seg.predict([box])
        assert inner.shapes == [(H, W)]  # one decoder pass, not the same one twice
        np.testing.assert_array_equal(first.masks[0], box_to_mask(box, (H, W)))
        # with its own previous logits the second pass is a different call, so it runs
        seg.predict([box], [[Click(True, 0.3, 0.3)]], first.low_res_logits)
        assert len(inner.shapes) == 3 and inner.previous[-1] is not None

    def test_refuses_what_the_backends_refuse(self):
        seg = ZoomedSegmenter(BoxDrawer())
        with pytest.raises(RuntimeError, match="set_image"):
            seg.predict([(0.1, 0.1, 0.2, 0.2)])
        seg.set_image(image())
        with pytest.raises(SegmenterInputError, match="one list per box"):
            seg.predict([(0.1, 0.1, 0.2, 0.2)], [[], []])
        assert len(seg.predict([])) == 0


class TestWeightsRecord:
    def test_read_and_write(self, tmp_path):
        assert read_view(tmp_path) == "full"
        write_view(tmp_path, "zoom")
        assert read_view(tmp_path) == "zoom"
        (tmp_path / VIEW_FILE).write_text(json.dumps({"view": "fisheye"}))
        with pytest.raises(SegmenterInputError, match="fisheye"):
            read_view(tmp_path)
        (tmp_path / VIEW_FILE).write_text("not json")
        with pytest.raises(SegmenterInputError, match="JSON"):
            read_view(tmp_path)
        with pytest.raises(ValueError):
            write_view(tmp_path, "fisheye")

    def test_load_segmenter_zooms_when_the_weights_say_so(self, tiny_sam3, tmp_path):
        import shutil

        from monailabel_xflow.segmenter.loading import load_segmenter
        from monailabel_xflow.segmenter.sam3 import Sam3Segmenter

        assert isinstance(load_segmenter(str(tiny_sam3), device="cpu"), Sam3Segmenter)
        zoomed = tmp_path / "sam3"
        shutil.copytree(tiny_sam3, zoomed)
        write_view(zoomed, "zoom")
        seg = load_segmenter(str(zoomed), device="cpu")
        assert isinstance(seg, ZoomedSegmenter) and isinstance(seg.inner, Sam3Segmenter)
        seg.set_image(image())
        res = seg.predict([(0.4, 0.4, 0.6, 0.6)], [[Click(True, 0.5, 0.5)]])
        assert res.masks.shape == (1, H, W) and res.low_res_logits.shape[:2] == (1, 1)
        assert seg.fingerprint == seg.inner.fingerprint  # the store's key is the weights'


def test_training_with_zoom_marks_the_weights(tiny_sam3, tmp_path):
    from monailabel_xflow.training.config import load_config
    from monailabel_xflow.training.segmenter import SegSample, finetune_segmenter

    img = image()
    samples = [SegSample(img, disk((H, W), 60, 60, 12)), SegSample(img, disk((H, W), 30, 90, 6))]
    cfg = load_config("segmenter", max_steps=2, effective_batch=1, zoom_prob=1.0, interactive_rounds=1, seed=0)
    out = tmp_path / "zoomed"
    finetune_segmenter(str(tiny_sam3), samples, out, cfg, progress=False)
    assert read_view(out) == "zoom"
    one_step = load_config("segmenter", max_steps=1, effective_batch=1)
    again = tmp_path / "again"  # fine-tuned further without asking for windows: still a zooming model
    finetune_segmenter(str(out), samples, again, one_step, progress=False)
    assert read_view(again) == "zoom"
    plain = tmp_path / "plain"
    finetune_segmenter(str(tiny_sam3), samples, plain, one_step, progress=False)
    assert read_view(plain) == "full"
