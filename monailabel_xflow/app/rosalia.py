"""The ``rosalia`` infer task: the papers' single-shot baseline beside ``xflow``.

The request keys and output of :mod:`monailabel_xflow.app.task` (as ``xflow``); ``traces`` are
ROSALIA's (raw text with ``[SEG]``, decision, timings) and a stored SEG names ROSALIA. ROSALIA has
no clicks: ``max_clicks`` / ``revise`` are not options of this task.

Weights and loading: :class:`~monailabel_xflow.rosalia.runtime.RosaliaRuntime` (the ``rosalia`` key of
the models configuration, else the committed ROSALIA demo); ``/info`` names which (``rosalia_models``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monailabel_xflow.app.task import AnswerTask
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.rosalia.runtime import RosaliaRuntime
from monailabel_xflow.task_options import FINDING_CHOICES, LABEL_VALUE_CHOICES, LOCATION_CHOICES


class RosaliaInferTask(AnswerTask):
    """``rosalia``: instruction -> label map + answer, by ROSALIA (one shot, no revision)."""

    name = "rosalia"
    algorithm = "ROSALIA"

    def __init__(self, runtime: RosaliaRuntime, description: str = "", store_seg: bool = False):
        super().__init__(
            runtime,
            description
            or f"ROSALIA (the papers' baseline) instruction-guided CXR lesion segmentation ({runtime.describe()})",
            {
                "instruction": "",
                "finding": list(FINDING_CHOICES),
                "location": list(LOCATION_CHOICES),
                "overlay": False,
                "trace": True,
                "store_seg": bool(store_seg),
                "label_values": list(LABEL_VALUE_CHOICES),
            },
        )

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["rosalia_models"] = self.runtime.status()
        return out

    def answer(self, image: np.ndarray, instructions: Sequence[Instruction], options: Mapping[str, Any]) -> list[Any]:
        return self.runtime.answer(image, instructions)

    def trace(self, result: Any) -> dict[str, Any]:
        return result.trace


__all__ = ["RosaliaInferTask"]
