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

Every parameter is parsed by :mod:`monailabel_xflow.app.requests` (strict types and ranges).
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
    (:func:`seg_request`, :func:`store_seg_default`); its SEGs name ROSALIA.
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
    one of :data:`RESULT_EXTENSIONS` / :data:`RESULT_DTYPES`; default the image's own label
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
import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np

from monailabel_xflow.app import layout
from monailabel_xflow.app.errors import RequestError, http_errors
from monailabel_xflow.app.requests import as_bool, as_int, check_work
from monailabel_xflow.app.runtime import XFlowRuntime
from monailabel_xflow.instructions import ALL_FINDINGS
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS, label_value

logger = logging.getLogger(__name__)

FINDING_CHOICES: list[str] = ["", *FINDINGS, ALL_FINDINGS]
LOCATION_CHOICES: list[str] = ["", *LUNGS, *ALL_ZONES]
MAX_CLICKS_LIMIT = 16
LABELS: dict[str, int] = {f: label_value(f) for f in FINDINGS}
LABEL_VALUE_CHOICES: list[str] = ["answer", "findings"]
REVISE_CHOICES: list[str] = ["false", "true"]


def _base_infer_task() -> Any:
    from monailabel.interfaces.tasks.infer_v2 import InferTask

    return InferTask


_InferTask: Any = _base_infer_task()  # monailabel ships no type information: the base is Any to mypy


# --- request parameters ---------------------------------------------------------------------


def as_max_clicks(value: Any) -> int | None:
    """``max_clicks`` as an int in ``0..MAX_CLICKS_LIMIT`` (None/"" = the models' default)."""
    return as_int(value, "max_clicks", 0, MAX_CLICKS_LIMIT)


def _picked(value: Any, choices: Sequence[str], name: str = "finding") -> list[str]:
    """The picker value(s) a request chose for the option ``name``. The option list itself (the
    default of :meth:`config`, sent back unchanged by clients that did not touch it) means "none"."""
    if value is None or (isinstance(value, (list, tuple)) and list(value) == list(choices)):
        return []
    values = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if values is None or not all(isinstance(v, str) for v in values):
        raise RequestError(f"{name} must be text or a list of text, got {value!r}")
    return [v.strip() for v in values if v.strip()]


def _unpicked(value: Any, choices: Sequence[str], default: Any) -> Any:
    """``default`` when a request did not pick from an option list (sent nothing, or the list
    itself back unchanged, as OHIF does), else ``value``."""
    if value is None or (isinstance(value, (list, tuple)) and list(value) == list(choices)):
        return default
    return value


def instructions_from_request(data: Mapping[str, Any]) -> list:
    """The :class:`~monailabel_xflow.instructions.Instruction` list a request asks for.

    ``instruction`` (free text) wins when non-empty; otherwise the ``finding`` / ``location``
    pickers build the instructions directly (:func:`~monailabel_xflow.instructions.from_choices`);
    with neither, all seven findings at chest level (what a screening pass and OHIF's
    auto-segmentation ask).

    Raises:
        InstructionError: empty, over-long or unsupported text (the message lists what is
            supported). Nothing chosen at all means every finding (``"all findings"``).
        RequestError: a picker of the wrong type.
    """
    from monailabel_xflow.instructions import from_choices, parse_instructions

    text = data.get("instruction")
    if text is not None and not isinstance(text, str):
        raise RequestError(f"instruction must be text, got {type(text).__name__}")
    if text and text.strip():
        return parse_instructions(text)
    findings = _picked(data.get("finding"), FINDING_CHOICES)
    locations = _picked(data.get("location"), LOCATION_CHOICES, "location")
    if not findings:
        if text is not None and text != "":
            return parse_instructions(text)  # whitespace only: the parser's own "empty" message
        findings = [ALL_FINDINGS]  # nothing chosen (OHIF's "auto segmentation"): screen for everything
    return from_choices(findings, locations)  # "all findings" + "edema": edema once


