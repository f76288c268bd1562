"""Reader-study analysis: tie-aware Bradley–Terry models (paper §6.2, App. C.3).

Input is a long-format ranking table, one row per (case, reader, item)::

    case,reader,item,rank
    c01,r1,GT,1
    c01,r1,XFlow,1        <- tied with GT: tied items share a rank
    c01,r1,ROSALIA,3

Rank 1 is best. Each (case, reader) ranking is read as pairwise outcomes (every pair of items it
ranks: a strict preference or a tie). Two models give the tie its own probability, with item
strengths ``pi_i > 0``:

- **Davidson (1970)**: ``P(i > j) = pi_i / D``, ``P(i ~ j) = nu sqrt(pi_i pi_j) / D``,
  ``D = pi_i + pi_j + nu sqrt(pi_i pi_j)``, ``nu >= 0``.
- **Rao–Kupper (1967)**: ``P(i > j) = pi_i / (pi_i + theta pi_j)``,
  ``P(i ~ j) = pi_i pi_j (theta^2 - 1) / ((pi_i + theta pi_j)(pi_j + theta pi_i))``,
  ``theta >= 1``.

Both are fitted jointly (log-strengths and the tie parameter together) by maximum likelihood with
:func:`scipy.optimize.minimize` (bounded truncated Newton, TNC, with analytic gradients;
scipy's L-BFGS-B was much slower per small fit). Strengths are identified up to a common factor, so
log-strengths are reported **centred to sum to zero**; a difference ``d`` means the stronger item
is preferred ``e^d`` times as often as the weaker when the reader does not tie. Uncertainty is a
percentile bootstrap over **cases** (all readers' rankings of a resampled case move together),
2,000 resamples by default.

Internally all outcomes are reduced to a count table (pair × {i wins, j wins, tie}) per case, so
a bootstrap resample is a weighted sum of per-case tables and costs one small fit.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

from monailabel_xflow.errors import InputError

__all__ = [
    "PreferenceError",
    "Ranking",
    "PairwiseData",
    "read_rankings",
    "pairwise_from_rankings",
    "davidson_loglik",
    "rao_kupper_loglik",
    "fit",
    "analyse",
    "MODELS",
]

MODELS: tuple[str, ...] = ("davidson", "rao_kupper")

# Bounds on the free tie parameter: log(nu) for Davidson, log(theta - 1) for Rao–Kupper.
# The lower bound stands in for "no ties" (nu -> 0, theta -> 1), where the MLE sits on the edge.
_TIE_BOUNDS = (-20.0, 10.0)
_LOG_STRENGTH_BOUND = 30.0


class PreferenceError(InputError):
    """A ranking table that cannot be analysed; the message names the row or ranking."""


@dataclass(frozen=True)
class Ranking:
    """One reader's ranking of the items of one case (rank 1 best; equal ranks are ties)."""

    case: str
    reader: str
    ranks: Mapping[str, float]


@dataclass
class PairwiseData:
    """Pairwise outcomes as count tables.

    Attributes:
        items: item names; index ``k`` is the ``k``-th strength.
        pairs: (P, 2) int array of item indices ``(i, j)``, ``i < j``.
        cases: case ids, in the order of the first axis of ``counts``.
        counts: (n_cases, P, 3) float array; last axis = (i preferred, j preferred, tie).
    """

    items: list[str]
    pairs: np.ndarray
    cases: list[str]
    counts: np.ndarray = field(repr=False)

    @property
    def total(self) -> np.ndarray:
        """(P, 3) counts summed over cases."""
        return self.counts.sum(axis=0)

    @property
    def tie_rate(self) -> float:
        t = self.total
        return float(t[:, 2].sum() / t.sum()) if t.sum() else math.nan


