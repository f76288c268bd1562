"""Click refinement: make F_seg's mask agree with the clicks, by backpropagation (BRS, f-BRS).

A learned segmenter may answer a box and ignore the clicks on it: the demo F_seg, asked with a
tight box and a negative click at the deepest pixel of a spill, never clears that pixel
(``reports/click-efficiency/README.md``). The backpropagating refinement scheme (BRS, Jang & Kim,
CVPR 2019; f-BRS, Sofiiuk et al., CVPR 2020) makes any trained model respect its clicks at
inference: it treats the clicks as labels, and optimises a small set of auxiliary variables
(not the weights) until the prediction agrees with them, with an L2 penalty that keeps the
correction small so the rest of the mask stays the model's own.

Here the auxiliary variable is an additive correction ``delta`` to the image embedding SAM3's mask
decoder reads (``image_embeddings[-1]``, ``(N, C, S/14, S/14)``), as f-BRS corrects features after
the backbone: the decoder, its prompts (box, clicks, previous logits) and the high-resolution
features are unchanged, so the image is encoded once and each click costs decoder passes only
(segment-anything's set-the-image-once contract holds). The loss, per prompt, on the low-res
logits ``L`` (``(N, 4S/14, 4S/14)``)::

    sum over clicks c of  mean over the disc D_c of BCE(L, label_c)  +  weight_decay * ||delta||^2

with ``D_c`` the low-res pixels within ``radius`` of the click (low-res pixels: at SAM3's 1008-px
input one is 3.5 input px; at the demo's 336-px input 3.5 input px too, 2.7 px of a 256-px
phantom), minimised by L-BFGS for ``iterations`` steps. Prompts without clicks (a box alone) are
answered as before: nothing to agree with.

:class:`ClickRefinement` holds the settings; :class:`~monailabel_xflow.segmenter.sam3.Sam3Segmenter`
applies it (its ``refinement`` argument). Models files turn it on for a person's clicks with
``click_refinement: brs`` (:class:`~monailabel_xflow.workflow.model_config.ModelConfig`): the click
tool (``XFlow.revise``, the app's ``xflow_revise``) answers with a :func:`refined_fork`. Stage 2
refines π_rev's clicks only with ``stage2_click_refinement: brs``, for a π_rev trained on refined
revisions (the demo recipe's ``rev_click_refinement``): π_rev learns when clicking pays from the
masks its clicks got in training (a π_rev trained on unrefined masks, given refined ones, lowered
the phantom benchmark's dev gIoU; ``reports/click-efficiency/README.md``). It is an inference
setting, not a property of the weights: the promotion check compares weights without it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from monailabel_xflow.geometry import Click

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["CLICK_REFINEMENTS", "ClickRefinement", "click_discs", "refinement_for", "refined_fork", "refine_decoder"]

CLICK_REFINEMENTS = ("none", "brs")
"""Values of the models file's ``click_refinement``: ``none`` (the model's answer) or ``brs``."""


@dataclass(frozen=True)
class ClickRefinement:
    """Settings of the backpropagating click refinement (module docstring).

    Defaults chosen on the click benchmark's dev seed (``reports/click-efficiency/README.md``).

    Attributes:
        iterations: L-BFGS iterations per call, 1..100.
        radius: the disc around each click whose label is asked for, in low-res pixels, 0.5..16.
        weight_decay: the L2 penalty on the correction, 0..100 (larger keeps the mask closer to the
            model's own answer).
    """

    iterations: int = 20
    radius: float = 2.0
    weight_decay: float = 0.1

    def __post_init__(self) -> None:
        if isinstance(self.iterations, bool) or not isinstance(self.iterations, int) or not 1 <= self.iterations <= 100:
            raise ValueError(f"iterations must be an integer in 1..100, got {self.iterations!r}")
        for name, low, high in (("radius", 0.5, 16.0), ("weight_decay", 0.0, 100.0)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not low <= value <= high:
                raise ValueError(f"{name} must lie in {low}..{high}, got {value!r}")


def refinement_for(name: str | None) -> ClickRefinement | None:
    """The refinement a models file names (:data:`CLICK_REFINEMENTS`; None or ``none``: no refinement).

    Raises:
        ValueError: an unknown name.
    """
    if name is None or name == "none":
        return None
    if name == "brs":
        return ClickRefinement()
    raise ValueError(f"click_refinement {name!r} is not one of {', '.join(CLICK_REFINEMENTS)}")


def refined_fork(segmenter: Any, refinement: ClickRefinement | None) -> Any:
    """A fork of ``segmenter`` (its own current image, the same model and cache) that refines
    clicks with ``refinement``, or answers with the model alone when it is None (whatever
    ``segmenter`` itself does).

    A zoom-in wrapper's inner segmenter is the one refined.

    Raises:
        ValueError: a refinement asked of a segmenter that cannot refine (the official backend).
    """
    twin = segmenter.fork()
    target = getattr(twin, "inner", twin)
    if not hasattr(target, "refinement"):
        if refinement is None:
            return twin
        raise ValueError(f"{type(target).__name__} cannot refine clicks (the transformers backend can)")
    target.refinement = refinement
    return twin


def click_discs(clicks: Sequence[Click], side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """How far each low-res pixel lies from each click, and the clicks' labels.

    Args:
        clicks: ``K`` normalised clicks (``x, y`` in ``[0, 1]`` of the whole image, which the
            low-res grid covers, stretched as the model input is).
        side: the low-res grid's side (``4S/14``).

    Returns:
        ``(dist2, labels)``: the squared distance of each low-res pixel centre to each click
        ``(K, side, side)``, in low-res pixels, and the labels ``(K,)`` (1 positive, 0 negative).
    """
    import torch

    centres = torch.arange(side, dtype=torch.float32) + 0.5
    yy, xx = torch.meshgrid(centres, centres, indexing="ij")
    dist2 = torch.stack([(xx - c.x * side) ** 2 + (yy - c.y * side) ** 2 for c in clicks])
    labels = torch.tensor([1.0 if c.positive else 0.0 for c in clicks])
    return dist2, labels


def refine_decoder(
    decode: Callable[[list[torch.Tensor]], tuple[torch.Tensor, torch.Tensor]],
    embeddings: Sequence[torch.Tensor],
    clicks: Sequence[Sequence[Click]],
    refinement: ClickRefinement,
    side: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode with an image-embedding correction that makes each prompt's mask agree with its clicks.

    Args:
        decode: the mask decoder on the image-embedding levels (``(N, ...)`` each), returning the
            low-res logits ``(N, h, w)`` and the predicted IoU ``(N,)``; the prompts are bound in.
        embeddings: the image-embedding levels, already expanded to the ``N`` prompts; the last one
            is corrected.
        clicks: one list of clicks per prompt; prompts without clicks keep no loss (their
            correction stays zero).
        refinement: the settings.
        side: the side of the (square) low-res logits ``decode`` returns.

    Returns:
        ``(low_res, iou)`` of the corrected decoder pass, detached.
    """
    import torch
    import torch.nn.functional as F

    fixed = [e.detach() for e in embeddings]
    # the correction is optimised in float32 whatever the decoder's dtype (L-BFGS in bfloat16 stalls)
    delta = torch.zeros(tuple(fixed[-1].shape), dtype=torch.float32, device=fixed[-1].device, requires_grad=True)

    def corrected() -> list[torch.Tensor]:
        return [*fixed[:-1], (fixed[-1] + delta.to(fixed[-1].dtype)).contiguous()]

    terms: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (prompt, disc weights, labels)
    for i, per_prompt in enumerate(clicks):
        if per_prompt:
            dist2, labels = click_discs(per_prompt, side)
            discs = (dist2 <= refinement.radius**2).float()
            nearest = dist2.flatten(1).argmin(1)  # a disc smaller than a pixel still holds its pixel
            discs.flatten(1)[torch.arange(len(per_prompt)), nearest] = 1.0
            terms.append((i, discs.to(delta.device), labels.to(delta.device)))
    optimiser = torch.optim.LBFGS([delta], lr=1.0, max_iter=refinement.iterations, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        low_res, _ = decode(corrected())
        loss = refinement.weight_decay * (delta**2).sum()
        for i, discs, labels in terms:
            logits = low_res[i].float().expand_as(discs)
            bce = F.binary_cross_entropy_with_logits(logits, labels[:, None, None].expand_as(discs), reduction="none")
            loss = loss + ((bce * discs).sum((1, 2)) / discs.sum((1, 2))).sum()
        # the gradient of the correction only: the model's weights are shared and keep no .grad
        (delta.grad,) = torch.autograd.grad(loss, [delta])
        return loss.detach()

    if terms:
        with torch.enable_grad():
            optimiser.step(closure)
    with torch.no_grad():
        low_res, iou = decode(corrected())
    return low_res.detach(), iou.detach()
