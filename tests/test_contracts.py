"""The contracts the workflow is typed against, run over every implementation.

* :class:`TestSegmenterContract` (``PromptableSegmenter``, ``segmenter/base.py``): the
  transformers SAM3 backend on the tiny random tracker (also behind the zoom-in wrapper,
  ``segmenter/zoom.py``), the official-backend wrapper on a
  stand-in for the ``sam3`` package's model (the package needs CUDA and torchvision and is not
  installed here: what runs is our wrapper -- prompt checks, pixel coordinates, batch
  restoring -- not Meta's model), and the test doubles of ``monailabel_xflow.testing``.
  ``SequenceSegmenter`` is left out on purpose: it replays one scripted mask per call whatever
  the prompts (``N = 1``), which is its job.
* :class:`TestPolicyContract` (``Stage1Policy``, ``RevisionPolicy``, ``RevisionSession``,
  ``policy/base.py``): the VLM policy on the tiny random Gemma 3, the oracle (text and exact
  ``Stage2Action`` answers) and the scripted double.
* The shared prompt builder (``build_prompts`` and ``sam3_prompt_kwargs``) that inference and
  F_seg training both use.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from monailabel_xflow.errors import InputError
from monailabel_xflow.geometry import Click, GeometryError, box_to_mask
from monailabel_xflow.instructions import Instruction, parse_instruction
from monailabel_xflow.policy.base import (
    PolicyError,
    RevisionPolicy,
    RevisionSession,
    RevisionState,
    Stage1Policy,
)
from monailabel_xflow.policy.oracle import OracleError, OracleRevisionPolicy
from monailabel_xflow.policy.protocol import Stage2Action
from monailabel_xflow.rendering import render_observation
from monailabel_xflow.segmenter.base import (
    PAD_LABEL,
    PromptableSegmenter,
    SegmenterInputError,
    build_prompts,
)
from monailabel_xflow.testing import RecordingSegmenter, ScriptedPolicy, ScriptedSegmenter, ellipse
from monailabel_xflow.workflow.revision import read_action

H, W = 48, 64  # not square: a transposition changes shapes
BOX = (0.25, 0.5, 0.75, 1.0)
EFFUSION = Instruction("effusion", ("left lung",))


def radiograph(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((H, W)).astype(np.float32)


# --- segmenters -----------------------------------------------------------------------------


class _OfficialModelStandIn:
    """What ``OfficialSam3Segmenter`` calls on the ``sam3`` model: ``predict_inst`` answering
    the box (in original-image pixels, as the official predictor takes them) as a rectangle,
    squeezing a batch of one as the official predictor does."""

    def predict_inst(self, state, return_logits, box, multimask_output, normalize_coords, **kw):
        assert normalize_coords and return_logits
        h, w = state["shape"]
        m = 3 if multimask_output else 1
        logits = np.full((len(box), m, h, w), -4.0, np.float32)
        for i, (x1, y1, x2, y2) in enumerate(box):
            logits[i, :, int(round(y1)) : int(round(y2)), int(round(x1)) : int(round(x2))] = 4.0
        iou = np.tile(np.linspace(0.5, 0.9, m, dtype=np.float32), (len(box), 1))
        low = np.zeros((len(box), m, 256, 256), np.float32)
        if len(box) == 1:
            return logits[0], iou[0], low[0]
        return logits, iou, low


class _ProcessorStandIn:
    def set_image(self, pil: Image.Image):
        return {"shape": (pil.height, pil.width)}


def official_wrapper():
    from monailabel_xflow.segmenter.cache import EmbeddingCache
    from monailabel_xflow.segmenter.official import OfficialSam3Segmenter

    seg = object.__new__(OfficialSam3Segmenter)  # its constructor imports the sam3 package
    seg.model, seg.processor = _OfficialModelStandIn(), _ProcessorStandIn()
    seg.cache, seg.cache_tag, seg._state, seg._shape = EmbeddingCache(), "sam3-official:test", None, None
    return seg


SEGMENTERS = ["sam3-transformers", "sam3-zoomed", "official-wrapper", "scripted", "recording"]
DRAWS_THE_BOX = {"official-wrapper", "scripted", "recording"}  # masks follow the box exactly


@pytest.fixture(scope="module")
def tiny_segmenter(tiny_sam3):
    from monailabel_xflow.segmenter.cache import EmbeddingCache
    from monailabel_xflow.segmenter.loading import load_segmenter

    return load_segmenter(str(tiny_sam3), device="cpu", cache=EmbeddingCache())


@pytest.fixture(params=SEGMENTERS)
def segmenter(request) -> tuple[str, PromptableSegmenter]:
    everything = np.ones((H, W), bool)
    if request.param == "sam3-transformers":
        return request.param, request.getfixturevalue("tiny_segmenter").fork()
    if request.param == "sam3-zoomed":
        from monailabel_xflow.segmenter.zoom import ZoomedSegmenter

        return request.param, ZoomedSegmenter(request.getfixturevalue("tiny_segmenter").fork())
    if request.param == "official-wrapper":
        return request.param, official_wrapper()
    if request.param == "scripted":
        return request.param, ScriptedSegmenter(everything, positive_radius_px=3, negative_radius_px=3)
    return request.param, RecordingSegmenter(ScriptedSegmenter(everything))


class TestSegmenterContract:
    def test_implements_the_protocol(self, segmenter):
        assert isinstance(segmenter[1], PromptableSegmenter)

    def test_shapes_and_dtypes(self, segmenter):
        _, seg = segmenter
        seg.set_image(radiograph())
        clicks = [[Click(True, 0.5, 0.75), Click(False, 0.3, 0.9)], []]
        res = seg.predict([BOX, (0.0, 0.0, 0.5, 0.5)], clicks=clicks)
        assert len(res) == 2
        assert res.logits.shape == res.masks.shape == (2, H, W)
        assert res.logits.dtype == np.float32 and res.masks.dtype == bool and res.iou.dtype == np.float32
        np.testing.assert_array_equal(res.masks, res.logits > 0)
        assert res.iou.shape == (2,) and np.isfinite(res.iou).all()
        assert res.low_res_logits.ndim == 4 and res.low_res_logits.shape[:2] == (2, 1)
        assert res.low_res_logits.dtype == np.float32
        again = seg.predict([BOX, BOX], clicks=clicks, previous=res.low_res_logits, multimask=True)
        assert again.masks.shape == (2, H, W) and again.low_res_logits.shape == res.low_res_logits.shape

    def test_no_boxes_is_an_empty_batch(self, segmenter):
        _, seg = segmenter
        seg.set_image(radiograph())
        res = seg.predict([])
        assert len(res) == 0 and res.masks.shape == (0, H, W) and res.low_res_logits.shape[:2] == (0, 1)

    def test_coordinates_x_right_y_down(self, segmenter):
        name, seg = segmenter
        if name not in DRAWS_THE_BOX:
            pytest.skip("random weights: the mask does not follow the box (prompt scaling: TestPromptBuilder)")
        seg.set_image(radiograph())
        mask = seg.predict([BOX]).masks[0]
        np.testing.assert_array_equal(mask, box_to_mask(BOX, (H, W)))
        assert mask[H - 1, W // 2] and not mask[0, W // 2] and not mask[H - 1, 0]

    @pytest.mark.parametrize(
        "bad",
        [
            np.zeros((H, W, 4), np.float32),
            np.full((H, W), 2.0, np.float32),
            np.full((H, W), np.nan, np.float32),
            np.zeros((1, 1), np.float32),
            np.zeros((H, W), np.int32),
        ],
    )
    def test_bad_images(self, segmenter, bad):
        with pytest.raises(SegmenterInputError):
            segmenter[1].set_image(bad)

    def test_predict_needs_an_image(self, segmenter):
        with pytest.raises(RuntimeError, match="set_image"):
            segmenter[1].predict([BOX])

    @pytest.mark.parametrize(
        "kwargs, error, match",
        [
            ({"boxes": [(0.5, 0.5, 0.2, 0.9)]}, GeometryError, "not ordered"),
            ({"boxes": [(0.1, 0.1, 1.5, 0.9)]}, GeometryError, "normalised"),
            ({"boxes": [(0.1, 0.1, 0.5)]}, GeometryError, "4 values"),
            ({"boxes": [BOX], "clicks": [[Click(True, 1.2, 0.5)]]}, GeometryError, "outside the image"),
            ({"boxes": [BOX, BOX], "clicks": [[]]}, SegmenterInputError, "one list per box"),
            ({"boxes": [], "clicks": [[Click(True, 0.5, 0.5)]]}, SegmenterInputError, "without boxes"),
            ({"boxes": [BOX], "previous": np.zeros((2, 1, 8, 8), np.float32)}, SegmenterInputError, "previous"),
            ({"boxes": [BOX], "previous": np.full((1, 1, 8, 8), np.nan, np.float32)}, SegmenterInputError, "NaN"),
        ],
    )
    def test_bad_prompts(self, segmenter, kwargs, error, match):
        _, seg = segmenter
        seg.set_image(radiograph())
        with pytest.raises(error, match=match):
            seg.predict(**kwargs)

    def test_fork_is_independent(self, segmenter):
        _, seg = segmenter
        seg.set_image(radiograph(0))
        before = seg.predict([BOX])
        twin = seg.fork()
        assert isinstance(twin, PromptableSegmenter) and twin is not seg
        with pytest.raises(RuntimeError, match="set_image"):  # a fork starts with no image
            twin.predict([BOX])
        twin.set_image(radiograph(1))
        twin.predict([(0.0, 0.0, 0.5, 0.5)])
        after = seg.predict([BOX])  # the parent still answers about its own image
        np.testing.assert_array_equal(after.masks, before.masks)
        np.testing.assert_allclose(after.logits, before.logits, atol=1e-5)


class TestPromptBuilder:
    def test_layout_and_padding(self):
        clicks = [[Click(True, 0.5, 0.25), Click(False, 0.1, 0.2)], []]
        p = build_prompts([BOX, (0.0, 0.0, 1.0, 1.0)], clicks)
        assert p.boxes.shape == (2, 4) and p.points.shape == (2, 2, 2) and p.labels.shape == (2, 2)
        np.testing.assert_array_equal(p.labels, [[1, 0], [PAD_LABEL, PAD_LABEL]])
        np.testing.assert_array_equal(p.points[0], [[0.5, 0.25], [0.1, 0.2]])  # (x, y)
        assert build_prompts([BOX]).labels.shape == (1, 0) and build_prompts([BOX]).previous is None

    def test_sam3_kwargs_scale_x_and_y_to_the_input_square(self):
        import torch

        from monailabel_xflow.segmenter.sam3 import sam3_prompt_kwargs

        prev = np.zeros((1, 1, 4, 4), np.float32)
        kw = sam3_prompt_kwargs(build_prompts([BOX], [[Click(False, 0.5, 0.25)]], prev), 1008, "cpu", torch.float32)
        assert kw["input_boxes"].tolist() == [[[252.0, 504.0, 756.0, 1008.0]]]
        assert kw["input_points"].tolist() == [[[[504.0, 252.0]]]] and kw["input_labels"].tolist() == [[[0]]]
        assert kw["input_points"].dtype == torch.float32 and kw["input_labels"].dtype == torch.int64
        assert tuple(kw["input_masks"].shape) == (1, 1, 4, 4)
        assert set(sam3_prompt_kwargs(build_prompts([BOX]), 1008, "cpu")) == {"input_boxes"}


# --- policies -------------------------------------------------------------------------------

POLICIES = ["vlm", "oracle", "oracle-exact", "scripted"]
GT = ellipse((H, W), 36, 40, 8, 12)


@pytest.fixture(scope="module")
def tiny_policy(tiny_vlm):
    import torch

    from monailabel_xflow.policy.vlm import GenerationSettings, VLMPolicy

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield VLMPolicy.from_pretrained(
        tiny_vlm.base, tiny_vlm.init, tiny_vlm.rev, device="cpu", generation=GenerationSettings(max_new_tokens=6)
    )
    torch.set_num_threads(threads)


@pytest.fixture(params=POLICIES)
def policy(request):
    if request.param == "vlm":
        return request.param, request.getfixturevalue("tiny_policy")
    if request.param.startswith("oracle"):
        return request.param, OracleRevisionPolicy(GT, exact=request.param == "oracle-exact")
    return request.param, ScriptedPolicy(["<answer>no</answer>"] * 8, [["<click>positive (0.5, 0.8)</click>"]] * 2)


def state(step: int = 0, mask: np.ndarray | None = None) -> RevisionState:
    image = radiograph()
    shown = box_to_mask((0.5, 0.6, 0.7, 0.9), (H, W))
    mask = shown if mask is None else mask
    return RevisionState(image, EFFUSION, BOX, mask, [], render_observation(image, shown, []), step)


class TestPolicyContract:
    def test_implements_the_protocols(self, policy):
        name, pol = policy
        assert isinstance(pol, RevisionPolicy)
        # the oracle answers Stage 2 only (it knows the ground truth, not the image)
        assert isinstance(pol, Stage1Policy) == (not name.startswith("oracle"))

    def test_stage1_answers_text_per_instruction(self, policy):
        name, pol = policy
        if not isinstance(pol, Stage1Policy):
            pytest.skip(f"{name} is no Stage 1 policy")
        assert isinstance(pol.stage1(radiograph(), EFFUSION), str)
        many = pol.stage1_many(radiograph(), [EFFUSION, parse_instruction("Segment the edema.")])
        assert len(many) == 2 and all(isinstance(t, str) for t in many)

    def test_session_answers_a_readable_stage2_answer(self, policy):
        name, pol = policy
        session = pol.start(radiograph(), EFFUSION, BOX)
        assert isinstance(session, RevisionSession)
        raw = session.step(state())
        assert isinstance(raw, Stage2Action) == (name == "oracle-exact")
        assert isinstance(raw, (str, Stage2Action))
        click, action, _ = read_action(raw)
        assert action in ("click", "stop", "malformed")
        if click is not None:
            assert 0.0 <= click.x <= 1.0 and 0.0 <= click.y <= 1.0

    def test_bad_input_is_an_input_error(self, policy):
        name, pol = policy
        if name.startswith("oracle"):  # it reads the mask against its ground truth
            with pytest.raises(OracleError, match="shape"):
                pol.start(radiograph(), EFFUSION, BOX).step(state(mask=np.zeros((H + 1, W), bool)))
            return
        for bad in (np.full((H, W), 2.0, np.float32), np.zeros((H, W, 3), np.float32)):
            with pytest.raises(InputError):
                pol.stage1(bad, EFFUSION)
            with pytest.raises(InputError):
                pol.start(bad, EFFUSION, BOX)
        if name == "vlm":
            with pytest.raises(PolicyError, match="out of order"):
                pol.start(radiograph(), EFFUSION, BOX).step(state(step=1))

    def test_sessions_are_independent(self, policy):
        name, pol = policy
        first = pol.start(radiograph(), EFFUSION, BOX)
        first.step(state(0))
        second = pol.start(radiograph(), EFFUSION, BOX)
        second.step(state(0))  # its own turn 0, whatever the first session did
        first.step(state(1))  # and the first goes on from its own history
        if name == "vlm":
            assert len(first.texts) == 2 and len(second.texts) == 1


# --- one owner per concern: the click budget, specks, the readable sentence ------------------------


@pytest.mark.parametrize("value, expected", [(0, 0), (4, 4), (16, 16), ("3", 3), (" 2 ", 2), (np.int64(5), 5)])
def test_one_budget_rule_accepts(value, expected):
    from monailabel_xflow.policy.base import check_budget

    assert check_budget(value) == expected


@pytest.mark.parametrize("value", [-1, 17, 1.5, "many", None, "4.0"])
def test_one_budget_rule_refuses_everywhere(value):
    """The workflow, the models file and the oracle refuse the same budgets, each with its own error type."""
    from monailabel_xflow.policy.base import MAX_CLICKS, BudgetError, check_budget
    from monailabel_xflow.policy.oracle import OracleClicker, OracleError
    from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError
    from monailabel_xflow.workflow.xflow import XFlow

    assert MAX_CLICKS == 4  # the paper's T, everyone's default
    with pytest.raises(BudgetError, match="max_clicks"):
        check_budget(value)
    with pytest.raises(BudgetError, match="max_clicks"):
        XFlow(ScriptedPolicy(), None, ScriptedSegmenter(np.zeros((8, 8), bool)), max_clicks=value)
    with pytest.raises(ModelConfigError, match="max_clicks"):
        ModelConfig(max_clicks=value)
    with pytest.raises(OracleError, match="max_clicks"):
        OracleClicker(max_clicks=value)


def test_one_speck_rule():
    from monailabel_xflow import metrics
    from monailabel_xflow.geometry import SPECK_FRACTION, speck_area_px

    assert metrics.SPECK_FRACTION is SPECK_FRACTION == 0.001
    assert speck_area_px((1000, 2000)) == 2000
    gt = np.zeros((100, 100), bool)
    gt[10:40, 10:40] = True
    pred = gt.copy()
    pred[80, 80:89] = True  # 9 px < 0.1 % of 10,000 px: a speck
    pred[60:64, 80:84] = True  # 16 px: not a speck
    stats = metrics.sample_stats(pred, gt)
    assert stats.pred_specks == 1 and stats.pred_speck_area == 9


def test_one_readable_sentence():
    instr = Instruction("effusion", ("left lung",))
    assert instr.message("", 2, 5120) == "Segmented the effusion in the left lung (2 regions, 5120 px)."
    assert (
        Instruction("opacity", ("right lung",)).message("", 1, 7)
        == "Segmented the opacity in the right lung (1 region, 7 px)."
    )
    assert instr.message("There is no effusion in the left lung.", 0, 0) == "There is no effusion in the left lung."
