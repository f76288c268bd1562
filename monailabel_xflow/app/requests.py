"""The XFlow tasks' request: MONAI Label's merged request dict, parsed once.

MONAI Label copies a client's ``params`` over the request and the task's config; the values
themselves are parsed by :mod:`monailabel_xflow.parameters`. Here: the keys a client may not set
(:data:`RESERVED_PARAMS`), the body limit, and the answering tasks' options (:class:`AnswerRequest`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from monailabel_xflow.errors import RequestError
from monailabel_xflow.instructions import ALL_FINDINGS, Instruction, from_choices, parse_instructions
from monailabel_xflow.parameters import (
    MAX_PARAM_KEYS,
    as_bool,
    as_choice,
    as_int,
    is_label_name,
    parse_json_object,
    short,
)
from monailabel_xflow.transforms.labels import RESULT_DTYPES, RESULT_EXTENSIONS
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS, label_value


def max_body_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The request body limit: ``XFLOW_MAX_BODY_MB`` (MiB, 1..4096) or 256 MiB."""
    env = os.environ if environ is None else environ
    text = env.get("XFLOW_MAX_BODY_MB", "").strip()
    mib = as_int(text, "XFLOW_MAX_BODY_MB", 1, 4096, default=256)  # "" gives the default
    return int(mib) * 1024 * 1024


RESERVED_PARAMS = frozenset(
    {"image", "image_id", "label", "file", "session", "session_id", "model", "save_label", "label_tag", "result_dir"}
)
"""Keys a client may not set in an infer request's ``params`` (they would name files or
redirect where results are written). ``image``/``label`` come from the URL id and uploads."""


def parse_params(text: str | bytes | None) -> dict[str, Any]:
    """The ``params`` form field of an infer request: :func:`parse_json_object` with none of
    :data:`RESERVED_PARAMS`.

    Raises:
        RequestTooLargeError: over :data:`MAX_PARAMS_BYTES` (413).
        RequestError: not a JSON object, too many keys, or a reserved key (422).
    """
    params = parse_json_object(text, "params")
    check_params(params)
    return params


def check_params(params: Mapping[str, Any]) -> None:
    """Refuse reserved or too many keys in client params (see :func:`parse_params`).

    ``label`` is the one reserved key a client may set, and only to a label *name* the app
    declares (:func:`is_label_name`): 3D Slicer's click panel sends the selected segment's name
    there. Any other value (a path, a file name, a number, ...) is refused as before.
    """
    if len(params) > MAX_PARAM_KEYS:
        raise RequestError(f"params holds {len(params)} keys; at most {MAX_PARAM_KEYS}")
    reserved = sorted(
        k
        for k in params
        if (k in RESERVED_PARAMS or str(k).startswith("_")) and not (k == "label" and is_label_name(params[k]))
    )
    if reserved:
        raise RequestError(
            f"params may not set {', '.join(map(repr, reserved))}: the image is the `image` id "
            "of the URL (or an uploaded file), a previous label an uploaded `label` file; "
            "labels are saved with PUT /datastore/label"
            + (
                f"; `label` may only name a finding's segment (one of {', '.join(FINDINGS)})"
                if "label" in reserved
                else ""
            )
        )


LABEL_NAME_KEY = "label_name"
"""Where :func:`take_label_name` moves a ``label`` that names a label, so that ``label`` only
ever holds the server's own upload path."""


def take_label_name(request: dict[str, Any]) -> None:
    """Move a ``label`` that names a declared label to :data:`LABEL_NAME_KEY` (in place).

    MONAI Label copies the client's ``params`` over the request, so Slicer's ``{"label":
    "effusion"}`` (the segment being clicked) arrives where an uploaded previous label's path
    would be; after this call ``request["label"]`` is an upload path or absent.
    """
    if is_label_name(request.get("label")):
        request[LABEL_NAME_KEY] = request.pop("label")


# --- the options of the answering tasks (``xflow``, ``rosalia``, ``xflow_revise``) -----------

FINDING_CHOICES: list[str] = ["", *FINDINGS, ALL_FINDINGS]
LOCATION_CHOICES: list[str] = ["", *LUNGS, *ALL_ZONES]
LABEL_VALUE_CHOICES: list[str] = ["answer", "findings"]
REVISE_CHOICES: list[str] = ["false", "true"]
MAX_CLICKS_LIMIT = 16


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


def store_seg_default(conf: Mapping[str, Any] | None) -> bool:
    """The server-wide default of the ``store_seg`` option (``--conf store_seg``; false when unset).

    Raises:
        RequestError: a value that is not a boolean (the message names ``--conf store_seg``).
    """
    return as_bool((conf or {}).get("store_seg", False), "--conf store_seg")


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
