"""Request validation: the one module every request parameter of the XFlow app goes through.

MONAI Label 0.8.5 hands a task whatever JSON a client sent, merged over the task's config.
Every parameter a task reads is parsed here, strictly, so that a hostile or
careless client gets one clear ``4xx`` naming the parameter and the accepted range instead of a
bare 500, a runaway request, or a file read outside the datastore. Adding a request parameter
to a task means calling one of these functions (or adding one here), never ``int(x)`` inline.

Rules (all raise :class:`~monailabel_xflow.app.errors.RequestError` -> HTTP 422 unless said):

* **numbers** are finite; integers are integral (``3`` or ``3.0`` or ``"3"``, not ``3.5``,
  ``True``, ``1e400`` or a 400-digit string: text longer than :data:`MAX_NUMBER_CHARS` is
  refused before it is converted); every number has a documented range;
* **booleans** are ``true``/``false`` (also ``1``/``0``, ``"yes"``/``"no"``);
* **text** has a maximum length; **lists** a maximum number of items;
* **ids** (image, label, tag, session ids) are names, never paths: :func:`check_id` refuses
  path separators, ``..``, NUL and control characters, absolute paths and over-long ids with
  one message that does not depend on what exists (:class:`UnsafeIdError`, HTTP 400);
* **params** of an infer request may not name the request's files (:data:`RESERVED_PARAMS`):
  the image comes from the ``image`` id (resolved by the datastore) or an uploaded file, the
  previous label from an uploaded ``label`` file.

Limits (module constants, documented in the README "Security" section):

================================  =========================================================
:data:`MAX_ID_CHARS`              256 characters per id
:data:`MAX_PARAMS_BYTES`          64 KiB of ``params`` JSON per request (413 above)
:data:`MAX_BODY_BYTES`            256 MiB per request body (413 above; env ``XFLOW_MAX_BODY_MB``)
:data:`MAX_WORK_STEPS`            64 = findings x (1 + Stage 2 clicks) per infer request
``loading.MAX_PIXELS``            50 MP per image, checked from the header before decoding
================================  =========================================================
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from monailabel_xflow.app.errors import RequestError, RequestTooLargeError, UnsafeIdError
from monailabel_xflow.instructions import ALL_FINDINGS, Instruction, from_choices, parse_instructions
from monailabel_xflow.transforms.labels import RESULT_DTYPES, RESULT_EXTENSIONS
from monailabel_xflow.vocabulary import ALL_ZONES, FINDINGS, LUNGS, label_value

MAX_ID_CHARS = 256
MAX_PARAMS_BYTES = 64 * 1024
MAX_PARAM_KEYS = 64
MAX_NUMBER_CHARS = 32
MAX_LIST_ITEMS = 1024
MAX_WORK_STEPS = 64
"""Bound on one infer request's policy work: findings x (1 + max_clicks). Stage 1 draws at most
as many boxes per finding as its 256 generated tokens hold (about 12), so F_seg decodes are
bounded by the same product."""


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

_UNSAFE_ID = re.compile(r"[/\\\x00-\x1f\x7f]|\.\.")
ID_RULES = (
    f"ids are 1..{MAX_ID_CHARS} characters without '/', '\\', '..', NUL or control characters "
    "(an id names an item of the datastore, never a path)"
)


def short(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (never echo a megabyte back)."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond Python's digit limit
        text = f"<{type(value).__name__} too long to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_id(value: Any, what: str = "image") -> str:
    """A datastore id (image, label, tag, session, series UID) that cannot name a path.

    Returns:
        The id unchanged.

    Raises:
        UnsafeIdError: not text, empty, over-long, or holding a path separator, ``..``, NUL or a
            control character. The message is the same whatever the id names (no existence leak).
    """
    if (
        not isinstance(value, str)
        or not value
        or len(value) > MAX_ID_CHARS
        or _UNSAFE_ID.search(value)
        or value.strip() != value
        or value in (".", "~")
    ):
        raise UnsafeIdError(f"invalid {what} id: {ID_RULES}")
    return value


@overload
def as_int(value: Any, name: str, lo: int, hi: int, default: int) -> int: ...
@overload
def as_int(value: Any, name: str, lo: int, hi: int, default: None = None) -> int | None: ...


def as_int(value: Any, name: str, lo: int, hi: int, default: int | None = None) -> int | None:
    """An integer in ``lo..hi``; ``None``/``""`` give ``default``.

    Accepts ints, integral finite floats and decimal text of at most :data:`MAX_NUMBER_CHARS`.
    """
    if value is None or value == "":
        return default
    why = f"{name} must be an integer {lo}..{hi}, got {short(value)}"
    if isinstance(value, bool):
        raise RequestError(why)
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_NUMBER_CHARS or not re.fullmatch(r"[+-]?\d+(\.0*)?", text):
            raise RequestError(why)
        value = int(text.split(".")[0])
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise RequestError(why)
        value = int(value)
    elif not isinstance(value, int):
        raise RequestError(why)
    if not lo <= value <= hi:
        raise RequestError(f"{name} must be an integer {lo}..{hi}, got {short(value, 40)}")
    return int(value)


def as_float(value: Any, name: str, lo: float, hi: float, default: float | None = None) -> float | None:
    """A finite number in ``[lo, hi]``; ``None``/``""`` give ``default``."""
    if value is None or value == "":
        return default
    why = f"{name} must be a finite number in [{lo:g}, {hi:g}], got {short(value)}"
    if isinstance(value, bool):
        raise RequestError(why)
    if isinstance(value, str):
        if len(value.strip()) > MAX_NUMBER_CHARS:
            raise RequestError(why)
        try:
            value = float(value)
        except ValueError:
            raise RequestError(why) from None
    if not isinstance(value, (int, float)):
        raise RequestError(why)
    if isinstance(value, int) and abs(value) > 2**63:  # float() of a 400-digit int overflows
        raise RequestError(why)
    value = float(value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise RequestError(why)
    return value


def as_bool(value: Any, name: str) -> bool:
    """A boolean option as clients send it (bool, 0/1, "true"/"false", "yes"/"no")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no", ""):
        return value.strip().lower() in ("true", "1", "yes")
    raise RequestError(f"{name} must be true or false, got {short(value)}")


