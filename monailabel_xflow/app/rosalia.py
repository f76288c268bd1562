"""The ``rosalia`` infer task: the papers' single-shot baseline beside ``xflow``.

The request keys and output of :mod:`monailabel_xflow.app.task` (as ``xflow``); ``traces`` are
ROSALIA's (raw text with ``[SEG]``, decision, timings) and a stored SEG names ROSALIA. ROSALIA has
no clicks: ``max_clicks`` / ``revise`` are not options of this task.

Weights: the ``rosalia`` key of the models configuration, else the committed ROSALIA demo
(:func:`monailabel_xflow.rosalia.weights.rosalia_source`); ``/info`` names which (``rosalia_models``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.app.errors import ModelsNotConfiguredError
from monailabel_xflow.app.task import AnswerTask
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.task_options import FINDING_CHOICES, LABEL_VALUE_CHOICES, LOCATION_CHOICES

logger = logging.getLogger(__name__)

HOW_TO_CONFIGURE_ROSALIA = (
    "No ROSALIA weights: set `rosalia: PATH` (a ROSALIA folder) in the models file (`--conf models_file PATH`) "
    "or XFLOW_ROSALIA=PATH; the committed ROSALIA demo is used otherwise (unless XFLOW_NO_DEMO is set)."
)


@dataclass
class RosaliaResult:
    """One answered instruction (:class:`~monailabel_xflow.app.task.Answer`)."""

    instruction: Instruction
    present: bool
    mask: np.ndarray
    answer: str
    trace: dict[str, Any] = field(default_factory=dict)

    @property
    def message(self) -> str:
        """XFlow's readable sentence: the answer, or for a present basic instruction a summary."""
        return self.instruction.message(self.answer, 1, int(self.mask.sum()))


class RosaliaRuntime:
    """The app's lazily loaded, lock-protected ROSALIA predictor (configured as
    :class:`~monailabel_xflow.app.runtime.XFlowRuntime`; ``preload``: load now, so the log names it)."""

    def __init__(
        self, conf: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None, preload: bool = True
    ) -> None:
        import os

        from monailabel_xflow.rosalia.weights import rosalia_source
        from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError, default_config

        self.lock = threading.RLock()
        self._environ = os.environ if environ is None else environ
        self._predictor: Any = None
        self._error: Exception | None = None
        self.path: Path | None = None
        self.source = "none"
        try:
            path = (conf or {}).get("models")
            config = ModelConfig.from_file(path) if path else default_config(self._environ)[0]
            self.device = config.device
            self.path, self.source = rosalia_source(config, self._environ)
        except ModelConfigError as exc:  # keep serving, say why
            logger.error("ROSALIA configuration unusable: %s", exc)
            self.device, self._error = None, exc
        if preload and self.path is not None:
            try:
                self.get()
            except Exception as exc:  # keep serving: /info and every request report it
                logger.error("ROSALIA could not be loaded: %s", exc)

    @property
    def is_demo(self) -> bool:
        return self.source == "demo"

    def status(self) -> dict[str, Any]:
        """For ``/info``: which ROSALIA is served (the demo is named as such)."""
        from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_NAME, ROSALIA_DEMO_NOTICE

        out: dict[str, Any] = {
            "configured": self.path is not None,
            "source": self.source,
            "path": str(self.path) if self.path else None,
            "loaded": self._predictor is not None,
        }
        if self.is_demo:
            out.update(demo=ROSALIA_DEMO_NOTICE, model_name=ROSALIA_DEMO_NAME)
        if self.path is None:
            out["message"] = HOW_TO_CONFIGURE_ROSALIA
        if self._error is not None:
            out["error"] = str(self._error)
        return out

    def describe(self) -> str:
        from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_NOTICE

        if self.path is None:
            return "NOT CONFIGURED - " + HOW_TO_CONFIGURE_ROSALIA
        return f"{ROSALIA_DEMO_NOTICE} ({self.path})" if self.is_demo else f"rosalia={self.path}"

    def get(self) -> Any:
        """The loaded :class:`~monailabel_xflow.rosalia.predictor.RosaliaPredictor`.

        Raises:
            ModelsNotConfiguredError: no ROSALIA weights (HTTP 503 with how to configure).
            ModelConfigError: the configured weights cannot be read.
        """
        if self._error is not None and self._predictor is None and self.path is None:
            raise self._error
        if self.path is None:
            raise ModelsNotConfiguredError(HOW_TO_CONFIGURE_ROSALIA)
        with self.lock:
            if self._predictor is None:
                from monailabel_xflow.rosalia.model import RosaliaError
                from monailabel_xflow.rosalia.predictor import RosaliaPredictor
                from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_NAME
                from monailabel_xflow.workflow.model_config import ModelConfigError

                identity = {"rosalia": ROSALIA_DEMO_NAME if self.is_demo else str(self.path)}
                logger.info("loading ROSALIA %s", self.describe())
                try:
                    self._predictor = RosaliaPredictor.from_pretrained(self.path, device=self.device, identity=identity)
                except (RosaliaError, OSError) as exc:
                    self._error = ModelConfigError(f"ROSALIA weights {self.path} cannot be loaded: {exc}")
                    raise self._error from exc
                self._error = None
            return self._predictor


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
        predictor = self.runtime.get()
        results = []
        with self.runtime.lock:
            predictor.set_image(image)  # one encoding for every instruction
            for instr in instructions:
                mask, answer, trace = predictor.predict(instr)
                results.append(RosaliaResult(instr, bool(mask.any()), mask, answer, trace))
        return results

    def trace(self, result: Any) -> dict[str, Any]:
        return result.trace


__all__ = ["RosaliaRuntime", "RosaliaInferTask", "RosaliaResult", "HOW_TO_CONFIGURE_ROSALIA"]
