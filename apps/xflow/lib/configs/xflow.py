"""Task configuration of the XFlow app: which MONAI Label tasks it registers, under which names.

The tasks themselves live in the package (:mod:`monailabel_xflow.app`); this file only wires
them to one shared :class:`~monailabel_xflow.app.runtime.XFlowRuntime`.
"""

from __future__ import annotations

from typing import Any, Dict

from monailabel.interfaces.config import TaskConfig
from monailabel.tasks.activelearning.random import Random

from monailabel_xflow.app.infer import XFlowInferTask
from monailabel_xflow.app.revise import XFlowReviseTask
from monailabel_xflow.app.runtime import XFlowRuntime
from monailabel_xflow.app.scoring import XFlowUncertaintyScoring
from monailabel_xflow.app.strategy import XFlowUncertaintyStrategy
from monailabel_xflow.app.train import XFlowSegmenterTrainTask


class XFlowConfig(TaskConfig):
    """``xflow`` (infer + train), ``xflow_revise`` (clicks), ``xflow_uncertainty`` (scoring + strategy)."""

    def init(self, name: str, model_dir: str, conf: Dict[str, str], planner: Any, **kwargs):
        super().init(name, model_dir, conf, planner, **kwargs)
        self.runtime = XFlowRuntime(conf, model_dir=model_dir)

    def infer(self) -> Dict[str, Any]:
        from monailabel_xflow.app.infer import store_seg_default

        return {self.name: XFlowInferTask(self.runtime, store_seg=store_seg_default(self.conf)),
                f"{self.name}_revise": XFlowReviseTask(self.runtime)}

    def trainer(self) -> XFlowSegmenterTrainTask:
        return XFlowSegmenterTrainTask(self.runtime, self.model_dir)

    def strategy(self) -> Dict[str, Any]:
        return {f"{self.name}_uncertainty": XFlowUncertaintyStrategy(), "random": Random()}

    def scoring_method(self) -> Dict[str, Any]:
        return {f"{self.name}_uncertainty": XFlowUncertaintyScoring(self.runtime)}