def read_rankings(path: str | Path) -> list[Ranking]:
    """Read a long-format ``case,reader,item,rank`` CSV.

    Raises:
        PreferenceError: missing columns, a non-numeric or < 1 rank, an item ranked twice in one
            ranking, or a ranking with fewer than two items. All problems are collected and
            reported together.
    """
    path = Path(path)
    try:
        handle = path.open(newline="", encoding="utf-8-sig")
    except OSError as err:
        raise PreferenceError(f"cannot read rankings {path}: {err}") from err
    problems: list[str] = []
    grouped: dict[tuple[str, str], dict[str, float]] = {}
    with handle:
        reader = csv.DictReader(handle)
        missing = {"case", "reader", "item", "rank"} - set(reader.fieldnames or ())
        if missing:
            raise PreferenceError(f"{path}: missing column(s) {sorted(missing)}; need case,reader,item,rank")
        for line, row in enumerate(reader, start=2):
            case, who, item = (str(row[k] or "").strip() for k in ("case", "reader", "item"))
            if not (case and who and item):
                problems.append(f"line {line}: empty case, reader or item")
                continue
            try:
                rank = float(row["rank"])
            except (TypeError, ValueError):
                problems.append(f"line {line}: rank {row['rank']!r} is not a number")
                continue
            if not rank >= 1:
                problems.append(f"line {line}: rank {rank:g} < 1 (rank 1 is best)")
                continue
            ranks = grouped.setdefault((case, who), {})
            if item in ranks:
                problems.append(f"line {line}: item {item!r} ranked twice by {who!r} on case {case!r}")
                continue
            ranks[item] = rank
    for (case, who), ranks in grouped.items():
        if len(ranks) < 2:
            problems.append(f"case {case!r}, reader {who!r}: ranks only {len(ranks)} item(s)")
    if problems:
        shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
        raise PreferenceError(f"{path}: {len(problems)} problem(s):\n  {shown}")
    if not grouped:
        raise PreferenceError(f"{path}: no rankings")
    return [Ranking(case, who, ranks) for (case, who), ranks in grouped.items()]


def pairwise_from_rankings(rankings: Iterable[Ranking], items: Sequence[str] | None = None) -> PairwiseData:
    """Turn rankings into per-case pairwise count tables.

    Args:
        rankings: the rankings; every pair of items within one ranking gives one outcome.
        items: item order (default: first-seen order).
    """
    rankings = list(rankings)
    if items is None:
        items = list(dict.fromkeys(item for r in rankings for item in r.ranks))
    index = {item: k for k, item in enumerate(items)}
    pairs = list(combinations(range(len(items)), 2))
    pair_index = {p: n for n, p in enumerate(pairs)}
    cases = list(dict.fromkeys(r.case for r in rankings))
    case_index = {c: n for n, c in enumerate(cases)}
    counts = np.zeros((len(cases), len(pairs), 3))
    for r in rankings:
        for a, b in combinations(r.ranks, 2):
            i, j = index[a], index[b]
            ri, rj = r.ranks[a], r.ranks[b]
            if i > j:
                i, j, ri, rj = j, i, rj, ri
            outcome = 2 if ri == rj else (0 if ri < rj else 1)
            counts[case_index[r.case], pair_index[(i, j)], outcome] += 1
    return PairwiseData(list(items), np.array(pairs, dtype=int).reshape(-1, 2), cases, counts)


# --- likelihoods -------------------------------------------------------------------------------


def _weighted_sum(counts: np.ndarray, log_probs: np.ndarray) -> float:
    """Σ counts · log p, where an outcome never observed contributes 0 even if p = 0."""
    with np.errstate(invalid="ignore"):
        return float(np.sum(np.where(counts > 0, counts * log_probs, 0.0)))


