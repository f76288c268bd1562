"""What an answering or revising request asks, parsed from the plain request mapping.

The request is MONAI Label's dict (the client's ``params`` merged over the task's config), but
nothing here needs MONAI Label: the instructions asked (free text wins over the pickers), how the
label map numbers findings, the label file's format, for a click revision the finding revised
and the clicks in XFlow's coordinates, and the train, scoring and batch-infer requests' values
(checked also before MONAI Label starts their subprocess). Errors: :class:`~monailabel_xflow.errors.RequestError` (422),
:class:`~monailabel_xflow.instructions.InstructionError`,
:class:`~monailabel_xflow.geometry.GeometryError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from monailabel_xflow.errors import RequestError
from monailabel_xflow.geometry import Click, client_index_to_point
from monailabel_xflow.instructions import (
    ALL_FINDINGS,
    MAX_INSTRUCTION_CHARS,
    Instruction,
    from_choices,
    parse_instruction,
    parse_instructions,
)
from monailabel_xflow.parameters import (
    as_bool,
    as_choice,
    as_float,
    as_id_list,
    as_int,
    as_text,
    check_id,
    number_lists,
    short,
)
from monailabel_xflow.policy.base import MAX_CLICKS_LIMIT
from monailabel_xflow.transforms.labels import RESULT_DTYPES, RESULT_EXTENSIONS
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS, label_value

LABEL_NAME_KEY = "label_name"
"""Where :func:`take_label_name` moves a ``label`` that names a label, so that ``label`` only
ever holds the server's own upload path."""


FINDING_CHOICES: list[str] = ["", *FINDINGS, ALL_FINDINGS]


LOCATION_CHOICES: list[str] = ["", *LUNGS, *ALL_ZONES]


LABEL_VALUE_CHOICES: list[str] = ["answer", "findings"]


REVISE_CHOICES: list[str] = ["false", "true"]


def as_max_clicks(value: Any) -> int | None:
    """``max_clicks`` as an int in ``0..MAX_CLICKS_LIMIT`` (None/"" = the models' default)."""
    return as_int(value, "max_clicks", 0, MAX_CLICKS_LIMIT)


def picked(value: Any, choices: Sequence[str], name: str = "finding") -> list[str]:
    """The picker value(s) a request chose for the option ``name``. The option list itself (the
    task's default, sent back unchanged by clients that did not touch it) means "none".

    Raises:
        RequestError: not text or a list of text.
    """
    if value is None or (isinstance(value, (list, tuple)) and list(value) == list(choices)):
        return []
    values = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if values is None or not all(isinstance(v, str) for v in values):
        raise RequestError(f"{name} must be text or a list of text, got {short(value)}")
    return [v.strip() for v in values if v.strip()]


def unpicked(value: Any, choices: Sequence[str], default: Any) -> Any:
    """``default`` when a request did not pick from an option list (sent nothing, or the list
    itself back unchanged, as OHIF does), else ``value``."""
    if value is None or (isinstance(value, (list, tuple)) and list(value) == list(choices)):
        return default
    return value


def instructions_from_request(data: Mapping[str, Any]) -> list[Instruction]:
    """The :class:`~monailabel_xflow.instructions.Instruction` list a request asks for.

    ``instruction`` (free text) wins when non-empty; otherwise the ``finding`` / ``location``
    pickers build the instructions directly (:func:`~monailabel_xflow.instructions.from_choices`);
    with neither, all seven findings at chest level (what a screening pass and OHIF's
    auto-segmentation ask).

    Raises:
        InstructionError: empty, over-long or unsupported text (the message lists what is supported).
        RequestError: a picker of the wrong type.
    """
    text = data.get("instruction")
    if text is not None and not isinstance(text, str):
        raise RequestError(f"instruction must be text, got {type(text).__name__}")
    if text and text.strip():
        return parse_instructions(text)
    findings = picked(data.get("finding"), FINDING_CHOICES)
    locations = picked(data.get("location"), LOCATION_CHOICES, "location")
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
    numbering = as_choice(
        unpicked(data.get("label_values"), LABEL_VALUE_CHOICES, None),
        "label_values",
        LABEL_VALUE_CHOICES,
        default="findings",
    )
    ordered = sorted(set(findings), key=label_value)
    if numbering == "answer":
        return {f: i for i, f in enumerate(ordered, 1)}
    return {f: label_value(f) for f in ordered}


