"""F_seg fine-tuning: loss, optimiser groups, prompt sampling, a smoke run (the learning check is in
test_learning.py)."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from monailabel_xflow.geometry import box_to_mask
from monailabel_xflow.training.config import SegmenterTrainConfig
from monailabel_xflow.training.segmenter import (
    SegSample,
    finetune_segmenter,
    param_groups,
    sam2_loss,
    sample_prompt,
    samples_from_cases,
)

SAMPLE = Path(__file__).resolve().parents[1] / "sample-data"


def _ellipse(h=128, w=160, cy=60, cx=70, ry=20, rx=30):
    yy, xx = np.mgrid[:h, :w]
    mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 < 1
    image = np.full((h, w), 0.3, np.float32)
    image[mask] = 0.8
    return SegSample(image, mask)


def test_sam2_loss_supervises_the_best_hypothesis():
    import torch

    target = torch.zeros(8, 8)
    target[2:6, 2:6] = 1
    good = target * 20 - 10  # confident and right
    bad = -good
    low_res = torch.stack([bad, good, bad]).requires_grad_(True)
    iou_pred = torch.tensor([0.0, 1.0, 0.0], requires_grad=True)
    loss, parts = sam2_loss(low_res, iou_pred, target, SegmenterTrainConfig())
    loss.backward()
    assert parts["dice"] < 0.05 and parts["iou"] < 1e-6
    assert low_res.grad[0].abs().sum() == 0 and low_res.grad[2].abs().sum() == 0
    assert low_res.grad[1].abs().sum() > 0


def test_layer_decay_groups():
    from monailabel_xflow.segmenter.configs import build_sam3_tracker

    model = build_sam3_tracker("tiny")
    cfg = SegmenterTrainConfig()
    groups = param_groups(model, cfg)
    lr_of = {id(p): g["lr"] for g in groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert lr_of[id(params["mask_decoder.iou_prediction_head.proj_in.weight"])] == pytest.approx(1e-4)
    depth = model.config.vision_config.backbone_config.num_hidden_layers  # 2 in the tiny config
    first = lr_of[id(params["vision_encoder.backbone.layers.0.attention.q_proj.weight"])]
    last = lr_of[id(params[f"vision_encoder.backbone.layers.{depth - 1}.attention.q_proj.weight"])]
    embed = lr_of[id(params["vision_encoder.backbone.embeddings.patch_embeddings.projection.weight"])]
    assert last == pytest.approx(1e-4 * 0.6)
    assert first == pytest.approx(1e-4 * 0.6 * 0.9 ** (depth - 1))
    assert embed == pytest.approx(1e-4 * 0.6 * 0.9**depth)
    assert sum(len(g["params"]) for g in groups) == len(params)


def test_prompts_are_sampled_around_the_mask():
    s = _ellipse()
    rng = np.random.default_rng(0)
    for _ in range(20):
        box, clicks = sample_prompt(s.mask, rng, jitter=0.1, max_points=3)
        inside_box = box_to_mask(box, s.mask.shape)
        assert (inside_box & s.mask).sum() > 0.8 * s.mask.sum()
        assert len(clicks) <= 3
        for c in clicks:
            r, col = int(c.y * s.mask.shape[0]), int(c.x * s.mask.shape[1])
            assert s.mask[r, col] == c.positive


def test_samples_from_phantom_cases():
    from monailabel_xflow.data.readers import read_mimic_ils

    cases = read_mimic_ils(SAMPLE / "ground-truth" / "mimic_ils.json", split="val").cases
    samples = samples_from_cases(cases, progress=False)
    positives = [c for c in cases if c.positive]
    assert len(samples) >= len(positives)
    assert all(s.image.shape == s.mask.shape and s.mask.any() for s in samples)


def test_finetune_smoke_loss_drops_and_checkpoint_loads(tiny_sam3, tmp_path):
    from monailabel_xflow.segmenter.loading import load_segmenter

    base = tiny_sam3
    cfg = SegmenterTrainConfig(effective_batch=1, max_steps=8, learning_rate=2e-3, points_per_prompt=0, box_jitter=0.0)
    result = finetune_segmenter(base, [_ellipse()], tmp_path / "ft", cfg, progress=False)
    losses = result["losses"]
    assert result["steps"] == 8 and np.isfinite(losses).all()
    assert losses[-1] < losses[0]  # one fixed example: the loss must fall
    seg = load_segmenter(str(tmp_path / "ft"))
    seg.set_image(_ellipse().image)
    assert seg.predict([(0.1, 0.1, 0.7, 0.8)]).masks.shape == (1, 128, 160)


def test_revision_aware_prompts_are_stage2s_prompts(tiny_sam3):
    """Simulated Stage 2 turns: box-only first, then the oracle's clicks accumulate with the
    previous single-mask logits as mask input, and the supervised last turn trains the mask-input
    pathway (which plain box/click prompts never reach)."""
    import torch

    from monailabel_xflow.policy.oracle import OracleClicker
    from monailabel_xflow.segmenter.sam3 import Sam3Segmenter, load_tracker_model
    from monailabel_xflow.training.segmenter import _revision_loss, _target_grid

    model = load_tracker_model(tiny_sam3)
    prep = Sam3Segmenter(model, device="cpu", dtype=torch.float32, cache_tag="test")
    sample = _ellipse()
    calls = []
    forward = model.forward

    def spy(*args, **kwargs):
        calls.append(
            {k: (tuple(v.shape) if hasattr(v, "shape") else None) for k, v in kwargs.items() if k.startswith("input_")}
            | {"grad": torch.is_grad_enabled()}
        )
        return forward(*args, **kwargs)

    model.forward = spy
    out = model(
        pixel_values=prep.preprocess(sample.image),
        input_boxes=torch.tensor([[[10.0, 10.0, 200.0, 200.0]]]),
        multimask_output=True,
    )
    calls.clear()
    target = _target_grid(sample.mask, out.pred_masks.shape[-2:])
    cfg = SegmenterTrainConfig(revision_clicks=3)
    loss = _revision_loss(
        model, out.image_embeddings, sample, np.random.default_rng(3), cfg, prep.input_size, target, OracleClicker()
    )
    assert calls[0].keys() == {"input_boxes", "grad"} and not calls[0]["grad"]  # M_0: the box alone
    clicked = calls[1:]
    assert clicked and clicked[-1]["grad"] and not any(c["grad"] for c in clicked[:-1])
    low_res = tuple(out.pred_masks.shape[-2:])
    for k, c in enumerate(clicked, start=1):  # turn k: k clicks, the previous turn's logits
        assert c["input_points"] == (1, 1, k, 2) and c["input_labels"] == (1, 1, k)
        assert c["input_masks"] == (1, 1) + low_res
    assert torch.isfinite(loss) and loss > 0
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if n.startswith("prompt_encoder.mask_embed.")}
    assert grads and any(g is not None and g.abs().sum() > 0 for g in grads.values())


def test_revision_aware_training_is_off_by_default_and_runs_when_asked(tiny_sam3, tmp_path):
    assert SegmenterTrainConfig().revision_clicks == 0  # the paper's Table 7 recipe is unchanged
    base = tiny_sam3
    plain = SegmenterTrainConfig(effective_batch=1, max_steps=3, learning_rate=2e-3, points_per_prompt=0)
    aware = SegmenterTrainConfig(
        effective_batch=1, max_steps=3, learning_rate=2e-3, points_per_prompt=0, revision_clicks=2, revision_prob=1.0
    )
    a = finetune_segmenter(base, [_ellipse()], tmp_path / "a", plain, progress=False)["losses"]
    b = finetune_segmenter(base, [_ellipse()], tmp_path / "b", aware, progress=False)["losses"]
    assert np.isfinite(b).all() and b[0] > a[0]  # the same first prompt plus a supervised revision turn


def test_error_clicks_come_from_the_error_region():
    from monailabel_xflow.geometry import point_to_pixel
    from monailabel_xflow.policy.oracle import OracleClicker
    from monailabel_xflow.training.segmenter import error_click

    gt = _ellipse().mask
    mask = np.zeros_like(gt)
    mask[50:90, 40:120] = True  # misses part of gt and covers some of the background
    rng = np.random.default_rng(0)
    clicker = OracleClicker()
    polarities = set()
    for _ in range(50):
        c = error_click(mask, gt, rng, clicker, (), oracle_prob=0.0)  # SAM's uniform rule
        r, col = point_to_pixel(c.x, c.y, gt.shape)
        assert mask[r, col] != gt[r, col] and c.positive == gt[r, col]
        polarities.add(c.positive)
    assert polarities == {True, False}
    assert error_click(mask, gt, rng, clicker, (), oracle_prob=1.0) == clicker.next_click(mask, gt)
    assert error_click(gt.copy(), gt, rng, clicker, (), oracle_prob=0.5) is None  # nothing wrong


def _spied_session(tiny_sam3, cfg):
    """One :func:`interactive_loss` session on an ellipse with every decoder call's prompt inputs
    recorded: ``(loss, ious, calls, model)``."""
    import torch

    from monailabel_xflow.policy.oracle import OracleClicker
    from monailabel_xflow.segmenter.sam3 import Sam3Segmenter, load_tracker_model
    from monailabel_xflow.training.segmenter import _target_grid, interactive_loss

    model = load_tracker_model(tiny_sam3)
    prep = Sam3Segmenter(model, device="cpu", dtype=torch.float32, cache_tag="test")
    sample = _ellipse()
    embeddings = model.get_image_embeddings(prep.preprocess(sample.image))
    calls = []
    forward = model.forward

    def spy(*args, **kwargs):
        calls.append(
            {k: v.detach().clone() for k, v in kwargs.items() if k.startswith("input_")}
            | {"grad": torch.is_grad_enabled()}
        )
        return forward(*args, **kwargs)

    model.forward = spy
    target = _target_grid(sample.mask, (288, 288))
    loss, ious = interactive_loss(
        model, embeddings, sample, np.random.default_rng(1), cfg, prep.input_size, target, OracleClicker()
    )
    return loss, ious, calls, model


@pytest.mark.parametrize("click_start", [0.0, 1.0])
def test_interactive_rounds_feed_back_logits_and_supervise_every_round(tiny_sam3, click_start):
    """SAM's recipe: a first prompt (a box, or one positive click whose point is the box), then
    one click per round from the error region, every click so far and the previous round's
    logits as mask input, each round's output supervised (all with gradients)."""
    import torch

    cfg = SegmenterTrainConfig(interactive_rounds=3, interactive_click_start=click_start)
    loss, ious, calls, model = _spied_session(tiny_sam3, cfg)
    assert len(calls) == len(ious) == 4 and all(c["grad"] for c in calls)
    first = calls[0]
    assert "input_masks" not in first
    if click_start:  # one positive click, the box its point
        assert first["input_points"].shape == (1, 1, 1, 2) and int(first["input_labels"][0, 0, 0]) == 1
        box = first["input_boxes"][0, 0]
        assert box[0] == box[2] and box[1] == box[3]
    else:
        assert "input_points" not in first
    start = 1 if click_start else 0
    for k, c in enumerate(calls[1:], start=1):
        assert c["input_points"].shape[2] == start + k  # every click so far
        assert c["input_masks"].shape == (1, 1, 288, 288)  # the previous round's logits
        before = calls[k - 1].get("input_points")
        if before is not None:  # the earlier clicks, unchanged and in order
            assert torch.equal(c["input_points"][0, 0, : before.shape[2]], before[0, 0])
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if n.startswith("prompt_encoder.mask_embed.")]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)  # the mask-input pathway learns


