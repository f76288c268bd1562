"""Fine-tuning F_seg (the SAM3 tracker head and its image encoder) on masks.

The recipe is the XFlow paper's (Appendix A.4, Table 7): the SAM 2 loss
``20 * focal + dice + IoU-prediction MSE`` over three mask hypotheses per prompt, supervising only
the hypothesis with the lowest mask loss (plus the same loss on the single-mask output, which is
what :class:`~monailabel_xflow.segmenter.sam3.Sam3Segmenter` returns for a box prompt); AdamW with
the image encoder unfrozen at 0.6x the
decoder rate and a layer-wise decay of 0.9 along the trunk; weight decay 0.1; gradient clip 0.1.

Prompts are sampled the way the policies produce them: a box around one ground-truth component,
each edge jittered by up to ``box_jitter`` of the box size, plus 0..``points_per_prompt`` clicks
(positive inside the component, negative inside the box but outside it).

Revision-aware prompts (``revision_clicks > 0``; off in the paper's defaults): Stage 2 calls F_seg
with the box, every click so far and the previous turn's low-resolution logits as mask input, an
input the plain prompts above never show it (a random mask-input pathway turned clicks into noise
in the phantom demo). With probability ``revision_prob`` a prompt therefore also simulates 1..
``revision_clicks`` Stage 2 turns from a box-only mask (box jittered by ``revision_box_jitter``):
each turn Algorithm 1's oracle (:class:`~monailabel_xflow.policy.oracle.OracleClicker`) clicks the
deepest point of the larger error, a positive click outside the box grows it
(:func:`~monailabel_xflow.geometry.grow_box`), and the decoder reruns with the previous logits; the
turns before the last run without gradients, the last one's single-mask output adds its SAM 2 loss.

Interactive training (``interactive_rounds > 0``; off in the paper's defaults), SAM's recipe
(Kirillov et al. 2023, §3 and App. A; SAM 2 alike): every prompt also simulates a whole interactive
session on its sample. The first prompt is a jittered box or, with probability
``interactive_click_start``, one positive click whose point is the box (the click tool's rule for
a person's clicks without a box, :meth:`XFlow.revise
<monailabel_xflow.workflow.xflow.XFlow.revise>`); then ``interactive_rounds`` rounds each add one
click drawn from the current prediction's error region (:func:`error_click`: the oracle's deepest
error pixel with probability ``interactive_oracle_prob``, else a pixel drawn uniformly from the
missed and over-segmented pixels, positive when it is missed), grow the box as Stage 2 does, and
feed the previous round's single-mask low-resolution logits back as mask input (detached, as SAM
does; with probability ``interactive_mask_dropout`` a round gets none, as a client's click request
carries every click but no mask). Every round's single-mask output gets the SAM 2 loss, plus,
with ``interactive_click_weight``, a cross-entropy on the pixels near its clicks (:func:`click_loss`),
and their mean is added to the prompt's loss (:func:`interactive_loss`). The prompts go through :func:`build_prompts
<monailabel_xflow.segmenter.base.build_prompts>` and :func:`sam3_prompt_kwargs
<monailabel_xflow.segmenter.sam3.sam3_prompt_kwargs>`, as in inference.

Zoom-in (``zoom_prob > 0``; off by default): that share of samples is cropped to the window a
:class:`~monailabel_xflow.segmenter.zoom.ZoomedSegmenter` would segment their jittered box in
(:func:`~monailabel_xflow.segmenter.zoom.zoom_sample`, the same window rule), the rest stay whole
images for its coarse pass; the saved folder is marked as zooming (``xflow_segmenter.json``), and
a zooming model trained further keeps learning both (``segmenter.zoom.ZOOM_PROB``).

Frozen encoder (``freeze_encoder``; off by default): only the prompt encoder and the mask decoder
learn, and each image is encoded once, without gradients, and its embedding kept for the run (as
decoder-only SAM adaptations do; it makes a CPU step a few decoder passes).

Loss resolution: the decoder's low-resolution logits (288 x 288 for the 1008-px input) are
compared with the ground truth resized to that grid, which keeps a CPU step cheap; the mask is
upsampled for inference only.

The result is a Hugging Face folder that :func:`monailabel_xflow.segmenter.loading.load_segmenter` reads.
Under ``accelerate launch`` the same loop runs data-parallel (gradients all-reduced by accelerate).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from monailabel_xflow.geometry import (
    MIN_COMPONENT_PX,
    Box,
    Click,
    make_box,
    mask_to_box,
    pixel_to_point,
    resize_mask,
)
from monailabel_xflow.segmenter.base import build_prompts
from monailabel_xflow.segmenter.sam3 import sam3_prompt_kwargs
from monailabel_xflow.segmenter.zoom import ZOOM_PROB, read_view, write_view, zoom_sample
from monailabel_xflow.training.config import SegmenterTrainConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


@dataclass
class SegSample:
    """One training example: an ``(H, W)`` float image in [0, 1] and one component's bool mask."""

    image: np.ndarray
    mask: np.ndarray