def davidson_loglik(log_strengths: np.ndarray, nu: float, pairs: np.ndarray, counts: np.ndarray) -> float:
    """Davidson log-likelihood of a (P, 3) count table.

    Args:
        log_strengths: (K,) log pi.
        nu: tie parameter, >= 0.
        pairs: (P, 2) item indices.
        counts: (P, 3) counts of (i preferred, j preferred, tie).
    """
    li, lj = log_strengths[pairs[:, 0]], log_strengths[pairs[:, 1]]
    lnu = math.log(nu) if nu > 0 else -np.inf
    half = 0.5 * (li + lj)
    log_d = np.logaddexp(np.logaddexp(li, lj), lnu + half)
    terms = np.stack([li - log_d, lj - log_d, lnu + half - log_d], axis=1)
    return _weighted_sum(counts, terms)


def rao_kupper_loglik(log_strengths: np.ndarray, theta: float, pairs: np.ndarray, counts: np.ndarray) -> float:
    """Rao–Kupper log-likelihood of a (P, 3) count table (``theta >= 1``); arguments as Davidson."""
    li, lj = log_strengths[pairs[:, 0]], log_strengths[pairs[:, 1]]
    lt = math.log(theta)
    log_ij = np.logaddexp(li, lt + lj)  # log(pi_i + theta pi_j)
    log_ji = np.logaddexp(lj, lt + li)  # log(pi_j + theta pi_i)
    log_tie_k = math.log(theta * theta - 1) if theta > 1 else -np.inf
    terms = np.stack([li - log_ij, lj - log_ji, li + lj + log_tie_k - log_ij - log_ji], axis=1)
    return _weighted_sum(counts, terms)


