"""The one answering pipeline of an instruction request, whatever model answers it (XFlow, ROSALIA):
parse -> load -> answer -> paint/write.

:func:`answer_request` parses the request once
(:class:`~monailabel_xflow.task_options.AnswerRequest`), loads the image
(:func:`monailabel_xflow.transforms.labels.load_image`), asks the model's ``answer`` and paints and
writes the label map once, with the answer in its header (:mod:`monailabel_xflow.transforms.labels`).
The MONAI Label tasks ``xflow`` and ``rosalia`` serve it (:mod:`monailabel_xflow.app.task`).

Request keys (the request's ``params`` merged over the task's config):

``instruction`` (str)
    Free text; when non-empty it wins over the pickers.
``finding`` (str or list of str) / ``location`` (str)
    Pickers: a finding or ``"all findings"`` (a list asks several); a lung or zone, empty =
    chest level. With neither text nor finding, all seven findings are asked at chest level.
``overlay`` (bool)
    Also return ``overlay_png_base64`` (the image with the label tinted over it).
``trace`` (bool, default true)
    Include each instruction's trace (``traces``).
``store_seg`` (bool; default ``--conf store_seg``, else false)
    Also store the answer as a DICOM SEG in the image's study (DICOMweb only; every finding
    asked a segment, absent ones empty); the params carry ``seg_series``. The datastore does not
    count such SEGs as labels.
``label_values`` (``"answer"`` or ``"findings"``)
    ``answer``: this answer's findings only, 1..N in FINDINGS order (3D Slicer imports value v
    into the v-th of ``label_names`` and clears only segments named there, so the others
    survive); ``findings``: fixed values 1..7. Offered ``answer`` first because Slicer sends an
    option list's first entry; the list itself (OHIF) or nothing gives ``findings``.
``result_extension`` / ``result_dtype``
    The label file's format (OHIF: ``.nrrd`` / ``uint8``); default the image's own label format.

Output: one label map; where findings overlap the later in FINDINGS order wins
(``overlap_pixels`` counts those pixels); no finding at all is an all-zero map with ``empty:
true``. Params: ``answer`` (one sentence per instruction, joined), ``findings`` (one record per
instruction), ``label_names``, ``traces``, ``latencies``.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from monailabel_xflow.instructions import Instruction
from monailabel_xflow.rendering import label_overlay_png
from monailabel_xflow.task_options import AnswerRequest
from monailabel_xflow.transforms import labels as label_io
from monailabel_xflow.transforms.labels import finding_masks, paint, write_label
from monailabel_xflow.vocabulary import FINDINGS, label_value

logger = logging.getLogger(__name__)

LABELS: dict[str, int] = {f: label_value(f) for f in FINDINGS}
"""Each finding's fixed label value (1..7)."""


class Answer(Protocol):
    """One answered instruction (XFlow's ``XFlowResult``, ROSALIA's ``RosaliaResult``)."""

    instruction: Instruction
    present: bool
    mask: np.ndarray  # bool (H, W) in the image's pixel grid
    answer: str  # the canonical MIMIC-ILS answer ("" for a present basic instruction)

    @property
    def message(self) -> str: ...  # the readable sentence


def finding_record(res: Answer, values: Mapping[str, int] | None = None) -> dict[str, Any]:
    """One instruction's record in the result params; ``label_value`` is its value in the label map."""
    ins = res.instruction
    pixels = int(np.count_nonzero(res.mask))
    return {
        "finding": ins.finding,
        "instruction": ins.text,
        "level": ins.level,
        "location": ins.location,
        "label_value": (values or LABELS)[ins.finding],
        "present": bool(res.present),
        "pixels": pixels,
        "empty": pixels == 0,
        "answer": res.answer,
        "message": res.message,
    }


def answer_request(
    data: Mapping[str, Any],
    answer: Callable[[np.ndarray, Sequence[Instruction], Mapping[str, Any]], Sequence[Answer]],
    trace: Callable[[Any], dict[str, Any]],
    options: Callable[[Mapping[str, Any], AnswerRequest], dict[str, Any]] | None = None,
    models: str = "",
    algorithm: str = "model",
    name: str = "answer",
) -> tuple[str | None, dict[str, Any]]:
    """Answer one request (the keys of the module docstring): ``(label file, result params)``.

    Args:
        data: the request (MONAI Label's: the task's config with the client's params over it);
            ``image`` is the file to read, ``image_id`` its id (messages only).
        answer: ``(image, instructions, options) -> one Answer per instruction``.
        trace: one answer's JSON trace.
        options: the model's own options of ``data``, checked (none when None).
        models: the models in use (``params["models"]``).
        algorithm: the model a stored SEG names.
        name: the task's name in the log.

    Raises:
        the errors of parsing the request (422/400), of loading the image (404/400) and of ``answer``.
    """
    t0 = time.perf_counter()
    request = AnswerRequest.parse(data)
    chosen = options(data, request) if options is not None else {}
    image, ref = label_io.load_image(data.get("image"), data.get("image_id"))
    t_pre = time.perf_counter()
    results = answer(image, request.instructions, chosen)
    t_model = time.perf_counter()

    pairs = [(r.instruction.finding, r.mask) for r in results]
    names = request.label_names
    label, overlap = paint(pairs, ref.shape, names)
    sentence = " ".join(r.message for r in results)
    label_file = write_label(label, ref, extension=request.extension, dtype=request.dtype, answer=sentence)
    params: dict[str, Any] = {
        "answer": sentence,
        "findings": [finding_record(r, names) for r in results],
        "empty": not bool(label.any()),
        "overlap_pixels": overlap,
        "label_names": names,
        "models": models,
    }
    if request.trace:
        params["traces"] = [trace(r) for r in results]
    if request.store_seg:  # stored by the app, which holds the datastore (app.xflow_app.store_result_seg)
        findings = list(dict.fromkeys(i.finding for i in request.instructions))
        params["store_seg"] = {
            "findings": findings,
            "algorithm": algorithm,
            "masks": finding_masks(pairs, ref.shape),
        }
    if request.overlay:
        params["overlay_png_base64"] = base64.b64encode(label_overlay_png(image, label)).decode("ascii")
    t_end = time.perf_counter()
    params["latencies"] = {
        "pre": round(t_pre - t0, 4),
        "infer": round(t_model - t_pre, 4),
        "post": round(t_end - t_model, 4),
        "total": round(t_end - t0, 4),
    }
    logger.info(
        "%s: %s -> %s (%.3f s; models %.3f s)",
        name,
        [i.text for i in request.instructions],
        sentence,
        t_end - t0,
        t_model - t_pre,
    )
    return label_file, params