def samples_from_cases(cases: Iterable, min_px: int = MIN_COMPONENT_PX, progress: bool = True) -> list[SegSample]:
    """One :class:`SegSample` per ground-truth component of every positive case.

    Args:
        cases: ``EvalCase`` objects (:mod:`monailabel_xflow.data.readers`); negatives are skipped.
        min_px: components smaller than this (mask pixels) are specks, not lesions.
    """
    from tqdm.auto import tqdm

    from monailabel_xflow.geometry import connected_components
    from monailabel_xflow.transforms import load_cxr

    samples = []
    for case in tqdm(list(cases), desc="reading F_seg samples", disable=not progress):
        mask = case.load_mask()
        if mask is None or not mask.any():
            continue
        image, _ = load_cxr(case.image_path)
        for comp in connected_components(resize_mask(mask, image.shape), min_area_px=min_px):
            samples.append(SegSample(image, comp))
    return samples


def sample_prompt(
    mask: np.ndarray, rng: np.random.Generator, jitter: float, max_points: int
) -> tuple[Box, list[Click]]:
    """A jittered box around ``mask`` and up to ``max_points`` clicks (see the module docstring)."""
    tight = mask_to_box(mask)
    if tight is None:
        raise ValueError("sample_prompt needs a non-empty mask")
    x1, y1, x2, y2 = tight
    w, h = x2 - x1, y2 - y1
    d = rng.uniform(-jitter, jitter, size=4) * np.array([w, h, w, h])
    box = make_box(x1 + d[0], y1 + d[1], x2 + d[2], y2 + d[3])
    clicks: list[Click] = []
    inside = np.argwhere(mask)
    from monailabel_xflow.geometry import box_to_mask

    outside = np.argwhere(box_to_mask(box, mask.shape) & ~mask)
    for _ in range(int(rng.integers(0, max_points + 1))):
        positive = outside.size == 0 or rng.random() < 0.5
        pool = inside if positive else outside
        r, c = pool[rng.integers(len(pool))]
        clicks.append(Click(bool(positive), *pixel_to_point(r, c, mask.shape)))
    return box, clicks


def sam2_loss(low_res: torch.Tensor, iou_pred: torch.Tensor, target: torch.Tensor, cfg: SegmenterTrainConfig):
    """SAM 2 loss of one prompt's hypotheses.

    Args:
        low_res: ``(M, h, w)`` mask logits of the M hypotheses.
        iou_pred: ``(M,)`` predicted IoU of each hypothesis.
        target: ``(h, w)`` float 0/1 ground truth on the logits' grid.

    Returns:
        ``(total, parts)``: the loss of the lowest-mask-loss hypothesis and a dict of floats.
    """
    import torch
    import torch.nn.functional as F

    t = target.expand_as(low_res)
    prob = low_res.sigmoid()
    # Focal loss (alpha 0.25, gamma 2), mean over pixels, as in SAM 2.
    ce = F.binary_cross_entropy_with_logits(low_res, t, reduction="none")
    p_t = prob * t + (1 - prob) * (1 - t)
    focal = ((0.25 * t + 0.75 * (1 - t)) * ce * (1 - p_t) ** 2).flatten(1).mean(1)
    inter = (prob * t).flatten(1).sum(1)
    dice = 1 - (2 * inter + 1) / (prob.flatten(1).sum(1) + t.flatten(1).sum(1) + 1)
    mask_loss = cfg.focal_weight * focal + cfg.dice_weight * dice
    best = int(torch.argmin(mask_loss.detach()))
    pred = (low_res[best] > 0).float()
    union = ((pred + target) > 0).float().sum()
    actual_iou = (pred * target).sum() / union.clamp(min=1)
    iou_loss = F.mse_loss(iou_pred[best], actual_iou.detach())
    total = mask_loss[best] + cfg.iou_weight * iou_loss
    return total, {
        "focal": float(focal[best].detach()),
        "dice": float(dice[best].detach()),
        "iou": float(iou_loss.detach()),
    }


