"""Task configuration of ROSALIA, the papers' baseline, served beside XFlow as ``rosalia``.

The task lives in the package (:mod:`monailabel_xflow.app.rosalia`); its weights are the models
file's ``rosalia`` key, else the committed ROSALIA demo.
"""

from __future__ import annotations

from typing import Any, Dict

from monailabel.interfaces.config import TaskConfig

from monailabel_xflow.app.rosalia import RosaliaInferTask, RosaliaRuntime


class RosaliaConfig(TaskConfig):
    """``rosalia`` (infer only: ROSALIA has no clicks and no train task in the app)."""

    def init(self, name: str, model_dir: str, conf: Dict[str, str], planner: Any, **kwargs):
        super().init(name, model_dir, conf, planner, **kwargs)
        self.runtime = RosaliaRuntime(conf)

    def infer(self) -> Dict[str, Any]:
        from monailabel_xflow.app.infer import store_seg_default

        return {self.name: RosaliaInferTask(self.runtime, store_seg=store_seg_default(self.conf))}

    def trainer(self):
        return None
