"""The ``xflow_revise`` interactive task: the human plays π_rev (XFlow §4.2).

Registered as ``type=deepedit`` **without labels of its own**: 3D Slicer then shows both point
lists and sends, for the selected segment, ``{"label": "<segment>", "foreground": [...],
"background": [...]}`` (a ``deepedit`` model with labels would get positives per segment and no
negatives). Request keys (merged over :meth:`XFlowReviseTask.config`):

``foreground`` / ``background`` (lists of ``[i, j, k]``)
    All clicks so far, voxel indices as MONAI holds the image (``i`` column, ``j`` row, ``k =
    0``; :func:`monailabel_xflow.geometry.client_index_to_point`); outside the image or on another
    slice: 422. Positives are applied before negatives (their order is not sent).
``<finding>`` (list of ``[i, j, k]``)
    OHIF keys positive clicks by label name: taken as ``foreground`` for that finding
    (:func:`label_keyed_clicks`).
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
from collections.abc import Mapping
from typing import Any

import numpy as np

from monailabel_xflow.app import layout
from monailabel_xflow.app.errors import RequestError, http_errors
from monailabel_xflow.app.requests import FINDING_CHOICES, LABEL_NAME_KEY, as_max_clicks, picked, result_format
from monailabel_xflow.app.runtime import XFlowRuntime
from monailabel_xflow.app.task import MonaiInferTask
from monailabel_xflow.geometry import Click, client_index_to_point
from monailabel_xflow.instructions import from_choices, parse_instruction
from monailabel_xflow.parameters import as_bool, as_choice, number_lists
from monailabel_xflow.transforms.labels import present_label_names, read_label, write_label
from monailabel_xflow.vocabulary import FINDINGS, label_value

logger = logging.getLogger(__name__)

MAX_CLICKS_PER_REQUEST = 64
REVISE_FINDING_CHOICES: list[str] = FINDING_CHOICES[:-1]  # one finding at a time: no "all findings"


def clicks_from_request(data: Mapping[str, Any], shape: tuple[int, int]) -> list:
    """``foreground`` / ``background`` voxel indices -> :class:`~monailabel_xflow.geometry.Click` list.

    Raises:
        GeometryError: a click outside the image, on a slice other than 0, or of wrong arity.
        RequestError: the lists are not lists of index lists, or too many clicks.
    """
    clicks = []
    for key, positive in (("foreground", True), ("background", False)):
        for p in number_lists(data.get(key), key, max_items=MAX_CLICKS_PER_REQUEST):
            clicks.append(Click(positive, *client_index_to_point(p, shape)))
    if len(clicks) > MAX_CLICKS_PER_REQUEST:
        raise RequestError(f"{len(clicks)} clicks in one request; at most {MAX_CLICKS_PER_REQUEST}")
    return clicks


def label_keyed_clicks(data: Mapping[str, Any]) -> dict[str, Any]:
    """OHIF's point prompts: ``{"<finding>": [[i, j, k], ...], "background": [...]}`` (the panel
    keys a ``deepedit`` model's positive clicks by label name) -> ``foreground`` / ``finding``.

    Returns the request keys to merge: ``{}`` when no finding-named key holds clicks or when the
    request already has ``foreground``; else ``{"foreground": points}`` plus ``finding`` when the
    request names none.

    The segment named by ``label`` (Slicer's selected segment) says which finding's clicks
    count; clicks stored under other findings' names are then ignored, never a 422.

    Raises:
        RequestError: clicks under several findings' names and no ``label`` / ``finding`` saying
            which one is revised, or a ``finding`` other than the one clicked.
    """
    if data.get("foreground"):
        return {}
    keyed = {f: data[f] for f in FINDINGS if data.get(f)}
    if not keyed:
        return {}
    segment = data.get(LABEL_NAME_KEY)
    if segment:
        return {"foreground": keyed[segment]} if segment in keyed else {}
    chosen = picked(data.get("finding"), REVISE_FINDING_CHOICES)
    if len(keyed) > 1 and len(chosen) != 1:
        raise RequestError(
            f"clicks for several findings ({', '.join(keyed)}); revise one at a time: set "
            "`finding` to the one to revise"
        )
    finding = chosen[0] if chosen else next(iter(keyed))
    if finding not in keyed:
        raise RequestError(f"finding is {finding!r} but the clicks are for {', '.join(keyed)}")
    out = {"foreground": keyed[finding]}
    if not chosen and not (isinstance(data.get("instruction"), str) and data["instruction"].strip()):
        out["finding"] = finding
    return out


def finding_from_request(data: Mapping[str, Any], previous: np.ndarray | None) -> tuple[str, Any | None]:
    """The finding under revision and, when given as text, its instruction.

    The segment a ``label`` names (Slicer's selected segment) decides; ``instruction`` or
    ``finding`` may then only name the same finding. Without ``label``: the instruction, else the
    ``finding`` picker, else the single finding of the previous label.

    Raises:
        InstructionError: an instruction naming zero or several findings, or an unknown finding.
        RequestError: nothing says which finding and the previous label does not tell, or
            ``label`` and ``instruction`` / ``finding`` name different findings.
    """
    segment = as_choice(data.get(LABEL_NAME_KEY), "label", FINDINGS)
    text = data.get("instruction")
    chosen = picked(data.get("finding"), REVISE_FINDING_CHOICES)
    if len(chosen) > 1:
        raise RequestError(f"revise one finding at a time, got {chosen}")
    ins = parse_instruction(text) if isinstance(text, str) and text.strip() else None
    asked = ins.finding if ins is not None else from_choices(chosen)[0].finding if chosen else None
    if segment and asked and asked != segment:
        raise RequestError(
            f"the clicks are for the {segment!r} segment but the options ask {asked!r}: "
            "clear `instruction` / `finding`, or select that finding's segment"
        )
    finding = segment or asked
    if finding:
        return finding, ins
    values = sorted(int(v) for v in np.unique(previous) if v) if previous is not None else []
    if len(values) == 1:
        return FINDINGS[values[0] - 1], None
    raise RequestError(
        "say which finding to revise: select its segment (`label`), set `finding` (one of "
        f"{', '.join(FINDINGS)}) or `instruction`"
        + (f"; the previous label holds {len(values)} findings" if values else "")
    )


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
            return self._run({**self.config(), **dict(request)})

    def _run(self, data: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        t0 = time.perf_counter()
        data.update(label_keyed_clicks(data))
        extension, dtype = result_format(data)
        image, ref = layout.load_image(data.get("image"), data.get("image_id"))
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

        xflow = self.runtime.get()
        if auto:
            mask, extra = self._auto(xflow, image, finding, instruction, previous, max_clicks)
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
        self,
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
