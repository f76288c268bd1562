"""The phantom benchmark's trivial baselines: answers that look at nothing but the question.

``never-present`` (an empty mask for every question), ``always-present`` (the whole region the
instruction names, from the phantom's true anatomy: the lung, the zones, or the chest = lungs and
heart) and ``question-only`` (that whole region only when the question names two or more regions:
the phantom questions' one text shortcut, as a zone-level positive lists every zone its lesion
touches while a zone-level negative names one zone). A method is worth its compute only where it
beats them; where it merely matches ``question-only`` it answers from the text, not the image.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.data.readers import EvalCase
from monailabel_xflow.eval.evaluate import Predictor
from monailabel_xflow.instructions import Instruction

__all__ = ["region_mask", "question_only_present", "baseline_predictors"]


def region_mask(instruction: Instruction, anatomy: NDArray[Any]) -> NDArray[np.bool_]:
    """The whole region an instruction names, from a phantom's anatomy label map.

    Args:
        instruction: the question; its regions are lungs, zones or the heart, or none (chest level).
        anatomy: ``(H, W)`` uint8 label map of ``data.export`` (1..8 the zones in
            :data:`~monailabel_xflow.vocabulary.ALL_ZONES` order, 9 the heart, 0 elsewhere).

    Returns:
        ``(H, W)`` bool: the named lungs' zones, the named zones, the heart, or (no region: chest
        level) both lungs and the heart.
    """
    from monailabel_xflow.vocabulary import ALL_ZONES, HEART, ZONES

    labels: set[int] = set()
    for region in instruction.regions:
        if region == HEART:
            labels.add(len(ALL_ZONES) + 1)
        else:
            labels.update(ALL_ZONES.index(z) + 1 for z in ZONES.get(region, (region,)))
    if not labels:
        labels = set(range(1, len(ALL_ZONES) + 2))
    return np.isin(anatomy, sorted(labels))


def question_only_present(instruction: Instruction) -> bool:
    """The ``question-only`` baseline's answer: present iff the question names two or more regions
    (also what ``eval/text_shortcut.py`` scores as the text-only rule)."""
    return len(instruction.regions) >= 2


def baseline_predictors() -> dict[str, tuple[Predictor, str]]:
    """``{name: (predict, identity)}`` of the trivial baselines
    (:data:`~monailabel_xflow.eval.phantom_protocol.BASELINES`) on exported phantoms (the anatomy
    map beside the image: ``<image dir>/ground-truth/anatomy/<image name>``).

    Raises (from ``predict``):
        EvaluationError: the phantom's anatomy map is missing.
    """
    from monailabel_xflow.data.export import GT_DIR
    from monailabel_xflow.eval.evaluate import EvaluationError

    def always(case: EvalCase) -> NDArray[np.bool_]:
        path = case.image_path.parent / GT_DIR / "anatomy" / case.image_path.name
        if not path.is_file():
            raise EvaluationError(f"no anatomy map {path} for the always-present baseline")
        from PIL import Image

        return region_mask(case.instruction, np.asarray(Image.open(path)))

    def question_only(case: EvalCase) -> NDArray[np.bool_] | None:
        return always(case) if question_only_present(case.instruction) else None

    def never(case: EvalCase) -> None:
        return None

    return {
        "never-present": (never, "baseline:never-present/1"),
        "always-present": (always, "baseline:always-present/1"),
        "question-only": (question_only, "baseline:question-only/1"),
    }
