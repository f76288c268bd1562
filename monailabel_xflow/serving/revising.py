"""A click revision of one finding's mask, whatever serves it: the human (or π_rev) plays π_rev
(XFlow §4.2) through :func:`revise_request`; the MONAI Label task ``xflow_revise``
(:mod:`monailabel_xflow.app.revise`) serves it.

Request keys (the task's config with the client's params over it):

``foreground`` / ``background`` (lists of ``[i, j, k]``)
    All clicks so far, voxel indices as MONAI holds the image (``i`` column, ``j`` row, ``k =
    0``; :func:`monailabel_xflow.geometry.client_index_to_point`); outside the image or on another
    slice: 422. Positives are applied before negatives (their order is not sent).
``<finding>`` (list of ``[i, j, k]``)
    OHIF keys positive clicks by label name: taken as ``foreground`` for that finding
    (:func:`~monailabel_xflow.task_options.label_keyed_clicks`).
``label`` (a finding's name) / ``finding`` / ``instruction``
    Which finding is revised (a declared name only, never a path:
    :func:`~monailabel_xflow.app.requests.take_label_name`); optional when the previous label holds
    one finding; disagreeing names: 422.
``label`` (file, optional)
    The previous label map: the revised finding's region is M_{t-1}, the others are kept.
``auto`` (bool) / ``max_clicks`` (int)
    π_rev proposes the clicks (needs a revision policy), within this budget.
``result_extension`` / ``result_dtype``
    As for ``xflow``.

``label_names`` lists the findings the returned map holds, each with its fixed value 1..7.
The image embedding is cached per image, so a click costs one mask decode.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from monailabel_xflow.errors import RequestError
from monailabel_xflow.instructions import from_choices
from monailabel_xflow.parameters import as_bool
from monailabel_xflow.task_options import (
    as_max_clicks,
    clicks_from_request,
    finding_from_request,
    label_keyed_clicks,
    result_format,
)
from monailabel_xflow.transforms import labels as label_io
from monailabel_xflow.transforms.labels import present_label_names, read_label, write_label
from monailabel_xflow.vocabulary import label_value

logger = logging.getLogger(__name__)


def revise_request(data: dict[str, Any], runtime: Any) -> tuple[str | None, dict[str, Any]]:
    """Revise one finding's mask (the keys of the module docstring): ``(label file, result params)``.

    Args:
        data: the request (MONAI Label's: the task's config with the client's params over it);
            ``image`` is the file to read, ``label`` an uploaded previous label file.
        runtime: what holds the models (:class:`~monailabel_xflow.workflow.runtime.XFlowRuntime`).

    Raises:
        RequestError: no clicks, no previous label and no ``auto`` (422); the errors of parsing
            the request, of loading the image or label and of the models.
    """
    t0 = time.perf_counter()
    data.update(label_keyed_clicks(data))
    extension, dtype = result_format(data)
    image, ref = label_io.load_image(data.get("image"), data.get("image_id"))
    previous_label = read_label(data["label"], ref.shape) if data.get("label") else None
    finding, instruction = finding_from_request(data, previous_label)
    value = label_value(finding)
    previous = previous_label == value if previous_label is not None else None
    if previous is not None and not previous.any():
        previous = None
    clicks = clicks_from_request(data, ref.shape)
    auto = as_bool(data.get("auto", False), "auto")
    max_clicks = as_max_clicks(data.get("max_clicks"))
    if not clicks and not auto and previous is None:
        raise RequestError(
            "no clicks: send `foreground` / `background` clicks, a previous `label`, "
            "or set `auto` to let XFlow's revision policy click"
        )
    t_pre = time.perf_counter()

    xflow = runtime.get()
    if auto:
        mask, extra = _auto(xflow, image, finding, instruction, previous, max_clicks)
    else:
        res = xflow.revise(image, clicks, previous_mask=previous)
        mask = np.asarray(res.mask, dtype=bool)
        extra = {
            "box": [float(v) for v in res.box] if res.box is not None else None,
            "iou": None if res.iou is None else float(res.iou),
        }
    t_model = time.perf_counter()

    label = previous_label.copy() if previous_label is not None else np.zeros(ref.shape, np.uint8)
    label[label == value] = 0
    label[mask] = value
    out = write_label(label, ref, extension=extension, dtype=dtype)
    params = {
        "finding": finding,
        "label_value": value,
        "clicks": [{"positive": c.positive, "x": c.x, "y": c.y} for c in clicks],
        "pixels": int(mask.sum()),
        "label_names": present_label_names(label, also=[finding]),
        **extra,
        "latencies": {
            "pre": round(t_pre - t0, 4),
            "infer": round(t_model - t_pre, 4),
            "total": round(time.perf_counter() - t0, 4),
        },
    }
    return out, params


def _auto(
    xflow: Any,
    image: np.ndarray,
    finding: str,
    instruction: Any,
    previous: np.ndarray | None,
    max_clicks: int | None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """π_rev proposes the clicks: XFlow runs Stage 1 and Stage 2 for the finding.

    The workflow has no "Stage 2 from a person's mask" entry point yet, so the previous
    mask is replaced by XFlow's own answer (documented in the result as ``auto_from``).
    """
    res = xflow.run(image, instruction or from_choices([finding])[0], max_clicks=max_clicks, revise=True)
    clicks = [{"positive": c.positive, "x": c.x, "y": c.y} for lesion in res.trace.lesions for c in lesion.clicks]
    return np.asarray(res.mask, dtype=bool), {
        "answer": res.message,
        "proposed_clicks": clicks,
        "auto_from": "stage1",
        "trace": res.trace.to_dict(),
    }
