"""Task configurations of the XFlow app: which MONAI Label tasks it registers, under which names
(MONAI Label's sample apps keep these in ``lib/configs/``; here they ship in the package).
"""

from __future__ import annotations

from typing import Any

from monailabel.interfaces.config import TaskConfig
from monailabel.tasks.activelearning.random import Random

from monailabel_xflow.app.infer import XFlowInferTask
from monailabel_xflow.app.requests import prefetch_enabled, store_seg_default
from monailabel_xflow.app.revise import XFlowReviseTask
from monailabel_xflow.app.rosalia import RosaliaInferTask
from monailabel_xflow.app.scoring import XFlowUncertaintyScoring, lower_priority_if_background
from monailabel_xflow.app.strategy import XFlowUncertaintyStrategy
from monailabel_xflow.app.train import XFlowSegmenterTrainTask
from monailabel_xflow.rosalia.runtime import RosaliaRuntime
from monailabel_xflow.workflow.runtime import XFlowRuntime


class XFlowConfig(TaskConfig):
    """``xflow`` (infer + train), ``xflow_revise`` (clicks), ``xflow_uncertainty`` (scoring + strategy)."""

    def init(self, name: str, model_dir: str, conf: dict[str, str], planner: Any, **kwargs):
        super().init(name, model_dir, conf, planner, **kwargs)
        lower_priority_if_background()  # before loading models in a scoring/train subprocess
        self.runtime = XFlowRuntime(conf, model_dir=model_dir)

    def infer(self) -> dict[str, Any]:
        return {
            self.name: XFlowInferTask(self.runtime, store_seg=store_seg_default(self.conf)),
            f"{self.name}_revise": XFlowReviseTask(self.runtime),
        }

    def trainer(self) -> XFlowSegmenterTrainTask:
        return XFlowSegmenterTrainTask(self.runtime, self.model_dir)

    def strategy(self) -> dict[str, Any]:
        prefetch = self.prefetch if prefetch_enabled(self.conf) else None
        return {f"{self.name}_uncertainty": XFlowUncertaintyStrategy(prefetch=prefetch), "random": Random()}

    def prefetch(self, image_id: str, datastore: Any) -> None:
        """Work ahead of the annotator on the sample just handed out (:mod:`~monailabel_xflow.workflow.prefetch`)."""
        if not self.runtime.configured:
            return
        from monailabel_xflow.transforms.labels import load_image
        from monailabel_xflow.workflow.prefetch import Prefetcher, autorun_steps

        if getattr(self, "_prefetcher", None) is None:
            self._prefetcher = Prefetcher()
        steps = autorun_steps(self.runtime.get, lambda: load_image(datastore.get_image_uri(image_id), image_id)[0])
        self._prefetcher.submit(image_id, steps)

    def scoring_method(self) -> dict[str, Any]:
        return {f"{self.name}_uncertainty": XFlowUncertaintyScoring(self.runtime)}


class RosaliaConfig(TaskConfig):
    """``rosalia``, the papers' single-shot baseline served beside XFlow (infer only: ROSALIA has
    no clicks and no train task in the app). Its weights are the models file's ``rosalia`` key,
    else the committed ROSALIA demo."""

    def init(self, name: str, model_dir: str, conf: dict[str, str], planner: Any, **kwargs):
        super().init(name, model_dir, conf, planner, **kwargs)
        self.runtime = RosaliaRuntime(conf)

    def infer(self) -> dict[str, Any]:
        return {self.name: RosaliaInferTask(self.runtime, store_seg=store_seg_default(self.conf))}

    def trainer(self):
        return None
