"""The one answering infer task that ``xflow`` and ``rosalia`` fill in: MONAI Label's ``InferTask``
around :func:`monailabel_xflow.serving.answering.answer_request` (parse -> load -> answer ->
paint/write; the request keys and the output are documented there).

A subclass names itself (``name``, ``algorithm``), adds its options (:meth:`AnswerTask.options`)
and answers the parsed instructions on the loaded image (:meth:`AnswerTask.answer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monailabel_xflow.app.errors import http_errors
from monailabel_xflow.app.wraps import upstream_class
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.serving.answering import LABELS, answer_request
from monailabel_xflow.task_options import AnswerRequest

MonaiInferTask: Any = upstream_class("monailabel.interfaces.tasks.infer_v2.InferTask")
"""MONAI Label's ``InferTask`` (v2), the base of every infer task of the app."""


class AnswerTask(MonaiInferTask):
    """An instruction -> label map + answer task (see the module docstring); ``config`` holds the
    option lists and defaults that MONAI Label merges requests over."""

    name = "answer"  # the task's name in messages
    algorithm = "model"  # the model a stored SEG names

    def __init__(self, runtime: Any, description: str, config: Mapping[str, Any]) -> None:
        from monailabel.interfaces.tasks.infer_v2 import InferType

        super().__init__(
            type=InferType.SEGMENTATION, labels=dict(LABELS), dimension=2, description=description, config=dict(config)
        )
        self.runtime = runtime

    def is_valid(self) -> bool:
        return True  # listed even without weights: requests then answer 503 saying how to configure

    def __call__(self, request: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        with http_errors(self.name):
            return self.run({**self.config(), **dict(request)})

    def options(self, data: Mapping[str, Any], request: AnswerRequest) -> dict[str, Any]:
        """The task's own options of ``data``, checked (none by default)."""
        return {}

    def answer(self, image: np.ndarray, instructions: Sequence[Instruction], options: Mapping[str, Any]) -> list[Any]:
        """One :class:`~monailabel_xflow.serving.answering.Answer` per instruction on ``image``
        (``float32 (H, W)`` in ``[0, 1]``)."""
        raise NotImplementedError

    def trace(self, result: Any) -> dict[str, Any]:
        """The JSON trace of one answer."""
        raise NotImplementedError

    def run(self, data: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """Answer one request (already merged over :meth:`config`): ``(label file, result params)``."""
        describe = self.runtime.describe()
        return answer_request(data, self.answer, self.trace, self.options, describe, self.algorithm, self.name)