def result_format(data: Mapping[str, Any]) -> tuple[str | None, str]:
    """``result_extension`` / ``result_dtype`` of a request (OHIF sends ``.nrrd`` + ``uint8``).
    ``(None, "uint8")`` = the image's own label format
    (:func:`~monailabel_xflow.transforms.labels.write_label`).

    Raises:
        RequestError: an extension or dtype outside ``RESULT_EXTENSIONS`` / ``RESULT_DTYPES``
            (:mod:`monailabel_xflow.transforms.labels`), or a dtype PNG cannot hold.
    """
    ext, dtype = data.get("result_extension"), data.get("result_dtype")
    if ext in (None, ""):
        ext = None
    elif not isinstance(ext, str) or ext.strip().lower() not in RESULT_EXTENSIONS:
        raise RequestError(f"result_extension must be one of {', '.join(RESULT_EXTENSIONS)}, got {short(ext)}")
    else:
        ext = ext.strip().lower()
    if dtype in (None, ""):
        dtype = "uint8"
    elif not isinstance(dtype, str) or dtype.strip().lower() not in RESULT_DTYPES:
        raise RequestError(f"result_dtype must be one of {', '.join(RESULT_DTYPES)}, got {short(dtype)}")
    dtype = str(dtype).strip().lower()
    if ext == ".png" and dtype != "uint8":
        raise RequestError(f"result_dtype {dtype} cannot be written as PNG; use uint8 or .nii.gz / .nrrd")
    return ext, dtype


@dataclass(frozen=True)
class AnswerRequest:
    """An ``xflow`` / ``rosalia`` request, parsed once: what the task answers and how it is returned.

    Attributes:
        instructions: what is asked (:func:`instructions_from_request`).
        label_names: finding -> value in the returned label map (:func:`label_names_for`).
        overlay / trace: return an overlay PNG / each instruction's trace.
        store_seg: also store the answer as a DICOM SEG (done by the app, which holds the datastore).
        extension / dtype: the label file's format (:func:`result_format`).
    """

    instructions: list[Instruction]
    label_names: dict[str, int]
    overlay: bool
    trace: bool
    store_seg: bool
    extension: str | None
    dtype: str

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> AnswerRequest:
        """Every shared option of ``data`` (the request merged over the task's config), checked.

        Raises:
            InstructionError / RequestError: see the functions above.
        """
        instructions = instructions_from_request(data)
        extension, dtype = result_format(data)
        return cls(
            instructions=instructions,
            label_names=label_names_for([i.finding for i in instructions], data),
            overlay=as_bool(data.get("overlay", False), "overlay"),
            trace=as_bool(data.get("trace", True), "trace"),
            store_seg=as_bool(data.get("store_seg", False), "store_seg"),
            extension=extension,
            dtype=dtype,
        )


MAX_CLICKS_PER_REQUEST = 64


REVISE_FINDING_CHOICES: list[str] = FINDING_CHOICES[:-1]  # one finding at a time: no "all findings"


def clicks_from_request(data: Mapping[str, Any], shape: tuple[int, int]) -> list[Click]:
    """``foreground`` / ``background`` voxel indices -> :class:`~monailabel_xflow.geometry.Click` list.

    Raises:
        GeometryError: a click outside the image, on a slice other than 0, or of wrong arity.
        RequestError: the lists are not lists of index lists, or too many clicks.
    """
    clicks: list[Click] = []
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


def finding_from_request(data: Mapping[str, Any], previous: NDArray[Any] | None) -> tuple[str, Any | None]:
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


TRAIN_DEFAULTS: dict[str, Any] = {"steps": 10, "lr": 1e-4, "batch": 1, "seed": 0, "interactive_rounds": 6}
TRAIN_LIMITS = {"steps": (1, 2000), "batch": (1, 16), "seed": (0, 2**31 - 1), "interactive_rounds": (0, 16)}


LR_RANGE = (1e-8, 1e-2)
"""Train request bounds (422 outside): ``steps`` 1..2000 optimiser steps, ``batch`` 1..16 prompts
per step, ``seed`` 0..2^31-1, ``interactive_rounds`` 0..16 simulated click rounds per prompt (SAM's
interactive recipe as the demo F_seg was trained, 0: box prompts only), ``lr`` a finite number in [1e-8, 1e-2]."""


def train_params(request: Mapping[str, Any]) -> dict[str, Any]:
    """The train request's ``steps``, ``lr``, ``batch``, ``seed``, ``interactive_rounds``, parsed strictly and bounded
    (defaults: :data:`TRAIN_DEFAULTS`).

    Raises:
        RequestError: a non-number, non-finite, non-integral or out-of-range value (422).
    """
    defaults = TRAIN_DEFAULTS
    out: dict[str, Any] = {k: as_int(request.get(k), k, lo, hi, defaults[k]) for k, (lo, hi) in TRAIN_LIMITS.items()}
    out["lr"] = as_float(request.get("lr"), "lr", *LR_RANGE, default=defaults["lr"])
    return out


DEFAULT_INSTRUCTION = "segment all findings"


MAX_SCORING_IMAGES = 1000


DEFAULT_SCORING_IMAGES = 50


def scoring_params(request: Mapping[str, Any]) -> dict[str, Any]:
    """``instruction``, ``max_clicks``, ``images`` and ``max_images`` of a scoring request,
    parsed strictly (``images``: ids to score, default every unlabeled one).

    Raises:
        RequestError: a wrong type or out-of-range value (422); UnsafeIdError: an id that is a path (400).
    """
    return {
        "instruction": as_text(request.get("instruction"), "instruction", MAX_INSTRUCTION_CHARS).strip()
        or DEFAULT_INSTRUCTION,
        "max_clicks": as_max_clicks(request.get("max_clicks")),
        "images": as_id_list(request.get("images"), "images", MAX_SCORING_IMAGES),
        "max_images": as_int(request.get("max_images"), "max_images", 1, MAX_SCORING_IMAGES, DEFAULT_SCORING_IMAGES),
    }


