"""The ``rosalia`` infer task: the papers' single-shot baseline beside ``xflow``.

Same request keys as ``xflow`` (``instruction`` free text or the ``finding`` / ``location``
pickers, ``overlay``, ``trace``, ``result_extension`` / ``result_dtype``, ``store_seg``,
``label_values``;
:func:`~monailabel_xflow.app.infer.instructions_from_request` reads them), same output: one
label map painted with the values ``label_names`` gives (:func:`~monailabel_xflow.app.infer.paint`),
``answer`` sentences and ``findings`` records in XFlow's words, ``traces`` (ROSALIA's: raw text
with ``[SEG]``, decision, timings). ROSALIA has no clicks: ``max_clicks`` / ``revise`` are not
options of this task.

``store_seg`` works as for ``xflow`` (:func:`~monailabel_xflow.app.infer.seg_request`; default
``--conf store_seg``, :func:`~monailabel_xflow.app.infer.store_seg_default`): with a DICOMweb
datastore the app stores the label as a DICOM SEG in the image's study (``seg_series`` in the
params; SeriesDescription ``"ROSALIA: <findings>"``, ManufacturerModelName ``ROSALIA``); with a
studies folder the request answers 422 saying so.

Weights: the ``rosalia`` key of the models configuration, else the committed ROSALIA demo
(:func:`monailabel_xflow.workflow.model_config.rosalia_source`); ``/info`` names which (``rosalia_models``).
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.app import layout
from monailabel_xflow.app.errors import ModelsNotConfiguredError, http_errors
from monailabel_xflow.app.infer import (
    FINDING_CHOICES,
    LABEL_VALUE_CHOICES,
    LABELS,
    LOCATION_CHOICES,
    _InferTask,
    as_bool,
    finding_masks,
    finding_record,
    instructions_from_request,
    label_names_for,
    paint,
    result_format,
    seg_request,
    write_result,
)
from monailabel_xflow.instructions import Instruction

logger = logging.getLogger(__name__)

HOW_TO_CONFIGURE_ROSALIA = (
    "No ROSALIA weights: set `rosalia: PATH` (a ROSALIA folder) in the models file (`--conf models_file PATH`) "
    "or XFLOW_ROSALIA=PATH; the committed ROSALIA demo is used otherwise (unless XFLOW_NO_DEMO is set)."
)


@dataclass
class RosaliaResult:
    """One answered instruction, in the shape :func:`paint` / :func:`finding_record` read."""

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
    """The app's lazily loaded, lock-protected ROSALIA predictor.

    Args:
        conf: the app's ``--conf`` (key ``models``), as for :class:`~monailabel_xflow.app.runtime.XFlowRuntime`.
        environ: environment (``XFLOW_MODELS``, ``XFLOW_ROSALIA``, ``XFLOW_NO_DEMO``).
        preload: load now (the server does, so its log names the model at start-up).
    """

    def __init__(
        self, conf: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None, preload: bool = True
    ) -> None:
        import os

        from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError, default_config, rosalia_source

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
        from monailabel_xflow.workflow.model_config import ROSALIA_DEMO_NAME, ROSALIA_DEMO_NOTICE

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
        from monailabel_xflow.workflow.model_config import ROSALIA_DEMO_NOTICE

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
                from monailabel_xflow.workflow.model_config import ROSALIA_DEMO_NAME, ModelConfigError

                identity = {"rosalia": ROSALIA_DEMO_NAME if self.is_demo else str(self.path)}
                logger.info("loading ROSALIA %s", self.describe())
                try:
                    self._predictor = RosaliaPredictor.from_pretrained(self.path, device=self.device, identity=identity)
                except (RosaliaError, OSError) as exc:
                    self._error = ModelConfigError(f"ROSALIA weights {self.path} cannot be loaded: {exc}")
                    raise self._error from exc
                self._error = None
            return self._predictor


class RosaliaInferTask(_InferTask):
    """``rosalia``: instruction -> label map + answer, by ROSALIA (one shot, no revision)."""

    def __init__(self, runtime: RosaliaRuntime, description: str = "", store_seg: bool = False):
        from monailabel.interfaces.tasks.infer_v2 import InferType

        super().__init__(
            type=InferType.SEGMENTATION,
            labels=dict(LABELS),
            dimension=2,
            description=description
            or f"ROSALIA (the papers' baseline) instruction-guided CXR lesion segmentation ({runtime.describe()})",
            config={
                "instruction": "",
                "finding": list(FINDING_CHOICES),
                "location": list(LOCATION_CHOICES),
                "overlay": False,
                "trace": True,
                "store_seg": bool(store_seg),
                "label_values": list(LABEL_VALUE_CHOICES),
            },
        )
        self.runtime = runtime

    def is_valid(self) -> bool:
        return True  # listed even without weights: requests then answer 503 saying how to configure

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["rosalia_models"] = self.runtime.status()
        return out

    def __call__(self, request: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        with http_errors("rosalia"):
            return self._run({**self.config(), **dict(request)})

    def _run(self, data: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        t0 = time.perf_counter()
        instructions = instructions_from_request(data)
        overlay = as_bool(data.get("overlay", False), "overlay")
        with_trace = as_bool(data.get("trace", True), "trace")
        seg = seg_request(data, instructions, "ROSALIA")  # stored by the app, as for `xflow`
        names = label_names_for([i.finding for i in instructions], data)
        extension, dtype = result_format(data)  # the same result files as `xflow` (NRRD/NIfTI for OHIF)
        image, ref = layout.load_image(data.get("image"), data.get("image_id"))
        t_pre = time.perf_counter()
        predictor = self.runtime.get()
        results = []
        with self.runtime.lock:
            predictor.set_image(image)  # one encoding for every instruction
            for instr in instructions:
                mask, answer, trace = predictor.predict(instr)
                results.append(RosaliaResult(instr, bool(mask.any()), mask, answer, trace))
        t_model = time.perf_counter()
        label, overlap = paint(results, ref.shape, names)
        answer = " ".join(r.message for r in results)
        label_file = write_result(label, ref, extension, dtype, answer)
        params: dict[str, Any] = {
            "answer": answer,
            "findings": [finding_record(r, names) for r in results],
            "empty": not bool(label.any()),
            "overlap_pixels": overlap,
            "label_names": names,
            "models": self.runtime.describe(),
        }
        if with_trace:
            params["traces"] = [r.trace for r in results]
        if seg:  # done by the app, which holds the datastore (app.xflow_app.checked_infer)
            params["store_seg"] = {**seg, "masks": finding_masks(results, ref.shape)}
        if overlay:
            params["overlay_png_base64"] = base64.b64encode(layout.overlay_png(image, label)).decode("ascii")
        t_end = time.perf_counter()
        params["latencies"] = {
            "pre": round(t_pre - t0, 4),
            "infer": round(t_model - t_pre, 4),
            "post": round(t_end - t_model, 4),
            "total": round(t_end - t0, 4),
        }
        logger.info("rosalia: %s -> %s (%.3f s)", [i.text for i in instructions], params["answer"], t_end - t0)
        return label_file, params


__all__ = ["RosaliaRuntime", "RosaliaInferTask", "RosaliaResult", "HOW_TO_CONFIGURE_ROSALIA"]