def test_interactive_mask_dropout_leaves_out_the_previous_logits(tiny_sam3):
    """With ``interactive_mask_dropout`` = 1 every click round is a client's request: every click
    so far and no mask; 0 keeps the logits in every round (the test above)."""
    cfg = SegmenterTrainConfig(interactive_rounds=3, interactive_click_start=0.0, interactive_mask_dropout=1.0)
    _, _, calls, _ = _spied_session(tiny_sam3, cfg)
    assert len(calls) == 4 and all("input_masks" not in c for c in calls)
    assert all("input_points" in c for c in calls[1:])


def test_click_loss_asks_for_the_truth_under_the_clicks_only():
    """The click term is the cross-entropy of the few pixels near a click: it is large where the
    logits contradict the truth there, small where they agree, whatever the rest of the grid holds."""
    import torch

    from monailabel_xflow.geometry import Click
    from monailabel_xflow.training.segmenter import CLICK_LOSS_RADIUS, click_loss

    target = torch.zeros(32, 32)
    target[8:24, 8:24] = 1.0
    inside, outside = Click(True, 0.5, 0.5), Click(False, 0.05, 0.05)
    wrong = torch.full((1, 32, 32), -6.0)  # background everywhere: the positive click is contradicted
    right = (target * 12 - 6)[None]  # the truth everywhere
    assert click_loss(wrong, target, []) == 0
    assert click_loss(wrong, target, [inside]) > 5.0
    assert click_loss(right, target, [inside, outside]) < 0.01
    # only the disc matters: spoil everything but the pixels near the click
    spoilt = -right.clone()
    r = int(CLICK_LOSS_RADIUS) + 1
    spoilt[0, 16 - r : 16 + r, 16 - r : 16 + r] = right[0, 16 - r : 16 + r, 16 - r : 16 + r]
    assert click_loss(spoilt, target, [inside]) < 0.01
    assert click_loss(wrong, target, [outside]) < 0.01  # a negative click on background, answered right


def test_interactive_click_weight_adds_the_click_term(tiny_sam3):
    """Same session, same draws: with ``interactive_click_weight`` the loss grows by the click term
    of the click rounds (the untrained model contradicts its clicks)."""
    base = SegmenterTrainConfig(interactive_rounds=2, interactive_click_start=0.0)
    plain, _, _, _ = _spied_session(tiny_sam3, base)
    weighted, _, _, _ = _spied_session(tiny_sam3, replace(base, interactive_click_weight=5.0))
    assert float(weighted) > float(plain) + 1e-3
    with pytest.raises(ValueError, match="interactive_click_weight"):
        from monailabel_xflow.training.segmenter import finetune_segmenter

        finetune_segmenter(tiny_sam3, [_ellipse()], "/nonexistent", replace(base, interactive_click_weight=-1.0))
