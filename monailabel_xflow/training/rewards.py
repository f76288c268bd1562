"""RL rewards of both policies (XFlow paper Eq. 4.5 and 4.7): pure functions of text and masks.

``R_init = R_box + R_format + R_rep``:

* ``R_box`` for a positive case is the IoU between the emitted lesion boxes and the ground-truth
  boxes, matched one to one by maximum total IoU (Hungarian); unmatched boxes on either side
  count as IoU 0, so the term is ``sum(matched IoU) / max(n_pred, n_gt)``. For a negative case it
  is binary: 1 when the model emits no lesion box (and does not call the finding present).
* ``R_format`` is 1 when the text follows the protocol (``protocol.parse_stage1`` reports no
  problem other than duplicates, which ``R_rep`` prices), else 0.
* ``R_rep`` is ``-REPETITION_COST`` per repeated box, floored at -1.

``R_rev = IoU(M_tau, GT) - IoU(M_0, GT) + R_format``, where ``R_format`` is 1 when every turn of
the trajectory was well-formed, else 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from monailabel_xflow.geometry import Box, box_iou
from monailabel_xflow.metrics import mask_iou
from monailabel_xflow.policy.protocol import parse_stage1, parse_stage2

REPETITION_COST = 0.5


def matched_box_iou(pred: Sequence[Box], gt: Sequence[Box]) -> float:
    """Mean IoU of a one-to-one matching of predicted to ground-truth boxes (0 if either is empty)."""
    if not pred or not gt:
        return 0.0
    from scipy.optimize import linear_sum_assignment

    ious = np.array([[box_iou(p, g) for g in gt] for p in pred])
    rows, cols = linear_sum_assignment(-ious)
    return float(ious[rows, cols].sum() / max(len(pred), len(gt)))


def init_reward(text: str, gt_boxes: Sequence[Box]) -> dict[str, float]:
    """R_init of one π_init completion.

    Args:
        text: the raw completion.
        gt_boxes: ground-truth lesion boxes (normalised xyxy); empty for a negative case.

    Returns:
        ``{"box", "format", "rep", "total"}``.
    """
    parsed = parse_stage1(text)
    boxes = [ref.box for ref in parsed.value.lesions]
    if gt_boxes:
        r_box = matched_box_iou(boxes, gt_boxes) if parsed.value.present else 0.0
    else:
        r_box = 1.0 if not boxes and parsed.value.present is False else 0.0
    structural = [p for p in parsed.problems if "duplicate" not in p]
    r_format = 0.0 if structural else 1.0
    r_rep = -min(1.0, REPETITION_COST * parsed.duplicates)
    return {"box": r_box, "format": r_format, "rep": r_rep, "total": r_box + r_format + r_rep}


def revision_reward(
    turns: Sequence[str], first_mask: np.ndarray, final_mask: np.ndarray, gt: np.ndarray
) -> dict[str, float]:
    """R_rev of one π_rev trajectory.

    Args:
        turns: the raw text of every turn the policy produced (the last one may be the stop).
        first_mask: M_0, the (H, W) bool mask the trajectory started from.
        final_mask: M_tau, the (H, W) bool mask at termination.
        gt: the (H, W) bool ground-truth mask.

    Returns:
        ``{"gain", "format", "total"}``.
    """
    gain = mask_iou(final_mask, gt) - mask_iou(first_mask, gt)
    r_format = 1.0 if all(parse_stage2(t).ok for t in turns) else 0.0
    return {"gain": gain, "format": r_format, "total": gain + r_format}
