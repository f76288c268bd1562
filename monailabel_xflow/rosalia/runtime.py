"""The ROSALIA a server holds: which weights, loaded on first use with XFlow's back-off, one user at a time.

Weights: the ``rosalia`` key of the models configuration (``conf["models"]``, the app's ``--conf
models_file``), else the committed ROSALIA demo (:func:`monailabel_xflow.rosalia.weights.rosalia_source`).
Loading goes through the same :class:`~monailabel_xflow.workflow.runtime.LazyModel` as XFlow's
models: a failed load answers 503 for the back-off instead of reloading per request.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.errors import ModelsNotConfiguredError
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.workflow.runtime import LazyModel

logger = logging.getLogger(__name__)

HOW_TO_CONFIGURE_ROSALIA = (
    "No ROSALIA weights: set `rosalia: PATH` (a ROSALIA folder) in the models file (`--conf models_file PATH`) "
    "or XFLOW_ROSALIA=PATH; the committed ROSALIA demo is used otherwise (unless XFLOW_NO_DEMO is set)."
)


@dataclass
class RosaliaResult:
    """One answered instruction, as XFlow's ``XFlowResult`` answers it (``instruction``, ``present``,
    ``mask`` bool ``(H, W)``, ``answer``, :attr:`message`), with ROSALIA's trace."""

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
    """The lazily loaded ROSALIA predictor of one server; :attr:`lock` serialises its use (the
    predictor holds the image it was last set to).

    Args:
        conf: the app's configuration; ``models`` names the model configuration file.
        environ: where ``XFLOW_ROSALIA`` / ``XFLOW_NO_DEMO`` are read (default ``os.environ``).
        preload: load now, so the log names it.
    """

    def __init__(
        self, conf: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None, preload: bool = True
    ) -> None:
        from monailabel_xflow.rosalia.weights import rosalia_source
        from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError, default_config

        self.lock = threading.RLock()
        self._environ = os.environ if environ is None else environ
        self.model: LazyModel[Any] = LazyModel("ROSALIA weights", self._load)
        self._config_error: Exception | None = None
        self.path: Path | None = None
        self.source = "none"
        self.device: str | None = None
        try:
            path = (conf or {}).get("models")
            config = ModelConfig.from_file(path) if path else default_config(self._environ)[0]
            self.device = config.device
            self.path, self.source = rosalia_source(config, self._environ)
        except ModelConfigError as exc:  # keep serving, say why
            logger.error("ROSALIA configuration unusable: %s", exc)
            self._config_error = exc
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
            "loaded": self.model.loaded,
        }
        if self.is_demo:
            out.update(demo=ROSALIA_DEMO_NOTICE, model_name=ROSALIA_DEMO_NAME)
        if self.path is None:
            out["message"] = HOW_TO_CONFIGURE_ROSALIA
        error = self._config_error or self.model.error
        if error is not None:
            out["error"] = str(error)
        return out

    def describe(self) -> str:
        """One line naming the ROSALIA in use."""
        from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_NOTICE

        if self.path is None:
            return "NOT CONFIGURED - " + HOW_TO_CONFIGURE_ROSALIA
        return f"{ROSALIA_DEMO_NOTICE} ({self.path})" if self.is_demo else f"rosalia={self.path}"

    def get(self) -> Any:
        """The loaded :class:`~monailabel_xflow.rosalia.predictor.RosaliaPredictor`.

        Raises:
            ModelsNotConfiguredError: no ROSALIA weights (HTTP 503 with how to configure).
            ModelConfigError: the configuration or the configured weights cannot be read.
            ModelUnavailableError: the last load failed less than the back-off ago (503).
        """
        if self._config_error is not None:
            raise self._config_error
        if self.path is None:
            raise ModelsNotConfiguredError(HOW_TO_CONFIGURE_ROSALIA)
        return self.model.get()

    def _load(self) -> Any:
        from monailabel_xflow.rosalia.model import RosaliaError
        from monailabel_xflow.rosalia.predictor import RosaliaPredictor
        from monailabel_xflow.rosalia.weights import ROSALIA_DEMO_NAME
        from monailabel_xflow.workflow.model_config import ModelConfigError

        if self.path is None:  # get() loads only a configured ROSALIA
            raise ModelsNotConfiguredError(HOW_TO_CONFIGURE_ROSALIA)
        identity = {"rosalia": ROSALIA_DEMO_NAME if self.is_demo else str(self.path)}
        logger.info("loading ROSALIA %s", self.describe())
        try:
            return RosaliaPredictor.from_pretrained(self.path, device=self.device, identity=identity)
        except (RosaliaError, OSError) as exc:
            raise ModelConfigError(f"ROSALIA weights {self.path} cannot be loaded: {exc}") from exc

    def answer(self, image: np.ndarray, instructions: Sequence[Instruction]) -> list[RosaliaResult]:
        """One :class:`RosaliaResult` per instruction on ``image`` (``float32 (H, W)`` in ``[0, 1]``):
        the image encoded once, the predictor held for the whole request.

        Raises:
            as :meth:`get`, and the predictor's input errors.
        """
        predictor = self.get()
        results = []
        with self.lock:
            predictor.set_image(image)  # one encoding for every instruction
            for instr in instructions:
                mask, answer, trace = predictor.predict(instr)
                results.append(RosaliaResult(instr, bool(mask.any()), mask, answer, trace))
        return results
