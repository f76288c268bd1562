"""The ``xflow`` train task: fine-tune F_seg on the saved final labels, as MONAI Label's train task.

:class:`XFlowSegmenterTrainTask` runs in the subprocess the server starts and calls
:func:`monailabel_xflow.training.promotion.finetune_from_labels` (prompts from the labels'
components, held-out split, the check): the result replaces the serving segmenter in
``<model_dir>/xflow_segmenter/`` only when its weights are finite and its held-out mean IoU is not
below the serving one's, else it goes to ``xflow_segmenter.rejected/``; ``train_stats.json``
says which and why.

Progress uses the keys MONAI Label's trainers publish and 3D Slicer reads (``epoch`` /
``total_epochs`` count optimiser steps, rewritten after every step by :class:`TrainProgress`;
``best_metric`` is the serving segmenter's held-out mean IoU). Parameters are checked by
:func:`~monailabel_xflow.task_options.train_params`, also before the subprocess starts. The serving
app picks promoted weights up at the next request (:meth:`~monailabel_xflow.app.runtime.XFlowRuntime.get`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monailabel_xflow.app.runtime import TRAINED_SEGMENTER_DIR, XFlowRuntime, trained_segmenter
from monailabel_xflow.app.wraps import upstream_class
from monailabel_xflow.files import atomic_write_json
from monailabel_xflow.task_options import TRAIN_DEFAULTS, train_params
from monailabel_xflow.training.promotion import finetune_from_labels

logger = logging.getLogger(__name__)


STATS_FILE = "train_stats.json"


class TrainProgress:
    """Publishes a run's progress in ``train_stats.json`` (rewritten atomically) under MONAI Label's
    keys; ``total`` optimiser steps are published as ``total_epochs``."""

    def __init__(self, path: str | os.PathLike, total: int):
        import datetime

        self._timedelta = datetime.timedelta
        self.path = Path(path)
        self.total = int(total)
        self.start = time.time()
        previous = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.best_metric = float(previous.get("best_metric") or 0.0)

    def _elapsed(self) -> str:
        return str(self._timedelta(seconds=int(time.time() - self.start)))

    def _write(self, stats: Mapping[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, stats, indent=1)  # the server reads it while training runs: never half a file

    def step(self, step: int, total: int | None = None, loss: float | None = None) -> None:
        """Publish ``step`` of ``total`` optimiser steps done (running: ``current_time``)."""
        self.total = int(total or self.total)
        self._write(
            {
                "epoch": int(step),
                "total_epochs": self.total,
                "best_metric": self.best_metric,
                "start_ts": int(self.start),
                "current_time": self._elapsed(),
                "loss": None if loss is None else float(loss),
            }
        )

    def done(self, stats: Mapping[str, Any]) -> dict[str, Any]:
        """Publish the outcome: ``stats`` plus ``epoch = total_epochs``, ``total_time`` and
        ``best_metric`` (held-out IoU of the segmenter serving now; unchanged when not measured)."""
        serving = stats.get("heldout_iou_candidate") if stats.get("promoted") else stats.get("heldout_iou_current")
        if serving is not None:
            self.best_metric = float(serving)
        out = {
            **stats,
            "epoch": int(stats.get("steps", self.total)),
            "total_epochs": self.total,
            "best_metric": self.best_metric,
            "start_ts": int(self.start),
            "total_time": self._elapsed(),
        }
        self._write(out)
        return out


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
            from monailabel_xflow.app.errors import ModelsNotConfiguredError
            from monailabel_xflow.app.runtime import HOW_TO_CONFIGURE

            raise ModelsNotConfiguredError(HOW_TO_CONFIGURE)
        if start == self.runtime.config.segmenter:
            start = str(self.runtime.config.resolve("segmenter"))
        steps, lr, batch, seed = params["steps"], params["lr"], params["batch"], params["seed"]
        pairs = datastore.datalist()
        logger.info("xflow train: %d labeled images, start from %s", len(pairs), start)
        progress = TrainProgress(self.model_dir / STATS_FILE, steps)
        stats = finetune_from_labels(
            pairs,
            start,
            self.model_dir / TRAINED_SEGMENTER_DIR,
            steps=steps,
            lr=lr,
            batch=batch,
            seed=seed,
            on_step=progress.step,
        )
        return progress.done(stats)