BATCH_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""The ``logging`` levels a batch-infer request may ask for."""


def _gpu_list(value: Any, cuda_devices: int) -> str:
    """``gpus``: ``"all"`` or device numbers (an int, a list, or comma text), each one a CUDA device
    this server has; returned as MONAI Label reads it (``"all"`` or ``"0,1"``)."""
    if value is None or value == "" or value == "all":
        return "all"
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",")]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    if cuda_devices <= 0:
        raise RequestError(
            f"gpus {short(value)}: this server has no CUDA device (batch infer runs on the CPU); leave gpus unset"
        )
    if len(items) > cuda_devices:
        raise RequestError(f"gpus names {len(items)} devices; this server has {cuda_devices}")
    ids = [as_int(v, "gpus", 0, cuda_devices - 1) for v in items]
    if any(v is None for v in ids):
        raise RequestError("gpus holds an empty item")
    return ",".join(str(v) for v in dict.fromkeys(ids))


def batch_infer_params(request: Mapping[str, Any], cuda_devices: int = 0) -> dict[str, Any]:
    """A batch-infer request's values, checked and converted to what MONAI Label's batch task
    reads (it compares and splits them unchecked: ``max_batch_size: "1"`` or ``gpus: 5`` would be
    a 500 there): ``images`` (``all``, ``labeled``, ``unlabeled`` or a list of ids), ``label_tag``
    (default ``original``), ``max_batch_size`` (0..100000, 0 = all), ``max_workers`` (0..16),
    ``save_label`` (boolean, default true), ``logging`` (:data:`BATCH_LOG_LEVELS`), ``multi_gpu``
    (boolean), ``gpus`` (:func:`_gpu_list`), ``device`` (``cpu``, ``cuda`` or ``cuda:N``; ``cpu``
    on a server without CUDA).

    Args:
        request: the merged request (MONAI Label's defaults, the task config, the client's params).
        cuda_devices: CUDA devices of this server (``torch.cuda.device_count()``).

    Returns:
        The converted values (the caller puts them over the client's params).

    Raises:
        RequestError, UnsafeIdError: a bad value, with its reason; ``label_tag`` ``final`` (a
            model's answer never replaces a person's label).
    """
    images = request.get("images", "all")
    images = getattr(images, "value", images)
    if images is None or isinstance(images, str):
        images = images or "all"
        if images not in ("all", "labeled", "unlabeled"):
            raise RequestError("images must be 'all', 'labeled', 'unlabeled' or a list of image ids")
    else:
        images = as_id_list(images, "images")
    tag = request.get("label_tag")
    tag = str(getattr(tag, "value", tag) or "original")
    check_id(tag, "label tag")
    if tag == "final":
        raise RequestError(
            "batch infer saves the model's answers; label_tag 'final' is a person's label "
            "and is never written by a model (use 'original', the default, or another tag)"
        )
    level = as_choice(str(request.get("logging") or "WARNING").upper(), "logging", BATCH_LOG_LEVELS, "WARNING")
    device = str(request.get("device") or "cuda")
    if not re.fullmatch(r"cpu|cuda(:\d{1,2})?", device):
        raise RequestError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {short(device)}")
    if device.startswith("cuda:") and int(device[5:]) >= max(cuda_devices, 1):
        raise RequestError(f"device {device}: this server has {cuda_devices} CUDA device(s)")
    multi_gpu = as_bool(request.get("multi_gpu", True), "multi_gpu")
    gpus = _gpu_list(request.get("gpus"), cuda_devices)
    if cuda_devices <= 0:
        device, multi_gpu = "cpu", False
    return {
        "images": images,
        "label_tag": tag,
        "max_batch_size": as_int(request.get("max_batch_size"), "max_batch_size", 0, 100_000, 0),
        "max_workers": as_int(request.get("max_workers"), "max_workers", 0, 16, 1),
        "save_label": as_bool(request.get("save_label", True), "save_label"),
        "logging": level,
        "multi_gpu": multi_gpu,
        "gpus": gpus,
        "device": device,
    }


def validate_task_request(method: str, request: Mapping[str, Any]) -> dict[str, Any]:
    """Parse a ``train`` / ``scoring`` / ``batch_infer`` request as its task will (the app does so
    before MONAI Label starts the task's subprocess, where a bad value would only fail later, in
    the log, or as a 500 in MONAI Label's own code); any other method: nothing to check.

    Returns:
        The converted values (numbers as numbers, ...), to put over the client's params.

    Raises:
        RequestError, UnsafeIdError: as the task itself would.
    """
    if method == "batch_infer":
        import torch

        return batch_infer_params(request, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    check = {"train": train_params, "scoring": scoring_params}.get(method)
    return dict(check(request)) if check is not None else {}