def label_names_for(findings: Sequence[str], data: Mapping[str, Any]) -> dict[str, int]:
    """``label_names`` of an answer on ``findings``: each finding once, in FINDINGS order, with the
    value the request's ``label_values`` gives it (``answer``: 1..N; ``findings``: fixed 1..7;
    the option list itself or nothing: ``findings``).

    Raises:
        RequestError: ``label_values`` is not one of :data:`LABEL_VALUE_CHOICES`.
    """
    from monailabel_xflow.app.requests import as_choice

    numbering = as_choice(
        _unpicked(data.get("label_values"), LABEL_VALUE_CHOICES, None),
        "label_values",
        LABEL_VALUE_CHOICES,
        default="findings",
    )
    ordered = sorted(set(findings), key=label_value)
    if numbering == "answer":
        return {f: i for i, f in enumerate(ordered, 1)}
    return {f: label_value(f) for f in ordered}


def present_label_names(label: np.ndarray, also: Sequence[str] = ()) -> dict[str, int]:
    """``label_names`` of a label map holding fixed values 1..7: the findings painted in it plus
    ``also``, in FINDINGS order."""
    painted = {FINDINGS[int(v) - 1] for v in np.unique(label) if 0 < v <= len(FINDINGS)}
    return {f: label_value(f) for f in FINDINGS if f in painted or f in also}


def to_fixed_values(label: np.ndarray, label_names: Mapping[str, int] | None) -> np.ndarray:
    """A label map numbered by ``label_names`` (name -> value in it) -> fixed finding values 1..7
    (what stored SEGs and saved labels hold). Values no name maps become 0."""
    if not label_names:
        return label
    out = np.zeros_like(label)
    for name, value in label_names.items():
        if name in FINDINGS:
            out[label == int(value)] = label_value(name)
    return out


def store_seg_default(conf: Mapping[str, Any] | None) -> bool:
    """The server-wide default of the ``store_seg`` option (``--conf store_seg``; false when unset),
    the same for every infer task that has the option (``xflow``, ``rosalia``).

    Raises:
        RequestError: a value that is not a boolean (the message names ``--conf store_seg``).
    """
    return as_bool((conf or {}).get("store_seg", False), "--conf store_seg")


def seg_request(data: Mapping[str, Any], instructions: Sequence[Any], algorithm: str) -> dict[str, Any] | None:
    """A request's ``store_seg`` option as the note a task leaves in its result params for the app,
    which holds the datastore and stores the SEG (:func:`monailabel_xflow.app.xflow_app.store_result_seg`).

    Args:
        data: the request (the task's config merged under it).
        instructions: the parsed instructions; each finding becomes a segment, present or not.
        algorithm: the model named in the SEG (series description, algorithm identification).

    Returns:
        ``{"findings": [...], "algorithm": algorithm}``, or None when ``store_seg`` is false.

    Raises:
        RequestError: ``store_seg`` is not a boolean.
    """
    if not as_bool(data.get("store_seg", False), "store_seg"):
        return None
    return {"findings": list(dict.fromkeys(i.finding for i in instructions)), "algorithm": algorithm}


RESULT_EXTENSIONS = (".nii.gz", ".nii", ".nrrd", ".png")
RESULT_DTYPES = ("uint8", "uint16", "int16", "int32", "float32")


def result_format(data: Mapping[str, Any]) -> tuple[str | None, str]:
    """``result_extension`` / ``result_dtype`` of a request (what OHIF's panel and other MONAI
    Label clients ask: OHIF sends ``.nrrd`` + ``uint8``). ``(None, "uint8")`` = the image's own
    label format (:func:`~monailabel_xflow.app.layout.write_label`).

    Raises:
        RequestError: an extension or dtype outside :data:`RESULT_EXTENSIONS` / :data:`RESULT_DTYPES`.
    """
    ext, dtype = data.get("result_extension"), data.get("result_dtype")
    if ext in (None, ""):
        ext = None
    elif not isinstance(ext, str) or ext.strip().lower() not in RESULT_EXTENSIONS:
        raise RequestError(f"result_extension must be one of {', '.join(RESULT_EXTENSIONS)}, got {ext!r}")
    else:
        ext = ext.strip().lower()
    if dtype in (None, ""):
        dtype = "uint8"
    elif not isinstance(dtype, str) or dtype.strip().lower() not in RESULT_DTYPES:
        raise RequestError(f"result_dtype must be one of {', '.join(RESULT_DTYPES)}, got {dtype!r}")
    return ext, str(dtype).strip().lower()