def _unpack(x: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """Free parameters -> (centred log-strengths, tie parameter on its log scale)."""
    free = x[: k - 1]
    return np.append(free, -free.sum()), float(x[k - 1])


def _negloglik_grad(
    x: np.ndarray, model: str, k: int, pairs: np.ndarray, counts: np.ndarray
) -> tuple[float, np.ndarray]:
    """Negative log-likelihood and its gradient in the free parameters.

    ``x`` = (K - 1 free log-strengths, tau); the K-th log-strength is minus their sum, and
    tau = log(nu) (Davidson) or log(theta - 1) (Rao–Kupper).
    """
    logs, tau = _unpack(x, k)
    li, lj = logs[pairs[:, 0]], logs[pairs[:, 1]]
    n1, n2, n3 = counts[:, 0], counts[:, 1], counts[:, 2]
    if model == "davidson":
        half = 0.5 * (li + lj)
        log_d = np.logaddexp(np.logaddexp(li, lj), tau + half)
        w_i, w_j, w_t = np.exp(li - log_d), np.exp(lj - log_d), np.exp(tau + half - log_d)
        n = n1 + n2 + n3
        ll = np.sum(n1 * (li - log_d) + n2 * (lj - log_d) + n3 * (tau + half - log_d))
        g_i = n1 + 0.5 * n3 - n * (w_i + 0.5 * w_t)
        g_j = n2 + 0.5 * n3 - n * (w_j + 0.5 * w_t)
        g_tau = np.sum(n3 - n * w_t)
    else:
        theta = 1.0 + math.exp(tau)
        lt = math.log(theta)
        log_a = np.logaddexp(li, lt + lj)  # log(pi_i + theta pi_j)
        log_b = np.logaddexp(lj, lt + li)  # log(pi_j + theta pi_i)
        a_i, b_j = np.exp(li - log_a), np.exp(lj - log_b)
        log_tie_k = tau + math.log(theta + 1.0)  # log(theta^2 - 1), stable as theta -> 1
        n_a, n_b = n1 + n3, n2 + n3
        ll = np.sum(n1 * (li - log_a) + n2 * (lj - log_b) + n3 * (li + lj + log_tie_k - log_a - log_b))
        g_i = n1 + n3 - n_a * a_i - n_b * (1.0 - b_j)
        g_j = n2 + n3 - n_a * (1.0 - a_i) - n_b * b_j
        dt = (theta - 1.0) / theta  # d log(theta) / d tau
        g_tau = np.sum(n3 * (1.0 + (theta - 1.0) / (theta + 1.0)) - (n_a * (1.0 - a_i) + n_b * (1.0 - b_j)) * dt)
    g_logs = np.zeros(k)
    np.add.at(g_logs, pairs[:, 0], g_i)
    np.add.at(g_logs, pairs[:, 1], g_j)
    grad = np.append(g_logs[:-1] - g_logs[-1], g_tau)
    return -float(ll), -grad


@dataclass(frozen=True)
class Fit:
    """A maximum-likelihood fit.

    Attributes:
        model: ``"davidson"`` or ``"rao_kupper"``.
        log_strengths: (K,) centred log-strengths (sum 0).
        tie: ``nu`` (Davidson) or ``theta`` (Rao–Kupper).
        loglik: maximised log-likelihood.
        converged: the optimiser's success flag.
    """

    model: str
    log_strengths: np.ndarray
    tie: float
    loglik: float
    converged: bool


def fit(model: str, pairs: np.ndarray, counts: np.ndarray, n_items: int, start: np.ndarray | None = None) -> Fit:
    """Fit one model jointly over strengths and its tie parameter.

    Args:
        model: ``"davidson"`` or ``"rao_kupper"``.
        pairs: (P, 2) item indices.
        counts: (P, 3) count table.
        n_items: K.
        start: optional starting vector (K - 1 free log-strengths, then the log tie parameter).

    Raises:
        PreferenceError: unknown model or fewer than two items.
    """
    if model not in MODELS:
        raise PreferenceError(f"unknown model {model!r}; choose from {MODELS}")
    if n_items < 2:
        raise PreferenceError("need at least two items")
    x0 = np.zeros(n_items) if start is None else np.asarray(start, float)
    bounds = [(-_LOG_STRENGTH_BOUND, _LOG_STRENGTH_BOUND)] * (n_items - 1) + [_TIE_BOUNDS]
    res = minimize(_negloglik_grad, x0, args=(model, n_items, pairs, counts), jac=True, method="TNC", bounds=bounds)
    logs, tie = _unpack(res.x, n_items)
    tie_value = math.exp(tie) if model == "davidson" else 1.0 + math.exp(tie)
    return Fit(model, logs, tie_value, -float(res.fun), bool(res.success))


def _start_vector(f: Fit) -> np.ndarray:
    tie = math.log(f.tie) if f.model == "davidson" else math.log(max(f.tie - 1.0, 1e-12))
    return np.append(f.log_strengths[:-1], tie)


def mean_ranks(rankings: Iterable[Ranking], items: Sequence[str]) -> dict[str, float]:
    """Mean rank of each item over the rankings that include it."""
    sums: dict[str, list[float]] = {item: [] for item in items}
    for r in rankings:
        for item, rank in r.ranks.items():
            sums[item].append(rank)
    return {item: float(np.mean(v)) if v else math.nan for item, v in sums.items()}


def analyse(
    rankings: Sequence[Ranking],
    *,
    n_bootstrap: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    progress: bool = False,
) -> dict[str, Any]:
    """Fit both models, bootstrap over cases and report.

    Args:
        rankings: from :func:`read_rankings`.
        n_bootstrap: resamples of cases (0 = no intervals).
        seed: random seed of the resampling.
        level: coverage of the percentile intervals.
        progress: show a tqdm bar over resamples.

    Returns:
        JSON-ready dict: ``items``, ``n_cases``, ``n_readers``, ``n_rankings``, ``n_pairs``,
        ``tie_rate``, ``mean_rank`` per item, and per model (``davidson``, ``rao_kupper``):
        ``log_strength`` per item, ``ci`` per item ``[lo, hi]``, the tie parameter (``nu`` or
        ``theta``) with its ``*_ci``, ``differences`` per item pair ``"a - b"`` (``difference``,
        ``odds`` = e^difference, ``ci``), ``loglik``, ``converged``, and ``failed_resamples``.
    """
    data = pairwise_from_rankings(rankings)
    k = len(data.items)
    total = data.total
    rng = np.random.default_rng(seed)
    n_cases = len(data.cases)
    weights = (
        rng.multinomial(n_cases, np.full(n_cases, 1.0 / n_cases), size=n_bootstrap)
        if n_bootstrap
        else np.zeros((0, n_cases), np.int64)
    )
    alpha = (1.0 - level) / 2.0
    report: dict[str, Any] = {
        "items": data.items,
        "n_cases": n_cases,
        "n_readers": len({r.reader for r in rankings}),
        "n_rankings": len(rankings),
        "n_pairs": int(total.sum()),
        "tie_rate": data.tie_rate,
        "mean_rank": mean_ranks(rankings, data.items),
        "n_bootstrap": n_bootstrap,
        "seed": seed,
        "level": level,
    }
    iterator: Iterable[int] = range(n_bootstrap)
    if progress and n_bootstrap:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc="bootstrap", unit="resample")
    boot: dict[str, list[np.ndarray]] = {m: [] for m in MODELS}
    fits = {m: fit(m, data.pairs, total, k) for m in MODELS}
    failed = {m: 0 for m in MODELS}
    flat = data.counts.reshape(n_cases, -1)
    for b in iterator:
        table = (weights[b] @ flat).reshape(total.shape)
        for m in MODELS:
            f = fit(m, data.pairs, table, k, start=_start_vector(fits[m]))
            if not f.converged:
                failed[m] += 1
            boot[m].append(np.append(f.log_strengths, f.tie))
    for m in MODELS:
        f = fits[m]
        tie_name = "nu" if m == "davidson" else "theta"
        entry: dict[str, Any] = {
            "log_strength": dict(zip(data.items, map(float, f.log_strengths), strict=False)),
            tie_name: f.tie,
            "loglik": f.loglik,
            "converged": f.converged,
            "failed_resamples": failed[m],
        }
        # Differences d = log pi_a - log pi_b: a is preferred e^d times as often when not tied.
        diffs = {}
        arr = np.array(boot[m]) if n_bootstrap else None
        for a, b in combinations(range(k), 2):
            d = float(f.log_strengths[a] - f.log_strengths[b])
            diff: dict[str, Any] = {"difference": d, "odds": math.exp(d)}
            if arr is not None:
                lo_d, hi_d = np.quantile(arr[:, a] - arr[:, b], [alpha, 1 - alpha])
                diff["ci"] = [float(lo_d), float(hi_d)]
            diffs[f"{data.items[a]} - {data.items[b]}"] = diff
        entry["differences"] = diffs
        if arr is not None:
            lo, hi = np.quantile(arr, [alpha, 1 - alpha], axis=0)
            entry["ci"] = {item: [float(lo[n]), float(hi[n])] for n, item in enumerate(data.items)}
            entry[f"{tie_name}_ci"] = [float(lo[k]), float(hi[k])]
        report[m] = entry
    return report


def format_table(report: Mapping[str, Any]) -> str:
    """A Markdown table laid out like the paper's Table 4."""
    lines = [
        "| Item | Davidson log-strength | Rao–Kupper log-strength | Mean rank |",
        "|---|---|---|---|",
    ]
    for item in report["items"]:
        cells = []
        for m in MODELS:
            value = report[m]["log_strength"][item]
            ci = report[m].get("ci", {}).get(item)
            cells.append(f"{value:.3f} [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else f"{value:.3f}")
        lines.append(f"| {item} | {cells[0]} | {cells[1]} | {report['mean_rank'][item]:.2f} |")
    lines.append("")
    lines.append(
        f"{report['n_rankings']} rankings of {report['n_cases']} cases by {report['n_readers']} reader(s); "
        f"{report['n_pairs']} pairwise outcomes, tie rate {report['tie_rate']:.3f}; "
        f"nu = {report['davidson']['nu']:.3f}, theta = {report['rao_kupper']['theta']:.3f}; "
        f"{int(100 * report['level'])}% percentile bootstrap over cases ({report['n_bootstrap']} resamples)."
    )
    return "\n".join(lines)
