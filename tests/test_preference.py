"""Tie-aware Bradley–Terry fits: a hand-written likelihood and simulated readers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.optimize import minimize

from monailabel_xflow.eval import reader_study as preference
from monailabel_xflow.eval.reader_study import PreferenceError, Ranking


def write_csv(path, rows):
    path.write_text("case,reader,item,rank\n" + "".join(f"{c},{r},{i},{k}\n" for c, r, i, k in rows))
    return path


# Tiny three-item study: four cases, one reader (every item wins and loses, so the MLE is finite).
#   c1: A=1, B=2, C=3  -> A>B, A>C, B>C
#   c2: A=1, B=1, C=3  -> A~B, A>C, B>C
#   c3: C=1, A=2, B=3  -> A>B, C>A, C>B
#   c4: B=1, A=2, C=2  -> B>A, A~C, B>C
TINY = [
    ("c1", "r", "A", 1),
    ("c1", "r", "B", 2),
    ("c1", "r", "C", 3),
    ("c2", "r", "A", 1),
    ("c2", "r", "B", 1),
    ("c2", "r", "C", 3),
    ("c3", "r", "C", 1),
    ("c3", "r", "A", 2),
    ("c3", "r", "B", 3),
    ("c4", "r", "B", 1),
    ("c4", "r", "A", 2),
    ("c4", "r", "C", 2),
]


def hand_davidson(a, b, c, nu):
    """log L written out outcome by outcome for TINY (strengths = exp of the logs)."""
    pa, pb, pc = math.exp(a), math.exp(b), math.exp(c)

    def win(x, y):
        return math.log(x / (x + y + nu * math.sqrt(x * y)))

    def tie(x, y):
        return math.log(nu * math.sqrt(x * y) / (x + y + nu * math.sqrt(x * y)))

    return (
        win(pa, pb)
        + win(pa, pc)
        + win(pb, pc)  # c1
        + tie(pa, pb)
        + win(pa, pc)
        + win(pb, pc)  # c2
        + win(pa, pb)
        + win(pc, pa)
        + win(pc, pb)  # c3
        + win(pb, pa)
        + tie(pa, pc)
        + win(pb, pc)  # c4
    )


def hand_rao_kupper(a, b, c, theta):
    pa, pb, pc = math.exp(a), math.exp(b), math.exp(c)

    def win(x, y):
        return math.log(x / (x + theta * y))

    def tie(x, y):
        return math.log(x * y * (theta**2 - 1) / ((x + theta * y) * (y + theta * x)))

    return (
        win(pa, pb)
        + win(pa, pc)
        + win(pb, pc)
        + tie(pa, pb)
        + win(pa, pc)
        + win(pb, pc)
        + win(pa, pb)
        + win(pc, pa)
        + win(pc, pb)
        + win(pb, pa)
        + tie(pa, pc)
        + win(pb, pc)
    )


def test_pairwise_counts_of_tiny_example(tmp_path):
    rankings = preference.read_rankings(write_csv(tmp_path / "r.csv", TINY))
    data = preference.pairwise_from_rankings(rankings)
    assert data.items == ["A", "B", "C"]
    assert data.pairs.tolist() == [[0, 1], [0, 2], [1, 2]]
    # pairs (A,B), (A,C), (B,C); columns (first preferred, second preferred, tie)
    np.testing.assert_array_equal(data.total, [[2, 1, 1], [2, 1, 1], [3, 1, 0]])
    assert data.tie_rate == pytest.approx(2 / 12)


@pytest.mark.parametrize(
    "model, loglik, hand",
    [
        ("davidson", preference.davidson_loglik, hand_davidson),
        ("rao_kupper", preference.rao_kupper_loglik, hand_rao_kupper),
    ],
)
def test_likelihood_and_fit_match_hand_written(tmp_path, model, loglik, hand):
    data = preference.pairwise_from_rankings(preference.read_rankings(write_csv(tmp_path / "r.csv", TINY)))
    tie = 0.7 if model == "davidson" else 1.6
    logs = np.array([0.9, 0.2, -1.1])
    assert loglik(logs, tie, data.pairs, data.total) == pytest.approx(hand(*logs, tie))

    # Maximise the hand-written likelihood independently (Nelder–Mead, own parametrisation,
    # C pinned at 0 instead of centring) and compare with the package's fit.
    def neg(x):
        t = math.exp(x[2]) if model == "davidson" else 1 + math.exp(x[2])
        return -hand(x[0], x[1], 0.0, t)

    ref = minimize(
        neg, [0.5, 0.2, 0.0], method="Nelder-Mead", options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 20000}
    )
    fitted = preference.fit(model, data.pairs, data.total, 3)
    assert fitted.converged
    assert fitted.loglik == pytest.approx(-ref.fun, abs=1e-6)
    expected = np.array([ref.x[0], ref.x[1], 0.0])
    np.testing.assert_allclose(fitted.log_strengths, expected - expected.mean(), atol=1e-3)
    ref_tie = math.exp(ref.x[2]) if model == "davidson" else 1 + math.exp(ref.x[2])
    assert fitted.tie == pytest.approx(ref_tie, rel=1e-3)
    assert fitted.log_strengths.sum() == pytest.approx(0.0, abs=1e-9)


def simulate_pairs(model, logs, tie, n_cases, readers, rng):
    """Per (case, reader), one outcome for each pair, drawn from the model itself."""
    rankings_rows = []
    items = ["GT", "XFlow", "ROSALIA"]
    pi = np.exp(logs)
    # Each (case, reader) ranks a single pair (two-item ranking) so outcomes follow the model exactly.
    pairs = [(0, 1), (0, 2), (1, 2)]
    for c in range(n_cases):
        for r in range(readers):
            i, j = pairs[(c + r) % 3]
            if model == "davidson":
                g = tie * math.sqrt(pi[i] * pi[j])
                p = np.array([pi[i], pi[j], g]) / (pi[i] + pi[j] + g)
            else:
                pw_i = pi[i] / (pi[i] + tie * pi[j])
                pw_j = pi[j] / (pi[j] + tie * pi[i])
                p = np.array([pw_i, pw_j, 1 - pw_i - pw_j])
            outcome = rng.choice(3, p=p)
            ri, rj = {0: (1, 2), 1: (2, 1), 2: (1, 1)}[outcome]
            rankings_rows += [(f"c{c}", f"r{r}", items[i], ri), (f"c{c}", f"r{r}", items[j], rj)]
    return rankings_rows


@pytest.mark.parametrize("model, tie", [("davidson", 0.8), ("rao_kupper", 1.8)])
def test_simulated_strengths_recovered_within_intervals(tmp_path, model, tie):
    rng = np.random.default_rng(7)
    true = np.array([0.35, 0.15, -0.5])  # centred
    rows = simulate_pairs(model, true, tie, n_cases=600, readers=3, rng=rng)
    rankings = preference.read_rankings(write_csv(tmp_path / "sim.csv", rows))
    report = preference.analyse(rankings, n_bootstrap=150, seed=1)
    entry = report[model]
    for item, value in zip(["GT", "XFlow", "ROSALIA"], true, strict=True):
        lo, hi = entry["ci"][item]
        assert lo <= value <= hi, (item, value, lo, hi)
        assert entry["log_strength"][item] == pytest.approx(value, abs=0.15)
    tie_name = "nu" if model == "davidson" else "theta"
    lo, hi = entry[f"{tie_name}_ci"]
    assert lo <= tie <= hi
    assert sum(entry["log_strength"].values()) == pytest.approx(0.0, abs=1e-9)
    # The other model still orders the items correctly.
    other = report["rao_kupper" if model == "davidson" else "davidson"]["log_strength"]
    assert other["GT"] > other["XFlow"] > other["ROSALIA"]


def test_three_item_rankings_mean_rank_and_order(tmp_path):
    rng = np.random.default_rng(3)
    rows = []
    for c in range(80):
        for r in range(3):
            score = np.array([0.8, 0.5, -0.6]) + rng.gumbel(size=3)
            order = np.argsort(-score)
            ranks = np.empty(3, int)
            ranks[order] = [1, 2, 3]
            if abs(score[0] - score[1]) < 0.3:  # near-equal GT and XFlow: reader ties them
                ranks[0] = ranks[1] = min(ranks[0], ranks[1])
            rows += [
                (f"c{c}", f"r{r}", name, int(k)) for name, k in zip(["GT", "XFlow", "ROSALIA"], ranks, strict=True)
            ]
    report = preference.analyse(preference.read_rankings(write_csv(tmp_path / "r.csv", rows)), n_bootstrap=50)
    assert report["n_rankings"] == 240 and report["n_cases"] == 80 and report["n_readers"] == 3
    assert report["n_pairs"] == 720
    assert 0 < report["tie_rate"] < 1
    mr = report["mean_rank"]
    assert mr["GT"] < mr["ROSALIA"] and mr["XFlow"] < mr["ROSALIA"]
    for m in preference.MODELS:
        s = report[m]["log_strength"]
        assert s["GT"] > s["ROSALIA"] and s["XFlow"] > s["ROSALIA"]
    diff = report["davidson"]["differences"]["GT - ROSALIA"]
    s = report["davidson"]["log_strength"]
    assert diff["difference"] == pytest.approx(s["GT"] - s["ROSALIA"])
    assert diff["odds"] == pytest.approx(math.exp(diff["difference"]))
    assert diff["ci"][0] <= diff["difference"] <= diff["ci"][1]
    json.dumps(report)  # JSON-ready
    assert "Davidson" in preference.format_table(report)


def test_bad_csv_reports_every_problem(tmp_path):
    path = write_csv(
        tmp_path / "bad.csv",
        [("c1", "r", "A", 1), ("c1", "r", "A", 2), ("c2", "r", "A", "x"), ("c3", "r", "A", 0), ("c4", "r", "B", 1)],
    )
    with pytest.raises(PreferenceError) as err:
        preference.read_rankings(path)
    msg = str(err.value)
    assert "ranked twice" in msg and "not a number" in msg and "< 1" in msg and "only 1 item" in msg
    (tmp_path / "cols.csv").write_text("case,item,rank\nc,A,1\n")
    with pytest.raises(PreferenceError, match="reader"):
        preference.read_rankings(tmp_path / "cols.csv")


def test_no_ties_sends_tie_parameter_to_its_limit():
    rankings = [Ranking(f"c{n}", "r", {"A": 1, "B": 2} if n % 3 else {"A": 2, "B": 1}) for n in range(30)]
    report = preference.analyse(rankings, n_bootstrap=0)
    assert report["tie_rate"] == 0
    assert report["davidson"]["nu"] < 1e-6
    assert report["rao_kupper"]["theta"] == pytest.approx(1.0, abs=1e-6)
    # Without ties both reduce to Bradley–Terry: A beats B 20 of 30 -> log(pi_A/pi_B) = log 2
    for m in preference.MODELS:
        s = report[m]["log_strength"]
        assert s["A"] - s["B"] == pytest.approx(math.log(2), abs=1e-3)


@pytest.mark.parametrize("model", preference.MODELS)
def test_analytic_gradient_matches_finite_differences(model):
    from scipy.optimize import check_grad

    rng = np.random.default_rng(0)
    pairs = np.array([[0, 1], [0, 2], [1, 2], [0, 3], [2, 3]])
    counts = rng.integers(0, 6, size=(5, 3)).astype(float)
    for _ in range(5):
        x = rng.normal(size=4)

        def f(v):
            return preference._negloglik_grad(v, model, 4, pairs, counts)[0]

        def g(v):
            return preference._negloglik_grad(v, model, 4, pairs, counts)[1]

        assert check_grad(f, g, x) < 1e-4 * (1 + np.abs(g(x)).sum())
        # and the objective is the public likelihood
        logs = np.append(x[:3], -x[:3].sum())
        tie = math.exp(x[3]) if model == "davidson" else 1 + math.exp(x[3])
        public = preference.davidson_loglik if model == "davidson" else preference.rao_kupper_loglik
        assert -f(x) == pytest.approx(public(logs, tie, pairs, counts))
