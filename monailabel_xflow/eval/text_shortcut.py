"""Can presence be read off the question? The text-only audit of a question set.

A question set measures presence from the image only if the wording says nothing about the answer.
Issue 35 found the phantom set failing this: zone-level positives named every zone their lesion
touches and negatives one zone, so "present iff two or more regions are named" reached zone F1
0.837, and a bag-of-words classifier on the question alone reached balanced accuracy 0.90.

Two text-only readers, scored per question level (chest / lung / zone) by balanced accuracy
(the mean of the true-positive and true-negative rates: 0.5 is chance whatever the positive share):

* :func:`question_only_accuracy`: the benchmark's ``question-only`` baseline
  (:mod:`~monailabel_xflow.eval.phantom_baselines`): present iff the question names >= 2 regions.
* :func:`text_classifier_accuracy`: logistic regression on word and word-pair counts
  (scikit-learn), class-weighted, cross-validated with folds split by question text, so each
  question is scored by a model that never saw its wording and must generalise from words (how
  many zones, which side, which finding).

:func:`text_shortcut_audit` runs both with a bootstrap interval over images. When every text of
a level is as frequent among negatives as among positives (:func:`text_balance` ``unmatched`` 0,
as ``data/export.py`` draws phantom sets, up to the few positives with fewer free phantoms), *any*
rule of the text alone has equal true- and false-positive rates, so balanced accuracy exactly
0.5; the classifier then measures the rest. On the set before issue 35 (seed 1000, 300
questions) the zone level gave question-only 0.88 and the classifier 0.83; the text-matched set
gives 0.50 and 0.50 at every level.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.eval.phantom_baselines import question_only_present
from monailabel_xflow.vocabulary import LEVELS

__all__ = [
    "question_only_accuracy",
    "text_classifier_accuracy",
    "text_balance",
    "text_shortcut_audit",
]


def _image_of(case: EvalCase) -> str:
    return str(case.meta.get("study") or case.image_path)


def _balanced_accuracy(truth: np.ndarray, guess: np.ndarray) -> float:
    """Mean of the true-positive and true-negative rates (nan when one class is missing)."""
    truth, guess = np.asarray(truth, bool), np.asarray(guess, bool)
    if truth.all() or not truth.any():
        return float("nan")
    return float((guess[truth].mean() + (~guess[~truth]).mean()) / 2)


def question_only_accuracy(cases: Sequence[EvalCase]) -> float:
    """Balanced accuracy of "present iff the question names two or more regions"."""
    truth = np.asarray([c.positive for c in cases], bool)
    return _balanced_accuracy(truth, _question_only_guesses(cases))


def _question_only_guesses(cases: Sequence[EvalCase]) -> np.ndarray:
    return np.asarray([question_only_present(c.instruction) for c in cases], bool)


def text_classifier_predictions(cases: Sequence[EvalCase], folds: int = 5, seed: int = 0) -> np.ndarray:
    """Out-of-fold presence guesses of a word-count logistic regression on the question text.

    Args:
        cases: questions of one level (``instruction.text`` is what the classifier reads).
        folds: cross-validation folds, split by question text (at most the number of texts).
        seed: the fold assignment's shuffle.

    Returns:
        ``(len(cases),)`` bool: each question's guess from the model fit on the other folds (a
        fold whose training part holds one class only guesses that class).
    """
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    texts = [c.instruction.text for c in cases]
    truth = np.asarray([c.positive for c in cases], bool)
    distinct = sorted(set(texts))
    order = np.random.default_rng(seed).permutation(len(distinct))
    fold_of_text = {distinct[i]: k % max(1, min(folds, len(distinct))) for k, i in enumerate(order)}
    fold = np.asarray([fold_of_text[t] for t in texts])
    # regions are multi-word names ("right lung base"): bigrams keep them apart from one another
    vectorizer = CountVectorizer(ngram_range=(1, 2), token_pattern=r"[a-z]+")
    counts = vectorizer.fit_transform(texts)
    guess = np.zeros(len(cases), bool)
    for k in np.unique(fold):
        train, test = fold != k, fold == k
        if truth[train].all() or not truth[train].any():
            guess[test] = bool(truth[train].any())
            continue
        model = LogisticRegression(max_iter=1000, class_weight="balanced").fit(counts[train], truth[train])
        guess[test] = model.predict(counts[test]).astype(bool)
    return guess


def text_classifier_accuracy(cases: Sequence[EvalCase], folds: int = 5, seed: int = 0) -> float:
    """Balanced accuracy of :func:`text_classifier_predictions` (cross-validated by text)."""
    truth = np.asarray([c.positive for c in cases], bool)
    return _balanced_accuracy(truth, text_classifier_predictions(cases, folds, seed))


def text_balance(cases: Sequence[EvalCase]) -> dict[str, dict[str, int]]:
    """Per level: questions, positives, and ``unmatched``, the questions by which the texts'
    counts among negatives depart from their counts among positives scaled to the negatives'
    number (sum over texts of ``|neg(t) - r * pos(t)|`` with ``r`` = negatives / positives,
    rounded). 0 means every text is as frequent among negatives as among positives, so any rule
    of the text alone has equal true- and false-positive rates."""
    out = {}
    for level in LEVELS:
        mine = [c for c in cases if c.level == level]
        pos = Counter(c.instruction.text for c in mine if c.positive)
        neg = Counter(c.instruction.text for c in mine if not c.positive)
        r = sum(neg.values()) / max(1, sum(pos.values()))
        out[level] = {
            "questions": len(mine),
            "positives": sum(pos.values()),
            "unmatched": int(round(sum(abs(neg[t] - r * pos[t]) for t in set(pos) | set(neg)))),
        }
    return out


def text_shortcut_audit(
    cases: Sequence[EvalCase], folds: int = 5, replicates: int = 1000, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Both text-only readers per level, with 95 % bootstrap intervals over images.

    Args:
        cases: questions (any levels; MIMIC-ILS or phantom sets).
        folds: the classifier's cross-validation folds (by question text).
        replicates: bootstrap resamplings of the images (the guesses are fixed; only the scoring
            is resampled).
        seed: folds and bootstrap.

    Returns:
        ``{level: {"questions", "positives", "unmatched", "question_only", "text_classifier"}}``
        where each reader's balanced accuracy is ``{"value", "low", "high"}`` (the interval format
        of :mod:`~monailabel_xflow.eval.bootstrap`); a level without both classes scores nan.
    """
    rng = np.random.default_rng(seed)
    balance = text_balance(cases)
    out: dict[str, dict[str, Any]] = {}
    for level in LEVELS:
        mine = [c for c in cases if c.level == level]
        entry: dict[str, Any] = dict(balance[level])
        if not mine:
            out[level] = entry
            continue
        truth = np.asarray([c.positive for c in mine], bool)
        guesses = {
            "question_only": _question_only_guesses(mine),
            "text_classifier": text_classifier_predictions(mine, folds, seed),
        }
        images = np.asarray([_image_of(c) for c in mine])
        unique = np.unique(images)
        members = [np.flatnonzero(images == u) for u in unique]
        draws = [
            np.concatenate([members[i] for i in rng.integers(len(unique), size=len(unique))]) for _ in range(replicates)
        ]
        for name, guess in guesses.items():
            values = np.asarray([_balanced_accuracy(truth[d], guess[d]) for d in draws])
            values = values[np.isfinite(values)]
            lo, hi = np.percentile(values, [2.5, 97.5]) if len(values) else (float("nan"), float("nan"))
            entry[name] = {"value": _balanced_accuracy(truth, guess), "low": float(lo), "high": float(hi)}
        out[level] = entry
    return out