def write_result(label: np.ndarray, ref: Any, extension: str | None, dtype: str, answer: str = "") -> str:
    """The label file of a result in the format the client asked for.

    NIfTI and NRRD carry the image geometry (``(W, H, 1)``, as MONAI Label holds the image);
    NRRD also carries ``answer`` as the key/value field ``xflow_answer`` and NIfTI as a JSON
    comment extension (so a client that only gets the file, e.g. with ``output=image``, still
    has the sentence). PNG is ``W x H`` 8-bit (``dtype`` must then be ``uint8``).
    """
    if (extension or ref.label_suffix) == ref.label_suffix and dtype == "uint8":
        return _with_answer(layout.write_label(label, ref), answer)
    if extension == ".png":
        if dtype != "uint8":
            raise RequestError(f"result_dtype {dtype} cannot be written as PNG; use uint8 or .nii.gz / .nrrd")
        return layout.write_label(label, dataclasses.replace(ref, format="PNG"))
    import os
    import tempfile

    import nibabel as nib

    nifti = layout.write_label(
        label, dataclasses.replace(ref, format="DICOM") if ref.format in ("PNG", "JPEG") else ref
    )
    img = cast(nib.Nifti1Image, nib.load(nifti))  # write_label writes NIfTI
    voxels = np.asarray(img.dataobj).astype(dtype)  # (W, H, 1)
    fd, out = tempfile.mkstemp(suffix=extension)
    os.close(fd)
    try:
        if extension == ".nrrd":
            import nrrd

            affine = img.affine.copy()
            affine[:2] *= -1  # NIfTI RAS -> NRRD "left-posterior-superior"
            header = {
                "space": "left-posterior-superior",
                "space directions": affine[:3, :3].T,
                "space origin": affine[:3, 3],
                "kinds": ["domain"] * 3,
                "encoding": "raw",
                "xflow_answer": answer.replace("\n", " "),
            }
            nrrd.write(out, voxels, header=header, index_order="F")
        else:
            nib.save(nib.Nifti1Image(voxels, img.affine), out)
            _with_answer(out, answer)
    finally:
        os.unlink(nifti)
    return out


def _with_answer(path: str, answer: str) -> str:
    """Put ``answer`` into a NIfTI label's header (``descrip``, 80 bytes, and a comment extension)."""
    if not answer or not path.endswith((".nii", ".nii.gz")):
        return path
    import json

    import nibabel as nib

    loaded = cast(nib.Nifti1Image, nib.load(path, mmap=False))  # rewritten in place: no memory map onto the file
    img = nib.Nifti1Image(np.array(loaded.dataobj), loaded.affine, loaded.header)
    img.header["descrip"] = answer.encode("utf-8")[:79]
    img.header.extensions.append(nib.nifti1.Nifti1Extension(6, json.dumps({"xflow_answer": answer}).encode()))
    nib.save(img, path)
    return path


def answer_of_file(path: str) -> str | None:
    """The answer sentence :func:`write_result` put into a label file (NRRD or NIfTI), or None."""
    import json

    if path.endswith(".nrrd"):
        import nrrd

        return nrrd.read_header(path).get("xflow_answer")
    import nibabel as nib

    for ext in cast(nib.Nifti1Image, nib.load(path)).header.extensions:
        if ext.get_code() == 6:
            with contextlib.suppress(ValueError):
                return json.loads(ext.get_content()).get("xflow_answer")
    return None


# --- results --------------------------------------------------------------------------------


def paint(
    results: Sequence[Any], shape: tuple[int, int], values: Mapping[str, int] | None = None
) -> tuple[np.ndarray, int]:
    """One ``uint8 (H, W)`` label map from XFlow results, each mask painted with its finding's
    value (``values``, default the fixed label values) in FINDINGS order (later wins).
    Returns ``(label, overlap_pixels)``."""
    values = values or LABELS
    label = np.zeros(shape, dtype=np.uint8)
    covered = np.zeros(shape, dtype=bool)
    overlap = 0
    for res in sorted(results, key=lambda r: label_value(r.instruction.finding)):
        mask = np.asarray(res.mask, dtype=bool)
        if mask.shape != shape:
            raise RuntimeError(f"XFlow returned a mask of shape {mask.shape} for an image of shape {shape}")
        overlap += int((mask & covered).sum())
        label[mask] = values[res.instruction.finding]
        covered |= mask
    return label, overlap


