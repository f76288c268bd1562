"""The ``xflow`` infer task: instruction -> label map + answer sentence(s) + trace.

Request keys (MONAI Label merges the request ``params`` over :meth:`XFlowInferTask.config`):

``instruction`` (str)
    Free text ("Segment the effusion in the left lung.", "fluid on the left?", "segment all
    findings"). When non-empty it wins over the pickers.
``finding`` (str, or list of str)
    Picker for those who will not type: one of the seven findings or ``"all findings"``; a list
    (API clients) asks several findings at once. Slicer/OHIF show the option list of
    :meth:`config` and send the chosen string.
``location`` (str)
    Picker: a lung or zone (see :mod:`monailabel_xflow.vocabulary`); empty = chest level.
``max_clicks`` (int, 0..16)
    Stage 2 budget; default: the model configuration's (4). Findings x (1 + max_clicks) is at
    most :data:`~monailabel_xflow.app.requests.MAX_WORK_STEPS` (64) per request (422 above).

Every parameter is parsed by :mod:`monailabel_xflow.app.requests` (strict types and ranges);
the shared steps (load, paint, write, SEG, params) are :class:`~monailabel_xflow.app.task.AnswerTask`'s.
``revise`` (bool; the option list is ``["false", "true"]``)
    Run Stage 2 (π_rev clicks); false gives the Stage 1 masks. Not sent, or the option list sent
    back unchanged (OHIF): true. 3D Slicer sends an option list's first entry, so its *Run* and
    its auto-run on *Next Sample* ask Stage 1 only (about 7 s for all seven findings on 2 CPU
    cores with the demo model, against minutes with Stage 2); pick ``true`` in Slicer's options
    table for Stage 2, or revise one finding with ``xflow_revise`` (``auto``).
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
    :mod:`monailabel_xflow.app.datastore`). The ``rosalia`` task has the same option
    (:func:`~monailabel_xflow.app.requests.store_seg_default`); its SEGs name ROSALIA.
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

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from monailabel_xflow.app.requests import (
    FINDING_CHOICES,
    LABEL_VALUE_CHOICES,
    LOCATION_CHOICES,
    REVISE_CHOICES,
    AnswerRequest,
    as_bool,
    as_max_clicks,
    check_work,
    unpicked,
)
from monailabel_xflow.app.runtime import XFlowRuntime
from monailabel_xflow.app.task import AnswerTask
from monailabel_xflow.instructions import Instruction


class XFlowInferTask(AnswerTask):
    """``xflow``: instruction-guided segmentation (Stage 1 + Stage 2) as a MONAI Label model.

    Args:
        runtime: the app's shared models.
        description: shown in Slicer/OHIF (should name the models in use).
        store_seg: the default of the ``store_seg`` option.
    """

    name = "xflow"
    algorithm = "XFlow"

    def __init__(self, runtime: XFlowRuntime, description: str = "", store_seg: bool = False):
        super().__init__(
            runtime,
            description or f"XFlow instruction-guided CXR lesion segmentation ({runtime.describe()})",
            {
                "instruction": "",
                "finding": list(FINDING_CHOICES),
                "location": list(LOCATION_CHOICES),
                "max_clicks": int(runtime.config.max_clicks),
                "revise": list(REVISE_CHOICES),
                "overlay": False,
                "trace": True,
                "store_seg": bool(store_seg),
                "label_values": list(LABEL_VALUE_CHOICES),
            },
        )

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["xflow_models"] = self.runtime.status()
        return out

    def options(self, data: Mapping[str, Any], request: AnswerRequest) -> dict[str, Any]:
        max_clicks = as_max_clicks(data.get("max_clicks"))
        revise = as_bool(unpicked(data.get("revise"), REVISE_CHOICES, True), "revise")
        budget = self.runtime.config.max_clicks if max_clicks is None else max_clicks
        check_work(len(request.instructions), budget if revise else 0)
        return {"max_clicks": max_clicks, "revise": revise}

    def answer(self, image: np.ndarray, instructions: Sequence[Instruction], options: Mapping[str, Any]) -> list[Any]:
        xflow = self.runtime.get()
        if len(instructions) == 1:
            return [xflow.run(image, instructions[0], **options)]
        return xflow.run_all(image, instructions=instructions, **options)  # one image encode, one policy prefix

    def trace(self, result: Any) -> dict[str, Any]:
        return result.trace.to_dict()
