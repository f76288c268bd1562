"""The ``xflow`` train task: fine-tune F_seg on the saved final labels, as MONAI Label's train task.

:class:`XFlowSegmenterTrainTask` runs in the subprocess the server starts and calls
:func:`monailabel_xflow.training.promotion.finetune_from_labels` (prompts from the labels'
components, held-out split, the check): the result replaces the serving segmenter in
``<model_dir>/xflow_segmenter/`` only when its weights are finite and its held-out mean IoUs, box-only
and after a few simulated clicks, are not below the serving one's, else it goes to
``xflow_segmenter.rejected/``; ``train_stats.json`` says which and why.

Progress uses the keys MONAI Label's trainers publish and 3D Slicer reads (``epoch`` /
``total_epochs`` count optimiser steps, rewritten after every step by
:class:`~monailabel_xflow.training.promotion.TrainProgress`; ``best_metric`` is the serving
segmenter's held-out mean IoU). Parameters are checked by
:func:`~monailabel_xflow.task_options.train_params`, also before the subprocess starts. The serving
app picks promoted weights up at the next request (:meth:`~monailabel_xflow.workflow.runtime.XFlowRuntime.get`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monailabel_xflow.app.wraps import upstream_class
from monailabel_xflow.task_options import TRAIN_DEFAULTS, train_params
from monailabel_xflow.training.promotion import STATS_FILE, TrainProgress, close_progress, finetune_from_labels
from monailabel_xflow.workflow.runtime import TRAINED_SEGMENTER_DIR, XFlowRuntime, trained_segmenter

logger = logging.getLogger(__name__)


TrainTask: Any = upstream_class("monailabel.interfaces.tasks.train.TrainTask")


class XFlowSegmenterTrainTask(TrainTask):
    """MONAI Label train task fine-tuning F_seg on the final labels into ``model_dir``."""

    def __init__(self, runtime: XFlowRuntime, model_dir: str | os.PathLike):
        super().__init__("Fine-tune XFlow's segmenter F_seg (prompt encoder + mask decoder) on saved final labels")
        self.runtime = runtime
        self.model_dir = Path(model_dir)

    DEFAULTS: dict[str, Any] = TRAIN_DEFAULTS

    def config(self) -> dict[str, Any]:
        return dict(self.DEFAULTS)

    def stats(self) -> dict[str, Any]:
        path = self.model_dir / STATS_FILE
        return json.loads(path.read_text()) if path.is_file() else {}

    def __call__(self, request: Mapping[str, Any], datastore: Any) -> dict[str, Any]:
        params = train_params(request)  # validated before anything is read or written
        start = trained_segmenter(self.model_dir) or self.runtime.config.segmenter
        if not start:
            from monailabel_xflow.errors import ModelsNotConfiguredError
            from monailabel_xflow.workflow.runtime import HOW_TO_CONFIGURE

            raise ModelsNotConfiguredError(HOW_TO_CONFIGURE)
        if start == self.runtime.config.segmenter:
            start = str(self.runtime.config.resolve("segmenter"))
        steps, lr, batch, seed = params["steps"], params["lr"], params["batch"], params["seed"]
        rounds = params["interactive_rounds"]
        pairs = datastore.datalist()
        logger.info("xflow train: %d labeled images, start from %s", len(pairs), start)
        progress = TrainProgress(self.model_dir / STATS_FILE, steps)
        try:
            stats = finetune_from_labels(
                pairs,
                start,
                self.model_dir / TRAINED_SEGMENTER_DIR,
                steps=steps,
                lr=lr,
                batch=batch,
                seed=seed,
                interactive_rounds=rounds,
                on_step=progress.step,
            )
        except Exception as err:
            close_progress(self.model_dir / STATS_FILE, f"failed: {err}; the serving segmenter is unchanged")
            raise
        return progress.done(stats)

    def stopped(self, reason: str) -> None:
        """The server stopped the run's subprocess: end its progress record with ``reason``."""
        close_progress(self.model_dir / STATS_FILE, reason)