def finding_masks(results: Sequence[Any], shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """Each finding's full ``bool (H, W)`` mask (the union of its results), overlaps kept: what a
    stored SEG's segments hold (:func:`~monailabel_xflow.app.seg.write_seg`), where the label map
    of :func:`paint` lets a later finding cover an earlier one."""
    out: dict[str, np.ndarray] = {}
    for res in results:
        finding = res.instruction.finding
        out[finding] = out.get(finding, np.zeros(shape, bool)) | np.asarray(res.mask, dtype=bool)
    return out


def finding_record(res: Any, values: Mapping[str, int] | None = None) -> dict[str, Any]:
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


class XFlowInferTask(_InferTask):
    """``xflow``: instruction-guided segmentation (Stage 1 + Stage 2) as a MONAI Label model.

    Args:
        runtime: the app's shared models.
        description: shown in Slicer/OHIF (should name the models in use).
    """

    def __init__(self, runtime: XFlowRuntime, description: str = "", store_seg: bool = False):
        from monailabel.interfaces.tasks.infer_v2 import InferType

        super().__init__(
            type=InferType.SEGMENTATION,
            labels=dict(LABELS),
            dimension=2,
            description=description or f"XFlow instruction-guided CXR lesion segmentation ({runtime.describe()})",
            config={
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
        self.runtime = runtime

    def is_valid(self) -> bool:
        return True  # listed even without weights: requests then answer 503 saying how to configure

    def info(self) -> dict[str, Any]:
        out = super().info()
        out["xflow_models"] = self.runtime.status()
        return out

    def __call__(self, request: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
        with http_errors("xflow"):
            return self._run({**self.config(), **dict(request)})

    def _run(self, data: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        t0 = time.perf_counter()
        instructions = instructions_from_request(data)
        max_clicks = as_max_clicks(data.get("max_clicks"))
        revise = as_bool(_unpicked(data.get("revise"), REVISE_CHOICES, True), "revise")
        overlay = as_bool(data.get("overlay", False), "overlay")
        with_trace = as_bool(data.get("trace", True), "trace")
        check_work(
            len(instructions), (self.runtime.config.max_clicks if max_clicks is None else max_clicks) if revise else 0
        )
        names = label_names_for([i.finding for i in instructions], data)
        seg = seg_request(data, instructions, "XFlow")
        extension, dtype = result_format(data)
        image, ref = layout.load_image(data.get("image"), data.get("image_id"))
        t_pre = time.perf_counter()

        xflow = self.runtime.get()
        if len(instructions) == 1:
            results = [xflow.run(image, instructions[0], max_clicks=max_clicks, revise=revise)]
        else:  # one image encode and one shared policy prefix for all of them
            results = xflow.run_all(image, max_clicks=max_clicks, revise=revise, instructions=instructions)
        t_model = time.perf_counter()

        label, overlap = paint(results, ref.shape, names)
        answer = " ".join(r.message for r in results)
        label_file = write_result(label, ref, extension, dtype, answer)
        records = [finding_record(r, names) for r in results]
        params: dict[str, Any] = {
            "answer": answer,
            "findings": records,
            "empty": not bool(label.any()),
            "overlap_pixels": overlap,
            "label_names": names,
            "models": self.runtime.describe(),
        }
        if with_trace:
            params["traces"] = [r.trace.to_dict() for r in results]
        if seg:  # done by the app, which holds the datastore (app.xflow_app.checked_infer)
            params["store_seg"] = {**seg, "masks": finding_masks(results, ref.shape)}
        if overlay:
            params["overlay_png_base64"] = base64.b64encode(layout.overlay_png(image, label)).decode("ascii")
        t_end = time.perf_counter()
        params["latencies"] = {
            "pre": round(t_pre - t0, 4),
            "infer": round(t_model - t_pre, 4),
            "post": round(t_end - t_model, 4),
            "total": round(t_end - t0, 4),
        }
        logger.info(
            "xflow: %s -> %s (%.3f s; models %.3f s)",
            [i.text for i in instructions],
            params["answer"],
            t_end - t0,
            t_model - t_pre,
        )
        return label_file, params
