"""The one answering infer task, parse -> load -> answer -> paint/write, that ``xflow`` and ``rosalia`` fill in.

A subclass names itself (``name``, ``algorithm``), adds its own options (:meth:`AnswerTask.options`)
and answers the parsed instructions on the loaded image (:meth:`AnswerTask.answer`); everything a
client sees around the answer is here: the request parsed once
(:class:`~monailabel_xflow.app.requests.AnswerRequest`), the label map painted
(:func:`~monailabel_xflow.transforms.labels.paint`) and written once with the answer in its header
(:func:`~monailabel_xflow.transforms.labels.write_label`), each finding's full mask handed to the
app for a DICOM SEG (``store_seg``), the result params and latencies, errors as HTTP statuses.

Request keys (MONAI Label merges the request ``params`` over the task's config):

``instruction`` (str)
    Free text ("Segment the effusion in the left lung.", "fluid on the left?", "segment all
    findings"). When non-empty it wins over the pickers.
``finding`` (str, or list of str)
    Picker for those who will not type: one of the seven findings or ``"all findings"``; a list
    (API clients) asks several findings at once. Slicer/OHIF show the option list of
    the task's config and send the chosen string.
``location`` (str)
    Picker: a lung or zone (see :mod:`monailabel_xflow.vocabulary`); empty = chest level.
``overlay`` (bool)
    Also return ``overlay_png_base64``: a PNG of the image with the label tinted over it,
    base64-encoded in the result params (a server path would be useless to a remote client).
``trace`` (bool, default true)
    Include each instruction's full trace (``traces``) in the result params.
``store_seg`` (bool; default ``--conf store_seg``, else false)
    Also store the result as a DICOM SEG in the image's study (DICOMweb datastore only; one SEG
    holding every finding asked, absent ones as empty segments), so OHIF users open it in the
    viewer. The params then carry ``seg_series`` (its SeriesInstanceUID). Such SEGs are the
    model's unreviewed answers: the datastore does not count them as labels (see
    :mod:`monailabel_xflow.app.datastore`); the SEG names the task's model (``XFlow``, ``ROSALIA``).
``label_values`` (``"answer"`` or ``"findings"``)
    How the label map numbers the findings. ``answer``: this answer's findings only, 1..N in
    :data:`~monailabel_xflow.vocabulary.FINDINGS` order, and ``label_names`` lists exactly them:
    3D Slicer's module imports value v into the v-th name of ``label_names`` and clears every
    segment named there, so the other segments survive (``MONAILabel.py``
    ``updateSegmentationMask``). ``findings``: each finding its fixed value 1..7
    (:func:`~monailabel_xflow.vocabulary.label_value`), ``label_names`` again only this answer's
    findings. The option list offers ``answer`` first because Slicer sends an option list's
    first entry; a client that sends the list back unchanged (OHIF) or nothing (API clients)
    gets ``findings``.
``result_extension`` / ``result_dtype``
    The label file's format, as MONAI Label clients ask it (OHIF's panel: ``.nrrd`` / ``uint8``):
    one of :data:`~monailabel_xflow.transforms.labels.RESULT_EXTENSIONS` /
    :data:`~monailabel_xflow.transforms.labels.RESULT_DTYPES`; default the image's own label
    format (NIfTI for DICOM/NIfTI images, PNG for PNG/JPEG). NRRD and NIfTI labels carry the
    answer sentence in their header (``xflow_answer``), for clients that get only the file.

With no ``instruction`` and no ``finding`` chosen, all seven findings are asked at chest level.

Output: one label map for all instructions, each finding painted with its value in
``label_names`` (see ``label_values``); where two findings overlap the later
one in :data:`~monailabel_xflow.vocabulary.FINDINGS` order wins (``overlap_pixels`` reports how
many pixels that affected). An absent finding paints nothing and its answer says so
("There is no effusion in the left lung."); a label with no finding at all is an all-zero
map and ``empty: true``. The params JSON carries ``answer`` (one readable sentence per
instruction, joined: the canonical MIMIC-ILS answer, or for a present basic instruction, which
MIMIC-ILS answers with the mask alone, a summary), ``findings`` (one record per instruction,
with the canonical ``answer`` and the readable ``message``), ``label_names``, ``traces`` and ``latencies``.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from monailabel_xflow.app import layout
from monailabel_xflow.app.errors import http_errors
from monailabel_xflow.app.requests import AnswerRequest
from monailabel_xflow.app.wraps import upstream_class
from monailabel_xflow.instructions import Instruction
from monailabel_xflow.transforms.labels import finding_masks, paint, write_label
from monailabel_xflow.vocabulary import FINDINGS, label_value

logger = logging.getLogger(__name__)

LABELS: dict[str, int] = {f: label_value(f) for f in FINDINGS}


MonaiInferTask: Any = upstream_class("monailabel.interfaces.tasks.infer_v2.InferTask")
"""MONAI Label's ``InferTask`` (v2), the base of every infer task of the app."""


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


class AnswerTask(MonaiInferTask):
    """An instruction -> label map + answer task of the app (see the module docstring).

    Args:
        runtime: the app's shared models (``describe()``, ``status()``, ``get()``).
        description: shown in Slicer/OHIF.
        config: the task's option lists and defaults (MONAI Label merges requests over them).
    """

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
        """One :class:`Answer` per instruction on ``image`` (``float32 (H, W)`` in ``[0, 1]``)."""
        raise NotImplementedError

    def trace(self, result: Any) -> dict[str, Any]:
        """The JSON trace of one answer."""
        raise NotImplementedError

    def run(self, data: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """Answer one request (already merged over :meth:`config`): ``(label file, result params)``."""
        t0 = time.perf_counter()
        request = AnswerRequest.parse(data)
        options = self.options(data, request)
        image, ref = layout.load_image(data.get("image"), data.get("image_id"))
        t_pre = time.perf_counter()
        results = self.answer(image, request.instructions, options)
        t_model = time.perf_counter()

        pairs = [(r.instruction.finding, r.mask) for r in results]
        names = request.label_names
        label, overlap = paint(pairs, ref.shape, names)
        answer = " ".join(r.message for r in results)
        label_file = write_label(label, ref, extension=request.extension, dtype=request.dtype, answer=answer)
        params: dict[str, Any] = {
            "answer": answer,
            "findings": [finding_record(r, names) for r in results],
            "empty": not bool(label.any()),
            "overlap_pixels": overlap,
            "label_names": names,
            "models": self.runtime.describe(),
        }
        if request.trace:
            params["traces"] = [self.trace(r) for r in results]
        if request.store_seg:  # stored by the app, which holds the datastore (app.xflow_app.store_result_seg)
            findings = list(dict.fromkeys(i.finding for i in request.instructions))
            params["store_seg"] = {
                "findings": findings,
                "algorithm": self.algorithm,
                "masks": finding_masks(pairs, ref.shape),
            }
        if request.overlay:
            params["overlay_png_base64"] = base64.b64encode(layout.overlay_png(image, label)).decode("ascii")
        t_end = time.perf_counter()
        params["latencies"] = {
            "pre": round(t_pre - t0, 4),
            "infer": round(t_model - t_pre, 4),
            "post": round(t_end - t_model, 4),
            "total": round(t_end - t0, 4),
        }
        logger.info(
            "%s: %s -> %s (%.3f s; models %.3f s)",
            self.name,
            [i.text for i in request.instructions],
            answer,
            t_end - t0,
            t_model - t_pre,
        )
        return label_file, params
