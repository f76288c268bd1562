"""The phantom benchmark's figures with their uncertainty: bootstrap intervals, the paper's claims
as paired differences, what revision changed question by question, and latency.

Every figure comes with a bootstrap 95 % interval over phantoms (:mod:`monailabel_xflow.eval.bootstrap`:
whole images are resampled, so the questions of one image move together), every difference in the
claims table (:data:`CLAIMS`) with its paired interval, and a claim reads "reproduced" only when
that interval excludes 0 in the claimed direction (:func:`verdict`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.eval.phantom_protocol import BASELINES, LATENCY_NAME, REVISIONS_NAME, case_records, record_iou
from monailabel_xflow.policy.oracle import PAYS
from monailabel_xflow.vocabulary import FINDINGS

__all__ = [
    "BOOTSTRAP_REPLICATES",
    "BOOTSTRAP_SEED",
    "CLAIMS",
    "verdict",
    "bootstrap_summary",
    "stage2_effect",
    "lesion_gains",
    "stop_decisions",
    "latency_summary",
]

BOOTSTRAP_REPLICATES = 2000
BOOTSTRAP_SEED = 0

CLAIMS = (
    # (claim, the paper's figures, metric, a, b): the claim is that a - b > 0
    ("XFlow segments better than ROSALIA (gIoU, Table 1)", "0.703 vs 0.621", "giou", "stage1+2", "rosalia"),
    ("XFlow segments better than ROSALIA (cIoU, Table 1)", "0.731 vs 0.688", "ciou", "stage1+2", "rosalia"),
    ("XFlow decides presence better than ROSALIA (F1, Table 1)", "0.961 vs 0.945", "f1", "stage1+2", "rosalia"),
    (
        "ROSALIA's masks have more excess components than XFlow's (ΔC, Table 3)",
        "+5.63 vs +1.71",
        "delta_c",
        "rosalia",
        "stage1+2",
    ),
    ("... the same, on the positives every method drew", "—", "delta_c_all_drew", "rosalia", "stage1+2"),
    ("ROSALIA's masks have more specks than XFlow's (Table 3)", "5.57 vs 1.69", "specks", "rosalia", "stage1+2"),
    ("Stage 2 adds to Stage 1 (gIoU, Table 2)", "+0.010", "giou", "stage1+2", "stage1"),
    ("Stage 2 makes masks cleaner (Stage 1 ΔC − Stage 1 + 2 ΔC)", "—", "delta_c", "stage1", "stage1+2"),
    ("XFlow's presence beats always answering present (F1)", "—", "f1", "stage1+2", "always-present"),
    ("ROSALIA's presence beats always answering present (F1)", "—", "f1", "rosalia", "always-present"),
    ("XFlow segments better than drawing the whole region (gIoU)", "—", "giou", "stage1+2", "always-present"),
    (
        "XFlow's zone-level presence beats reading the question alone (zone F1)",
        "—",
        "zone/f1",
        "stage1+2",
        "question-only",
    ),
    ("ROSALIA segments better than drawing the whole region (gIoU)", "—", "giou", "rosalia", "always-present"),
    ("Oracle clicks add to Stage 1 (gIoU; headroom for revision, not a paper claim)", "—", "giou", "oracle", "stage1"),
)
"""The claims table: paired differences with bootstrap intervals over phantoms."""


def verdict(diff: Mapping[str, Any]) -> str:
    """ "reproduced" when the interval of a - b lies above 0, "reversed" below, else "not shown"."""
    if diff.get("low") is None:
        return "—"
    if diff["low"] > 0:
        return "reproduced"
    if diff["high"] < 0:
        return "reversed"
    return "not shown (CI includes 0)"


def bootstrap_summary(
    out: Path,
    methods: Sequence[str],
    cases: Sequence[EvalCase],
    replicates: int = BOOTSTRAP_REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """Every figure of the summary with a bootstrap 95 % interval over phantoms, and the claims.

    Only questions every method scored enter (so differences are paired); the positives every
    model method drew a mask on (the baselines aside) give ``delta_c_all_drew``.

    Returns:
        ``{"n", "n_images", "replicates", "seed", "all_drew": {"n", "n_positive"}, "methods":
        {m: {metric: interval}}, "findings": {m: {finding: interval of gIoU}}, "claims": [...]}``.
    """
    from monailabel_xflow.eval.bootstrap import Scored, interval, metrics, resample_weights

    records = {m: case_records(out / m, cases) for m in methods}
    common = [c for c in cases if all(c.case_id in records[m] for m in methods)]
    groups = [str(c.image_path) for c in common]
    scored = {m: Scored.from_records([records[m][c.case_id] for c in common], groups) for m in methods}
    first = next(iter(scored.values()))
    models = [m for m in methods if m not in BASELINES]
    all_drew = first.positive.copy()
    for m in models:
        all_drew &= scored[m].drawn
    weights = resample_weights(first.group, replicates, seed)
    ones = np.ones((1, len(common)))

    def figures(m: str, w: NDArray[Any]) -> dict[str, NDArray[Any]]:
        f = metrics(scored[m], w)
        f["delta_c_all_drew"] = metrics(scored[m], w, subset=all_drew)["delta_c"]
        return f

    point = {m: {k: float(v[0]) for k, v in figures(m, ones).items()} for m in methods}
    boot = {m: figures(m, weights) for m in methods}
    result: dict[str, Any] = {
        "n": len(common),
        "n_images": int(first.group.max()) + 1 if len(common) else 0,
        "unit": "phantom",
        "replicates": replicates,
        "seed": seed,
        "all_drew": {"n": int(all_drew.sum()), "n_positive": int(first.positive.sum()), "methods": models},
        "methods": {m: {k: interval(boot[m][k], point[m][k]) for k in point[m]} for m in methods},
        "findings": {},
        "claims": [],
    }
    for m in methods:
        per = {}
        for finding in FINDINGS:
            subset = np.asarray([c.finding == finding for c in common])
            if subset.any():
                per[finding] = interval(
                    metrics(scored[m], weights, subset)["giou"], float(metrics(scored[m], ones, subset)["giou"][0])
                )
        result["findings"][m] = per
    for claim, paper, metric, a, b in CLAIMS:
        if a in methods and b in methods:
            diff = interval(boot[a][metric] - boot[b][metric], point[a][metric] - point[b][metric])
            result["claims"].append(
                {
                    "claim": claim,
                    "paper": paper,
                    "metric": metric,
                    "a": a,
                    "b": b,
                    "difference": diff,
                    "verdict": verdict(diff),
                }
            )
    return result


def stage2_effect(
    before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]], tol: float = 1e-9
) -> dict[str, Any]:
    """What a revision did, question by question (records of two methods on the same cases).

    A mask counts as changed when any of its pixel counts differs. IoU up / down is counted over
    positive questions only (IoU is undefined on negatives); presence flips count every question.

    Returns:
        ``{"n": questions in both, "changed", "iou_up", "iou_down", "mean_iou_delta"
        (positives), "presence_gained", "presence_lost"}``.
    """
    shared = [k for k in before if k in after]
    changed = up = down = gained = lost = 0
    deltas = []
    for k in shared:
        a, b = before[k]["stats"], after[k]["stats"]
        if a != b:
            changed += 1
        if (a["pred_area"] > 0) != (b["pred_area"] > 0):
            gained += b["pred_area"] > 0
            lost += a["pred_area"] > 0
        if a["gt_area"] > 0:
            d = record_iou(after[k]) - record_iou(before[k])
            deltas.append(d)
            up += d > tol
            down += d < -tol
    return {
        "n": len(shared),
        "changed": changed,
        "iou_up": up,
        "iou_down": down,
        "mean_iou_delta": float(np.mean(deltas)) if deltas else None,
        "presence_gained": gained,
        "presence_lost": lost,
    }


def _lesions(path: Path, case_ids: set[str]) -> dict[tuple[str, int], Mapping[str, Any]]:
    """``(case_id, lesion index) -> lesion record`` of a ``revisions.jsonl`` (latest run wins)."""
    out: dict[tuple[str, int], Mapping[str, Any]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                if r["case_id"] in case_ids:
                    out.update({(r["case_id"], int(les["index"])): les for les in r["lesions"]})
    return out


def lesion_gains(folder: Path, cases: Sequence[EvalCase]) -> dict[tuple[str, int], float]:
    """Each revised Stage 1 lesion's IoU after revision minus before, against the ground truth.

    A lesion's IoU is its mask's against the ground-truth component its box was drawn for
    (``GroundTruthReviser.target``, the oracle's and the on-policy trajectories' rule; empty on a
    negative question). The traces' ``iou`` fields are F_seg's own estimates and are not used.

    Args:
        folder: a method's folder (its ``revisions.jsonl``).
        cases: the questions scored, with their ground truth (``EvalCase.load_mask``) at the
            size of the traced masks; lesions of other questions are left out.

    Returns:
        ``(case_id, lesion index) -> IoU change``.

    Raises:
        ValueError: a ground truth not at the size of the traced masks.
    """
    by_id = {c.case_id: c for c in cases}
    return _gains(_lesions(folder / REVISIONS_NAME, set(by_id)), by_id, {})


def _gains(
    lesions: Mapping[tuple[str, int], Mapping[str, Any]], by_id: Mapping[str, EvalCase], truths: dict[str, Any]
) -> dict[tuple[str, int], float]:
    """:func:`lesion_gains` of lesion records; ``truths`` caches each question's ``GroundTruthReviser``."""
    from monailabel_xflow import rle
    from monailabel_xflow.metrics import mask_iou
    from monailabel_xflow.policy.oracle import GroundTruthReviser

    out = {}
    for (case_id, index), les in lesions.items():
        before, after = rle.decode(les["initial_mask"]), rle.decode(les["mask"])
        if case_id not in truths:
            gt = by_id[case_id].load_mask()
            truths[case_id] = GroundTruthReviser(np.zeros_like(before) if gt is None else gt)
        target = truths[case_id].target(tuple(les["box"]))
        if target.shape != before.shape:
            raise ValueError(f"{case_id}: ground truth {target.shape} is not the traced masks' {before.shape}")
        out[case_id, index] = mask_iou(after, target) - mask_iou(before, target)
    return out


