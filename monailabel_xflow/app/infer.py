"""The ``xflow`` infer task: instruction -> label map + answer sentence(s) + trace (XFlow, Stage 1 + 2).

Shared keys and output: :mod:`monailabel_xflow.app.task`. Its own:

``max_clicks`` (int, 0..16)
    Stage 2 budget (default: the model configuration's); findings x (1 + max_clicks) at most
    :data:`~monailabel_xflow.parameters.MAX_WORK_STEPS` per request.
``revise`` (bool; options ``["false", "true"]``)
    Run Stage 2; not sent or the option list sent back (OHIF): true. 3D Slicer sends an option
    list's first entry, so its *Run* asks Stage 1 only (seconds rather than minutes on CPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monailabel_xflow.app.task import AnswerTask
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.parameters import as_bool, check_work
from monailabel_xflow.task_options import (
    FINDING_CHOICES,
    LABEL_VALUE_CHOICES,
    LOCATION_CHOICES,
    REVISE_CHOICES,
    AnswerRequest,
    as_max_clicks,
    unpicked,
)
from monailabel_xflow.workflow.runtime import XFlowRuntime


class XFlowInferTask(AnswerTask):
    """``xflow``: instruction-guided segmentation (Stage 1 + Stage 2) as a MONAI Label model."""

    name = "xflow"
    algorithm = "XFlow"

    def __init__(self, runtime: XFlowRuntime, description: str = "", store_seg: bool = False):
        super().__init__(
            runtime,
            description or f"XFlow instruction-guided CXR lesion segmentation ({runtime.describe()})",
            {
                "instruction": "",
                "finding": list(FINDING_CHOICES),
                "location": list(LOCATION_CHOICES),
                "max_clicks": int(runtime.config.max_clicks),
                "revise": list(REVISE_CHOICES),
                "overlay": False,
                "trace": True,
                "store_seg": bool(store_seg),
                "label_values": list(LABEL_VALUE_CHOICES),
            },
        )

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["xflow_models"] = self.runtime.status()
        return out

    def options(self, data: Mapping[str, Any], request: AnswerRequest) -> dict[str, Any]:
        max_clicks = as_max_clicks(data.get("max_clicks"))
        revise = as_bool(unpicked(data.get("revise"), REVISE_CHOICES, True), "revise")
        budget = self.runtime.config.max_clicks if max_clicks is None else max_clicks
        check_work(len(request.instructions), budget if revise else 0)
        return {"max_clicks": max_clicks, "revise": revise}

    def answer(self, image: np.ndarray, instructions: Sequence[Instruction], options: Mapping[str, Any]) -> list[Any]:
        xflow = self.runtime.get()
        if len(instructions) == 1:
            return [xflow.run(image, instructions[0], **options)]
        return xflow.run_all(image, instructions=instructions, **options)  # one image encode, one policy prefix

    def trace(self, result: Any) -> dict[str, Any]:
        return result.trace.to_dict()
