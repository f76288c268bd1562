"""MONAI Label app serving XFlow (instruction-guided chest X-ray lesion segmentation).

Start it with ``xflow serve --app apps/xflow --studies DIR_OR_DICOMWEB_URL [--conf models PATH]``
(or ``python -m monailabel.main start_server --app apps/xflow --studies ... --conf models PATH``).
``--conf`` keys: ``models`` (model configuration file; else env ``XFLOW_MODELS``), ``model_dir``
(where training writes the fine-tuned segmenter; default ``<app>/model``),
``dicomweb_search_filter`` (JSON; default CR/DX), ``store_seg`` (true: the ``xflow`` and ``rosalia`` tasks
store every result as a DICOM SEG in the PACS unless a request says otherwise). The logic lives in ``monailabel_xflow.app``.
"""

import logging
import os

from lib.configs.rosalia import RosaliaConfig
from lib.configs.xflow import XFlowConfig
from monailabel.interfaces.app import MONAILabelApp

from monailabel_xflow.app.guard import install as install_guard
from monailabel_xflow.app.slicer import install as install_slicer_samples
from monailabel_xflow.app.xflow_app import app_description, checked_infer, init_datastore

logger = logging.getLogger(__name__)


class XFlowApp(MONAILabelApp):
    def __init__(self, app_dir, studies, conf):
        model_dir = conf.get("model_dir") or os.path.join(app_dir, "model")
        self.xflow = XFlowConfig()
        self.xflow.init("xflow", model_dir, conf, None)
        logger.info("XFlow models: %s", self.xflow.runtime.describe())
        self.rosalia = RosaliaConfig()  # the papers' baseline, beside XFlow
        self.rosalia.init("rosalia", model_dir, conf, None)
        logger.info("ROSALIA: %s", self.rosalia.runtime.describe())
        super().__init__(app_dir=app_dir, studies=studies, conf=conf, name="XFlow",
                         description=app_description(self.xflow.runtime), version="0.1.0")
        install_guard()  # body limit, id checks, infer params confined
        install_slicer_samples()  # next sample: one file for Slicer, never a numbered series

    def init_datastore(self):
        return init_datastore(self, super().init_datastore)

    def init_remote_datastore(self):
        from monailabel_xflow.app.datastore import make_dicomweb_datastore

        return make_dicomweb_datastore(self.studies, self.conf)  # no dcmqi download

    def init_infers(self):
        return {**self.xflow.infer(), **self.rosalia.infer()}

    def init_trainers(self):
        return {self.xflow.name: self.xflow.trainer()}

    def init_strategies(self):
        return self.xflow.strategy()

    def init_scoring_methods(self):
        return self.xflow.scoring_method()

    def info(self):
        return {**super().info(), "xflow_models": self.xflow.runtime.status(),
                "rosalia_models": self.rosalia.runtime.status()}

    def infer(self, request, datastore=None):
        return checked_infer(self, super().infer, request, datastore)
