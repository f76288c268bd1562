"""The ``xflow_revise`` interactive task: the human plays π_rev (XFlow §4.2).

Registered as ``type=deepedit`` **without labels of its own**: 3D Slicer then shows both point
lists and sends, for the selected segment, ``{"label": "<segment>", "foreground": [...],
"background": [...]}`` (a ``deepedit`` model with labels would get positives per segment and no
negatives). Request keys and the answer: :func:`monailabel_xflow.serving.revising.revise_request`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from monailabel_xflow.app.errors import http_errors
from monailabel_xflow.app.task import MonaiInferTask
from monailabel_xflow.serving.revising import revise_request
from monailabel_xflow.task_options import REVISE_FINDING_CHOICES
from monailabel_xflow.workflow.runtime import XFlowRuntime


class XFlowReviseTask(MonaiInferTask):
    """``xflow_revise``: click revision of one finding's mask with F_seg (human or π_rev clicks)."""

    def __init__(self, runtime: XFlowRuntime, description: str = ""):
        from monailabel.interfaces.tasks.infer_v2 import InferType

        super().__init__(
            type=InferType.DEEPEDIT,
            labels={},  # the app's labels come from `xflow`; see the module docstring
            dimension=2,
            description=description
            or "XFlow click revision: positive clicks grow, negative clicks shrink "
            f"the finding's mask ({runtime.describe()})",
            config={
                "finding": list(REVISE_FINDING_CHOICES),
                "instruction": "",
                "auto": False,
                "max_clicks": int(runtime.config.max_clicks),
            },
        )
        self.runtime = runtime

    def is_valid(self) -> bool:
        return True

    def __call__(self, request: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        with http_errors("xflow_revise"):
            return revise_request({**self.config(), **dict(request)}, self.runtime)