def param_groups(model: Any, cfg: SegmenterTrainConfig) -> list[dict]:
    """AdamW groups: decoder and prompt encoder at the base rate; the image encoder at
    ``encoder_lr_scale`` x the base rate x ``layer_decay ** (depth - layer)`` (the neck and the
    last block decay least, the patch embedding most). Norms and biases get no weight decay."""
    depth = int(model.config.vision_config.backbone_config.num_hidden_layers)
    groups: dict[tuple[float, float], list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        lr = cfg.learning_rate
        if name.startswith("vision_encoder."):
            if ".layers." in name:
                layer = int(name.split(".layers.")[1].split(".")[0]) + 1
            elif ".embeddings." in name:
                layer = 0
            else:  # final norm, FPN neck
                layer = depth
            lr *= cfg.encoder_lr_scale * cfg.layer_decay ** (depth - layer)
        wd = 0.0 if p.ndim <= 1 or "norm" in name or "embedding" in name else cfg.weight_decay
        groups.setdefault((lr, wd), []).append(p)
    return [{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in groups.items()]


def _target_grid(mask: np.ndarray, size: Sequence[int]) -> torch.Tensor:
    import torch
    import torch.nn.functional as F

    m = torch.from_numpy(mask.astype(np.float32))[None, None]
    return (F.interpolate(m, size=tuple(size), mode="area")[0, 0] >= 0.5).float()


def _revision_loss(
    model: Any,
    embeddings: Any,
    sample: SegSample,
    rng: np.random.Generator,
    cfg: SegmenterTrainConfig,
    input_size: int,
    target: torch.Tensor,
    clicker: Any,
) -> torch.Tensor:
    """SAM 2 loss of the last of 1..``cfg.revision_clicks`` simulated Stage 2 turns on one sample.

    The prompts are built exactly as :meth:`~monailabel_xflow.segmenter.sam3.Sam3Segmenter.predict`
    builds them in Stage 2 (``XFlow._revise_lesion``): box, all clicks so far, the previous
    single-mask low-res logits ``(1, 1, h, w)`` as ``input_masks``.

    Args:
        model: the tracker being trained.
        embeddings: the image embeddings of the prompt's forward pass (with their graph).
        sample: the image and ground-truth component.
        target: ``(h, w)`` ground truth on the logits' grid.
        clicker: an :class:`~monailabel_xflow.policy.oracle.OracleClicker`.

    Returns:
        A scalar loss (0 when the box-only mask leaves no admissible click).
    """
    import torch
    import torch.nn.functional as F

    from monailabel_xflow.geometry import grow_box

    box, _ = sample_prompt(sample.mask, rng, cfg.revision_box_jitter, 0)
    detached = [e.detach() for e in embeddings] if isinstance(embeddings, (list, tuple)) else embeddings.detach()
    device = target.device

    def decode(emb: Any, box: Box, clicks: Sequence[Click], previous: torch.Tensor | None):
        kwargs: dict[str, Any] = sam3_prompt_kwargs(build_prompts([box], [list(clicks)]), input_size, device)
        if previous is not None:
            kwargs["input_masks"] = previous
        return model(image_embeddings=emb, multimask_output=False, **kwargs)

    with torch.no_grad():
        previous = decode(detached, box, [], None).pred_masks[:, 0].float()  # (1, 1, h, w)
    clicks: list[Click] = []
    given = previous  # the logits the last click's turn receives as mask input
    turns = int(rng.integers(1, cfg.revision_clicks + 1))
    for _ in range(turns):
        if clicks:  # M_t of the clicks so far (no gradient: only the last turn is supervised)
            with torch.no_grad():
                previous = decode(detached, box, clicks, previous).pred_masks[:, 0].float()
        mask = (
            (F.interpolate(previous, size=sample.mask.shape, mode="bilinear", align_corners=False)[0, 0] > 0)
            .cpu()
            .numpy()
        )
        click = clicker.next_click(mask, sample.mask, clicks)
        if click is None:
            break
        clicks.append(click)
        box, given = grow_box(box, click), previous
    if not clicks:
        return torch.zeros((), device=device)
    out = decode(embeddings, box, clicks, given)
    loss, _ = sam2_loss(out.pred_masks[0, 0].float(), out.iou_scores[0, 0].float(), target, cfg)
    return loss


def error_click(
    mask: np.ndarray,
    gt: np.ndarray,
    rng: np.random.Generator,
    clicker: Any,
    previous: Sequence[Click] = (),
    oracle_prob: float = 0.5,
) -> Click | None:
    """One training click on the current prediction's error region.

    With probability ``oracle_prob`` the oracle's click (``clicker.next_click``: the deepest
    error pixel, the benchmark's and π_rev's teacher); otherwise, or when the oracle has no
    admissible pixel, a pixel drawn uniformly from ``gt XOR mask`` (SAM's rule), positive where
    ``gt`` holds. None when the prediction has no error.

    Args:
        mask: ``(H, W)`` bool current prediction.
        gt: ``(H, W)`` bool ground-truth component.
        rng: the only source of randomness.
        clicker: an :class:`~monailabel_xflow.policy.oracle.OracleClicker`.
        previous: clicks so far (the oracle's spacing guard).
        oracle_prob: share of oracle clicks.
    """
    if rng.random() < oracle_prob:
        click = clicker.next_click(mask, gt, previous)
        if click is not None:
            return click
    error = np.argwhere(mask != gt)
    if not len(error):
        return None
    r, c = error[rng.integers(len(error))]
    return Click(bool(gt[r, c]), *pixel_to_point(r, c, gt.shape))


CLICK_LOSS_RADIUS = 2.0
"""Radius, in low-res logit pixels, of the disc around a click that :func:`click_loss` covers
(2 of 96 for the demo's 336-px model: about 5 px of a 256-px phantom)."""


def click_loss(low_res: torch.Tensor, target: torch.Tensor, clicks: Sequence[Click]) -> torch.Tensor:
    """Binary cross-entropy on the pixels within :data:`CLICK_LOSS_RADIUS` of any click.

    A click says what the pixels under it are; the mask loss averages over the whole grid, where
    those few pixels weigh next to nothing. The pixels keep their true labels (a click on an
    edge covers both sides of it), so the term asks for the truth where the user pointed.

    Args:
        low_res: ``(1, h, w)`` single-mask logits.
        target: ``(h, w)`` float 0/1 ground truth on the same grid.
        clicks: the clicks of this round (normalised points).

    Returns:
        A scalar tensor; zero without clicks.
    """
    import torch
    import torch.nn.functional as F

    if not clicks:
        return low_res.sum() * 0.0
    h, w = target.shape
    rows = torch.arange(h, device=target.device, dtype=torch.float32)[:, None] + 0.5
    cols = torch.arange(w, device=target.device, dtype=torch.float32)[None, :] + 0.5
    near = torch.zeros((h, w), dtype=torch.bool, device=target.device)
    for c in clicks:
        near |= (rows - c.y * h) ** 2 + (cols - c.x * w) ** 2 <= CLICK_LOSS_RADIUS**2
    ce = F.binary_cross_entropy_with_logits(low_res[0], target, reduction="none")
    return ce[near].mean()


def interactive_loss(
    model: Any,
    embeddings: Any,
    sample: SegSample,
    rng: np.random.Generator,
    cfg: SegmenterTrainConfig,
    input_size: int,
    target: torch.Tensor,
    clicker: Any,
) -> tuple[torch.Tensor, list[float]]:
    """The mean SAM 2 loss over one simulated interactive session on ``sample`` (module docstring).

    Args:
        model: the tracker being trained.
        embeddings: the sample's image embeddings (with their graph: every round trains the encoder).
        sample: the image and ground-truth component.
        rng: prompt and click sampling.
        cfg: ``interactive_*`` fields and the loss weights.
        input_size: the model's square input side (prompt scaling).
        target: ``(h, w)`` ground truth on the logits' grid.
        clicker: an :class:`~monailabel_xflow.policy.oracle.OracleClicker`.

    Returns:
        ``(loss, ious)``: the mean over the first prompt and each click round, and each round's
        IoU on the logits' grid (for logging).
    """
    import torch
    import torch.nn.functional as F

    from monailabel_xflow.geometry import grow_box

    gt = np.asarray(sample.mask, bool)
    device = target.device
    clicks: list[Click] = []
    if rng.random() < cfg.interactive_click_start:
        first = error_click(np.zeros_like(gt), gt, rng, clicker, (), cfg.interactive_oracle_prob)
        assert first is not None  # gt is not empty
        box: Box = (first.x, first.y, first.x, first.y)
        clicks.append(first)
    else:
        box, _ = sample_prompt(gt, rng, cfg.interactive_box_jitter, 0)
    previous: np.ndarray | None = None
    losses, ious = [], []
    for round_ in range(cfg.interactive_rounds + 1):
        prompts = build_prompts([box], [list(clicks)], previous)
        out = model(
            image_embeddings=embeddings,
            multimask_output=False,
            **sam3_prompt_kwargs(prompts, input_size, device, torch.float32),
        )
        low = out.pred_masks[0, 0].float()  # (1, h, w)
        loss, _ = sam2_loss(low, out.iou_scores[0, 0].float(), target, cfg)
        if cfg.interactive_click_weight > 0:
            loss = loss + cfg.interactive_click_weight * click_loss(low, target, clicks)
        losses.append(loss)
        with torch.no_grad():
            pred = (low[0] > 0).float()
            ious.append(float((pred * target).sum() / ((pred + target) > 0).float().sum().clamp(min=1)))
        if round_ == cfg.interactive_rounds:
            break
        detached = low.detach()[None]  # (1, 1, h, w): the next round's mask input
        dropped = cfg.interactive_mask_dropout > 0 and rng.random() < cfg.interactive_mask_dropout
        previous = None if dropped else detached.cpu().numpy()
        mask = (F.interpolate(detached, size=gt.shape, mode="bilinear", align_corners=False)[0, 0] > 0).cpu().numpy()
        click = error_click(mask, gt, rng, clicker, clicks, cfg.interactive_oracle_prob)
        if click is None:
            break
        clicks.append(click)
        box = grow_box(box, click)
    return torch.stack(losses).mean(), ious


def finetune_segmenter(
    model_path: str | Path,
    samples: Sequence[SegSample],
    out_dir: str | Path,
    cfg: SegmenterTrainConfig | None = None,
    progress: bool = True,
    on_step: Callable[[int, int, float], None] | None = None,
) -> dict[str, Any]:
    """Fine-tune a Sam3Tracker checkpoint on ``samples`` and save it to ``out_dir``.

    Args:
        model_path: a Hugging Face folder (or anything ``load_tracker_model`` accepts).
        samples: training examples, one ground-truth component each (see :func:`samples_from_cases`).
        out_dir: where the fine-tuned model is saved (``save_pretrained``).
        cfg: hyperparameters; defaults are the paper's.
        progress: show a tqdm bar (rank 0 only).
        on_step: called on the main process after every optimiser step with
            ``(step, total_steps, loss)`` (e.g. to publish training progress).

    Returns:
        ``{"steps", "losses", "out_dir"}`` with the loss of every optimiser step.
    """
    import torch
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    from monailabel_xflow.segmenter.sam3 import Sam3Segmenter, load_tracker_model

    cfg = cfg or SegmenterTrainConfig()
    if not samples:
        raise ValueError("no training samples")
    if not 0 <= cfg.interactive_rounds <= 16:
        raise ValueError(f"interactive_rounds must lie in 0..16, got {cfg.interactive_rounds}")
    for name in ("interactive_click_start", "interactive_oracle_prob", "interactive_mask_dropout", "zoom_prob"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            raise ValueError(f"{name} must lie in [0, 1], got {getattr(cfg, name)}")
    if not 0.0 <= cfg.interactive_click_weight <= 100.0:
        raise ValueError(f"interactive_click_weight must lie in [0, 100], got {cfg.interactive_click_weight}")
    from accelerate import PartialState

    # The effective batch is counted over all processes, one prompt per micro-step.
    accumulation = max(1, cfg.effective_batch // PartialState().num_processes)
    accelerator = Accelerator(gradient_accumulation_steps=accumulation)
    rng = np.random.default_rng(cfg.seed + accelerator.process_index)
    torch.manual_seed(cfg.seed)

    model = load_tracker_model(model_path)
    prep = Sam3Segmenter(model, device=accelerator.device, dtype=torch.float32, cache_tag="train", persist=False)
    model.train()
    if cfg.freeze_encoder:
        for name, p in model.named_parameters():
            if name.startswith("vision_encoder."):
                p.requires_grad_(False)
    # weights that learned to zoom, or started from zooming ones, are saved as zooming (and the
    # latter keep learning both passes)
    zooms = cfg.zoom_prob > 0 or read_view(model_path) == "zoom"
    if zooms and cfg.zoom_prob == 0:
        cfg = replace(cfg, zoom_prob=ZOOM_PROB)
    frozen: dict[int, list[Any]] = {}  # id(image) -> its embeddings, when the encoder is frozen
    optimizer = torch.optim.AdamW(param_groups(model, cfg))
    model, optimizer = accelerator.prepare(model, optimizer)

    # Each process takes every world_size-th sample; one sample (one prompt) per micro-step.
    from monailabel_xflow.policy.oracle import OracleClicker

    clicker = OracleClicker()
    mine = list(samples)[accelerator.process_index :: accelerator.num_processes]
    per_epoch = math.ceil(len(mine) / accumulation)
    total = per_epoch * cfg.epochs if cfg.max_steps <= 0 else cfg.max_steps
    bar = tqdm(total=total, desc="F_seg fine-tuning", disable=not (progress and accelerator.is_main_process))
    losses: list[float] = []
    step, running = 0, []
    while step < total:
        for i in rng.permutation(len(mine)):
            sample = mine[i]
            zoomed = cfg.zoom_prob > 0 and rng.random() < cfg.zoom_prob
            if zoomed:
                window_box, _ = sample_prompt(sample.mask, rng, cfg.box_jitter, 0)
                sample = SegSample(*zoom_sample(sample.image, sample.mask, window_box))
            box, clicks = sample_prompt(sample.mask, rng, cfg.box_jitter, cfg.points_per_prompt)
            prompts = sam3_prompt_kwargs(build_prompts([box], [clicks]), prep.input_size, accelerator.device)
            kept: list[Any] | None = None
            if cfg.freeze_encoder:
                kept = None if zoomed else frozen.get(id(sample.image))  # a window is a new image each time
                if kept is None:
                    with torch.no_grad():
                        encoder = accelerator.unwrap_model(model).get_image_embeddings
                        kept = list(encoder(prep.preprocess(sample.image)))
                    if not zoomed:
                        frozen[id(sample.image)] = kept
                kwargs: dict[str, Any] = {"image_embeddings": kept, **prompts}
            else:
                kwargs = {"pixel_values": prep.preprocess(sample.image), **prompts}
            with accelerator.accumulate(model):
                out = model(multimask_output=True, **kwargs)
                embeddings = kept if kept is not None else out.image_embeddings
                low_res = out.pred_masks[0, 0].float()  # (3, 288, 288) for a 1008-px input
                target = _target_grid(sample.mask, low_res.shape[-2:]).to(low_res.device)
                loss, _ = sam2_loss(low_res, out.iou_scores[0, 0].float(), target, cfg)
                # The single-mask token answers box prompts at inference (as SAM 2 trains them):
                # supervise it too, on the same image embedding.
                single = model(image_embeddings=embeddings, multimask_output=False, **prompts)
                single_loss, _ = sam2_loss(
                    single.pred_masks[0, 0].float(), single.iou_scores[0, 0].float(), target, cfg
                )
                loss = loss + single_loss
                if cfg.interactive_rounds > 0:
                    session, _ = interactive_loss(model, embeddings, sample, rng, cfg, prep.input_size, target, clicker)
                    loss = loss + session
                if cfg.revision_clicks > 0 and rng.random() < cfg.revision_prob:
                    loss = loss + _revision_loss(model, embeddings, sample, rng, cfg, prep.input_size, target, clicker)
                accelerator.backward(loss)
                running.append(float(loss.detach()))
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                losses.append(float(np.mean(running)))
                running = []
                step += 1
                bar.update(1)
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                if on_step is not None and accelerator.is_main_process:
                    on_step(step, total, losses[-1])
                if (
                    cfg.checkpoint_every > 0
                    and step % cfg.checkpoint_every == 0
                    and step < total
                    and accelerator.is_main_process
                ):
                    # no LR schedule: the checkpoint of step k is what a k-step run would save
                    checkpoint = Path(out_dir) / f"checkpoint-{step}"
                    accelerator.unwrap_model(model).save_pretrained(checkpoint)
                    if zooms:
                        write_view(checkpoint, "zoom")
                if step >= total:
                    break
    bar.close()
    accelerator.wait_for_everyone()
    out_dir = Path(out_dir)
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).eval().save_pretrained(out_dir)
        if zooms:
            write_view(out_dir, "zoom")
        logger.info("saved fine-tuned F_seg to %s after %d steps (last loss %.4f)", out_dir, step, losses[-1])
    return {"steps": step, "losses": losses, "out_dir": str(out_dir)}


def box_prompted_iou(segmenter: Any, samples: Iterable[SegSample]) -> float:
    """Mean IoU of masks prompted by each sample's tight ground-truth box (an evaluation helper)."""
    from monailabel_xflow.metrics import mask_iou

    ious = []
    for s in samples:
        segmenter.set_image(s.image)
        ious.append(mask_iou(segmenter.predict([mask_to_box(s.mask)]).masks[0], s.mask))
    return float(np.mean(ious))
