"""The demo recipe's data: phantom sets exported once, the held-out evaluation set, and the
balancing of training rows and questions.

Every split of a training phantom set is training data (:func:`training_cases`); the held-out set
is drawn with another seed (:func:`export_heldout`, also what ``xflow benchmark phantom`` scores).
Phantom questions are mostly negatives, so π_init's SFT rows are presence-balanced
(:func:`balanced_presence`), its GRPO questions balanced over level × present/absent
(:func:`balanced_questions`), and π_rev's stop-only trajectories capped (:func:`balanced_revisions`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.data.readers import EvalCase

if TYPE_CHECKING:
    from datasets import Dataset

__all__ = [
    "export_phantoms",
    "training_cases",
    "export_heldout",
    "balanced_presence",
    "balanced_questions",
    "balanced_revisions",
]


def export_phantoms(out: Path, count: int, seed: int, size: int, progress: bool, desc: str) -> Path:
    """Export a phantom set once (:func:`~monailabel_xflow.data.export.export_set`); a ``.done``
    marker makes reruns reuse it. The XFlow and ROSALIA demos train on sets made with it.

    Args:
        out: the set's folder.
        count: phantom studies.
        seed: the phantoms' seed.
        size: phantom side in pixels.
        progress: show a progress bar labelled ``desc``.
        desc: the progress bar's label.

    Returns:
        The set's ``mimic_ils.json``.
    """
    from tqdm.auto import tqdm

    from monailabel_xflow.data.export import GT_DIR, JSON_NAME, export_set

    marker = out / ".done"
    if not marker.is_file():
        export_set(out, count, seed, size=size, progress=lambda it: tqdm(it, desc=desc, disable=not progress))
        marker.write_text(json.dumps({"count": count, "seed": seed, "size": size}))
    return out / GT_DIR / JSON_NAME


def balanced_revisions(rows: Dataset, stop_ratio: float, seed: int = 0) -> Dataset:
    """``rev-sft`` trajectories with the stop-only ones capped at ``stop_ratio`` per clicking one.

    With a segmenter whose box masks are already good, most oracle trajectories are a single
    "stop" turn (225 of 298 with the revision-aware demo F_seg), and π_rev trained on them stops at
    once on every question. Capping them keeps "stop" a learned decision (every clicking
    trajectory still ends in one) while the click turns stop being a minority.

    Args:
        rows: a ``datasets.Dataset`` with a ``targets`` list column (one protocol text per turn).
        stop_ratio: stop-only trajectories kept per trajectory with clicks (<= 0: keep all).
        seed: which stop-only trajectories are kept.
    """
    if stop_ratio <= 0:
        return rows
    turns = np.asarray([len(t) for t in rows["targets"]])
    clicking, stop_only = np.flatnonzero(turns > 1), np.flatnonzero(turns == 1)
    keep = min(len(stop_only), int(round(stop_ratio * len(clicking))))
    chosen = np.random.default_rng(seed).permutation(stop_only)[:keep]
    return rows.select(sorted(np.concatenate([clicking, chosen]).tolist()))


def balanced_presence(rows: Dataset, seed: int = 0, by: Sequence[str] = ("level", "finding")) -> Dataset:
    """``init-sft`` rows with the positives repeated until they are as many as the negatives,
    within each stratum of the ``by`` columns.

    Balancing the pooled rows is not enough: phantom chest-level questions are ~18 % positive,
    lung-level ~12 %, so pooled balancing left chest questions ~58 % positive in training and the
    model answered "present" to 91 % of held-out chest negatives. Balancing per (level, finding)
    makes every question kind a coin toss a priori, so presence has to come from the image.

    Args:
        rows: a ``datasets.Dataset`` with a boolean ``positive`` column (and the ``by`` columns).
        seed: shuffles the result.
        by: columns whose value combinations are balanced separately (empty: pooled). A stratum
            without positives or negatives is kept as it is.
    """
    flags = np.asarray(rows["positive"], bool)
    keys = list(zip(*(rows[c] for c in by), strict=False)) if by else [()] * len(flags)
    strata: dict[tuple[Any, ...], list[int]] = {}
    for k, key in enumerate(keys):
        strata.setdefault(tuple(key), []).append(k)
    chosen: list[NDArray[np.intp]] = []
    changed = False
    for members in strata.values():
        idx = np.asarray(members)
        pos, neg = idx[flags[idx]], idx[~flags[idx]]
        if len(pos) == 0 or len(neg) <= len(pos):
            chosen.append(idx)
            continue
        changed = True
        chosen += [neg, np.resize(pos, len(neg))]  # every positive, cycled to the negatives' count
    if not changed:
        return rows
    # flatten_indices: a shuffled view is slow to read row by row during training
    return rows.select(np.concatenate(chosen)).shuffle(seed=seed).flatten_indices()


def balanced_questions(cases: Sequence[EvalCase], count: int, rng: np.random.Generator) -> list[EvalCase]:
    """About ``count`` questions drawn evenly from each level × present/absent stratum (without
    replacement while a stratum lasts), in a random order.

    Args:
        cases: ``EvalCase`` questions.
        count: how many to draw in all.
        rng: a ``numpy.random.Generator``.
    """
    strata: dict[tuple[str, bool], list[EvalCase]] = {}
    for c in cases:
        strata.setdefault((c.level, bool(c.positive)), []).append(c)
    if not strata:
        return []
    per = -(-count // len(strata))  # ceil
    chosen: list[EvalCase] = []
    for key in sorted(strata):
        pool = strata[key]
        chosen += [pool[k] for k in rng.permutation(len(pool))[:per]]
    return [chosen[k] for k in rng.permutation(len(chosen))]


def training_cases(json_path: Path) -> list[EvalCase]:
    """Every basic and global question of every split of a phantom set (all of it is training)."""
    from monailabel_xflow.data.readers import read_mimic_ils

    cases: list[EvalCase] = []
    for split in ("train", "val", "test"):
        cases += read_mimic_ils(json_path, split=split, kinds=("basic", "global")).cases
    return cases


def _matched_draw(
    positives: list[tuple[str, dict[str, Any]]],
    negatives: list[tuple[str, dict[str, Any]]],
    count: int,
    level: str,
    rng: np.random.Generator,
) -> list[tuple[str, dict[str, Any]]]:
    """``count`` questions of one level: random positives, each with a negative asking the same
    text of another image (the set's matched negatives), and one unmatched positive when
    ``count`` is odd. So the chosen texts say nothing about presence, as in the whole set."""
    by_text: dict[str, list[int]] = {}
    for k, (_, pair) in enumerate(negatives):
        by_text.setdefault(pair["instruction"], []).append(k)
    chosen: list[tuple[str, dict[str, Any]]] = []
    extra: tuple[str, dict[str, Any]] | None = None
    for k in rng.permutation(len(positives)):
        study, pair = positives[k]
        free = by_text.get(pair["instruction"], [])
        if len(chosen) < count - count % 2 and free:
            chosen += [(study, pair), negatives[free.pop(int(rng.integers(len(free))))]]
        elif extra is None and count % 2:
            extra = (study, pair)
    if extra is not None:
        chosen.append(extra)
    if len(chosen) < count:
        raise ValueError(f"held-out set too small: {len(chosen)} matched {level} questions for {count}")
    return sorted(chosen, key=lambda c: c[1]["pair_id"])


def export_heldout(
    out: str | Path, seed: int = 1000, questions: int = 200, size: int = 256, progress: bool = True
) -> Path:
    """A held-out evaluation set: ``questions`` phantom questions, balanced over levels.

    Phantoms are drawn with ``seed`` (use one the training never used); the questions are split as
    evenly as possible over the chest / lung / zone levels and, within a level, over positives and
    negatives: each negative asks a chosen positive's exact question of another phantom
    (:func:`_matched_draw`). They are written, all in the ``test`` split, to
    ``OUT/ground-truth/heldout.json`` beside the set's own ``mimic_ils.json`` (so masks resolve
    the same way).

    Returns:
        The JSON path; evaluate with ``xflow eval --dataset mimic-ils:PATH``.
    """
    from monailabel_xflow.instructions import parse_instruction

    out = Path(out)
    studies = max(4, questions // 6)
    json_path = export_phantoms(out, studies, seed, size, progress, "held-out phantoms")
    release = json.loads(json_path.read_text())
    rng = np.random.default_rng(seed)
    pools: dict[tuple[str, bool], list[tuple[str, dict[str, Any]]]] = {}
    for split in release.values():
        for study, entry in split.items():
            for sign, key in ((True, "positive_pairs"), (False, "negative_pairs")):
                for pair in entry["instruction_answer_pairs"][key]:
                    if pair["type"] not in ("basic", "global"):
                        continue
                    level = parse_instruction(pair["instruction"]).level
                    pools.setdefault((level, sign), []).append((study, pair))
    levels = ("chest", "lung", "zone")
    chosen: list[tuple[str, dict[str, Any]]] = []
    for i, level in enumerate(levels):
        n_level = questions // 3 + (1 if i < questions % 3 else 0)
        chosen += _matched_draw(pools.get((level, True), []), pools.get((level, False), []), n_level, level, rng)
    entries = {s: e for split in release.values() for s, e in split.items()}
    test: dict[str, dict[str, Any]] = {}
    for study, pair in chosen:
        entry = test.setdefault(
            study, dict(entries[study], instruction_answer_pairs={"positive_pairs": [], "negative_pairs": []})
        )
        entry["instruction_answer_pairs"]["positive_pairs" if pair["seg"] else "negative_pairs"].append(pair)
    heldout = json_path.parent / "heldout.json"
    heldout.write_text(json.dumps({"train": {}, "val": {}, "test": test}, indent=1))
    return heldout