def stop_decisions(policy: Path, oracle: Path, cases: Sequence[EvalCase], pays: float = PAYS) -> dict[str, Any] | None:
    """π_rev's first decision on each Stage 1 lesion beside the oracle's, and whether clicking paid.

    Both methods revise the same Stage 1 boxes (the benchmark shares Stage 1), so lesions pair up
    by ``(case_id, index)``; a lesion's IoU change is :func:`lesion_gains`'. Clicking *pays* on a
    lesion when the oracle's revision raised that IoU by at least ``pays``. A policy that clicks when it pays and stops
    when it does not has both rates below at 1; one that always stops has ``clicked_when_paid`` 0.

    Args:
        policy, oracle: the two methods' folders (their ``revisions.jsonl``).
        cases: the questions scored, with their ground truth (``EvalCase.load_mask``) at the
            size of the traced masks.
        pays: the oracle gain that counts as paying.

    A box on a question whose ground truth has no lesion scores IoU 0 until its mask is cleared, and
    then 1 (:func:`~monailabel_xflow.metrics.mask_iou` of two empty masks), so ``mean_gain``
    mixes two things a revision can do: ``mean_gain_on_lesions`` averages only the boxes with a
    lesion to segment, and ``cleared`` counts the boxes of lesion-free questions each method emptied.

    Returns:
        ``{"lesions", "pays", "paid", "stop_rate": {"policy", "oracle"}, "clicked_when_paid",
        "stopped_when_not_paid", "mean_gain": {"policy", "oracle"}, "boxes_without_lesion",
        "mean_gain_on_lesions": {"policy", "oracle"}, "cleared": {"policy", "oracle"}}`` (a rate
        or mean is None when its denominator is 0), or None when the methods share no lesion.
    """
    by_id = {c.case_id: c for c in cases}
    a, b = _lesions(policy / REVISIONS_NAME, set(by_id)), _lesions(oracle / REVISIONS_NAME, set(by_id))
    shared = [k for k in a if k in b]
    if not shared:
        return None
    truths: dict[str, Any] = {}
    gain_a = _gains({k: a[k] for k in shared}, by_id, truths)
    gain_b = _gains({k: b[k] for k in shared}, by_id, truths)

    def stopped(les: Mapping[str, Any]) -> bool:
        return not les["steps"] or les["steps"][0]["action"] != "click"

    policy_gain = np.asarray([gain_a[k] for k in shared])
    oracle_gain = np.asarray([gain_b[k] for k in shared])
    paid = oracle_gain >= pays
    policy_stop = np.asarray([stopped(a[k]) for k in shared])
    # a box's target is empty exactly when its question's ground truth has no lesion (GroundTruthReviser.target)
    no_lesion = np.asarray([not truths[case_id].components for case_id, _ in shared])
    gains = {"policy": policy_gain, "oracle": oracle_gain}

    def rate(values: NDArray[Any]) -> float | None:
        return float(values.mean()) if len(values) else None

    return {
        "lesions": len(shared),
        "pays": pays,
        "paid": int(paid.sum()),
        "stop_rate": {"policy": rate(policy_stop), "oracle": rate(np.asarray([stopped(b[k]) for k in shared]))},
        "clicked_when_paid": rate(~policy_stop[paid]),
        "stopped_when_not_paid": rate(policy_stop[~paid]),
        "mean_gain": {"policy": float(policy_gain.mean()), "oracle": float(oracle_gain.mean())},
        "boxes_without_lesion": int(no_lesion.sum()),
        "mean_gain_on_lesions": {name: rate(g[~no_lesion]) for name, g in gains.items()},
        # on a box of a lesion-free question the IoU can only go from 0 (a mask) to 1 (none): a gain is a clearing
        "cleared": {name: int((g[no_lesion] > 0).sum()) for name, g in gains.items()},
    }


def latency_summary(folder: Path, case_ids: set[str]) -> dict[str, float] | None:
    """``{"n", "mean_s", "median_s"}`` of one method's ``latency.jsonl`` over ``case_ids`` (the
    latest run of a redone case counts), or None when nothing was timed."""
    path = folder / LATENCY_NAME
    if not path.is_file():
        return None
    last: dict[str, float] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            last[r["case_id"]] = float(r["seconds"])  # the latest run of a redone case
    values = [v for k, v in last.items() if k in case_ids]
    if not values:
        return None
    return {"n": len(values), "mean_s": float(np.mean(values)), "median_s": float(np.median(values))}