def as_choice(value: Any, name: str, choices: Sequence[str], default: str | None = None) -> str | None:
    """One of ``choices`` (exact text); ``None``/``""`` give ``default``."""
    if value is None or value == "":
        return default
    if not isinstance(value, str) or value not in choices:
        raise RequestError(f"{name} must be one of {', '.join(map(repr, choices))}, got {short(value)}")
    return value


def as_text(value: Any, name: str, max_chars: int, default: str = "") -> str:
    """Text of at most ``max_chars`` characters; ``None`` gives ``default``."""
    if value is None:
        return default
    if not isinstance(value, str):
        raise RequestError(f"{name} must be text, got {type(value).__name__}")
    if len(value) > max_chars:
        raise RequestError(f"{name} is {len(value)} characters; at most {max_chars}")
    return value


def as_id_list(value: Any, name: str, max_items: int = MAX_LIST_ITEMS, what: str = "image") -> list[str] | None:
    """A list of datastore ids (each through :func:`check_id`), duplicates dropped in order;
    ``None`` stays ``None``."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise RequestError(f"{name} must be a list of {what} ids, got {short(value)}")
    if len(value) > max_items:
        raise RequestError(f"{name} holds {len(value)} ids; at most {max_items}")
    return list(dict.fromkeys(check_id(v, what) for v in value))


def check_work(findings: int, max_clicks: int) -> None:
    """Refuse an infer request whose policy work findings x (1 + max_clicks) exceeds
    :data:`MAX_WORK_STEPS` (422, saying how to ask less)."""
    steps = int(findings) * (1 + int(max_clicks))
    if steps > MAX_WORK_STEPS:
        raise RequestError(
            f"request too large: {findings} finding(s) x (1 + {max_clicks} clicks) = {steps} policy "
            f"steps; at most {MAX_WORK_STEPS} per request (ask fewer findings or lower max_clicks)"
        )


def parse_json_object(
    text: str | bytes | None, name: str = "params", max_bytes: int = MAX_PARAMS_BYTES
) -> dict[str, Any]:
    """A JSON-object form field (``params`` of an upload, ``info`` of an info update) of at most
    ``max_bytes`` and :data:`MAX_PARAM_KEYS` keys; empty text is ``{}``.

    Raises:
        RequestTooLargeError: over ``max_bytes`` (413).
        RequestError: not a JSON object or too many keys (422).
    """
    if not text:
        return {}
    if len(text) > max_bytes:
        raise RequestTooLargeError(f"{name} is {len(text)} bytes; at most {max_bytes}")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:  # also Python's 4300-digit integer limit
        raise RequestError(f"{name} is not valid JSON ({type(exc).__name__}: {str(exc)[:80]})") from None
    if not isinstance(value, dict):
        raise RequestError(f"{name} must be a JSON object, got {type(value).__name__}")
    if len(value) > MAX_PARAM_KEYS:
        raise RequestError(f"{name} holds {len(value)} keys; at most {MAX_PARAM_KEYS}")
    return value


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


def is_label_name(value: Any) -> bool:
    """Whether ``value`` is exactly the name of a label the app declares (one of the findings,
    :data:`~monailabel_xflow.vocabulary.FINDINGS`): a name, never a path or a file."""
    return isinstance(value, str) and value in FINDINGS


def take_label_name(request: dict[str, Any]) -> None:
    """Move a ``label`` that names a declared label to :data:`LABEL_NAME_KEY` (in place).

    MONAI Label copies the client's ``params`` over the request, so Slicer's ``{"label":
    "effusion"}`` (the segment being clicked) arrives where an uploaded previous label's path
    would be; after this call ``request["label"]`` is an upload path or absent.
    """
    if is_label_name(request.get("label")):
        request[LABEL_NAME_KEY] = request.pop("label")


def number_lists(value: Any, name: str, arity: Sequence[int] = (2, 3), max_items: int = 64) -> list[list[float]]:
    """A list of index lists (clicks ``[i, j, k]``): each finite numbers, at most ``max_items``."""
    if value is None or value == "":
        return []
    if not isinstance(value, (list, tuple)):
        raise RequestError(f"{name} must be a list of [i, j, k] voxel indices, got {short(value)}")
    if len(value) > max_items:
        raise RequestError(f"{name} holds {len(value)} clicks; at most {max_items}")
    out = []
    for p in value:
        if not isinstance(p, (list, tuple)) or len(p) not in arity:
            raise RequestError(f"{name} must be a list of [i, j, k] voxel indices, got {short(p)}")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in p):
            raise RequestError(f"{name} click {short(p)} must hold numbers [i, j, k]")
        if not all(abs(v) < 2**31 if isinstance(v, int) else math.isfinite(v) and abs(v) < 2**31 for v in p):
            raise RequestError(f"{name} click {short(p)} must hold finite indices below 2^31")
        out.append([float(v) for v in p])
    return out


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
