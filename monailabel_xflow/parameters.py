"""Request values parsed and bounded: ids, numbers, booleans, text, lists, JSON objects.

Plain rules, no web objects: every value a client sends goes through one of these, so a bad one
is one clear error naming it and its range (:class:`~monailabel_xflow.errors.RequestError`,
HTTP 422, unless said). Numbers are finite, integers integral (``3``, ``3.0``, ``"3"``; not
``3.5``, ``True``, ``1e400``, or text over :data:`MAX_NUMBER_CHARS`); booleans are
``true``/``false``/``1``/``0``/``"yes"``/``"no"``; ids are names, never paths (:func:`check_id`,
:class:`~monailabel_xflow.errors.UnsafeIdError`, 400, one message whatever exists).

Limits: :data:`MAX_ID_CHARS` (256), :data:`MAX_PARAMS_BYTES` (64 KiB, 413 above),
:data:`MAX_WORK_STEPS` (findings x (1 + clicks) per infer request); the body limit is
:func:`monailabel_xflow.serving.limits.max_body_bytes`, the pixel limit ``loading.MAX_PIXELS``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, overload

from monailabel_xflow.errors import RequestError, RequestTooLargeError, UnsafeIdError
from monailabel_xflow.vocabulary import FINDINGS

MAX_ID_CHARS = 256

MAX_PARAMS_BYTES = 64 * 1024

MAX_PARAM_KEYS = 64

MAX_NUMBER_CHARS = 32

MAX_LIST_ITEMS = 1024

MAX_WORK_STEPS = 64
"""Bound on one infer request's policy work: findings x (1 + max_clicks). Stage 1 draws at most
as many boxes per finding as its 256 generated tokens hold (about 12), so F_seg decodes are
bounded by the same product."""

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
    number = float(value)
    if not math.isfinite(number) or not lo <= number <= hi:
        raise RequestError(why)
    return number


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


def is_label_name(value: Any) -> bool:
    """Whether ``value`` is exactly the name of a label the app declares (one of the findings,
    :data:`~monailabel_xflow.vocabulary.FINDINGS`): a name, never a path or a file."""
    return isinstance(value, str) and value in FINDINGS


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


MAX_INFO_BYTES = 16 * 1024
"""Largest ``info`` JSON of one image/label info update."""
MAX_INFO_TOTAL_BYTES = 64 * 1024
"""Largest image or label info, as JSON, after an update (413 above)."""
SERVER_INFO_KEYS = frozenset({"name", "ts", "path", "checksum", "strategy", "user"})
"""Image/label info keys the server writes; a client may not set them, nor ``xflow_...`` (scores)."""


def check_client_info(info: Mapping[str, Any], what: str = "info") -> dict[str, Any]:
    """A client's image/label info (upload ``params``, ``PUT .../info``) without server keys.

    Raises:
        RequestError: a key of :data:`SERVER_INFO_KEYS` or starting with ``xflow_`` or ``_`` (422).
    """
    kept = sorted(k for k in info if k in SERVER_INFO_KEYS or str(k).startswith(("xflow_", "_")))
    if kept:
        raise RequestError(f"{what} may not set {', '.join(map(repr, kept))}: the server writes these keys")
    return dict(info)


def check_info_size(info: Mapping[str, Any], what: str) -> None:
    """Raises RequestTooLargeError (413) when ``info`` is over :data:`MAX_INFO_TOTAL_BYTES` as JSON."""
    size = len(json.dumps(info, default=str))
    if size > MAX_INFO_TOTAL_BYTES:
        raise RequestTooLargeError(f"{what} would be {size} bytes of JSON; at most {MAX_INFO_TOTAL_BYTES}")


def client_info(
    text: str | bytes | None, what: str = "info", max_bytes: int = MAX_INFO_BYTES, user: str | None = None
) -> dict[str, Any]:
    """A client's info form field (upload ``params``, ``PUT .../info``): a bounded JSON object
    (:func:`parse_json_object`) without server keys (:func:`check_client_info`), with ``user`` set
    when given."""
    values = check_client_info(parse_json_object(text, what, max_bytes), what)
    if user:
        values["user"] = user
    return values


CHECKSUM_ALGORITHMS = ("SHA256", "SHA512", "MD5")


def check_checksum(check_sum: str) -> str:
    """A ``check_sum`` query value, ``ALGO:HEX`` (ALGO one of :data:`CHECKSUM_ALGORITHMS`) or ``HEX``
    (SHA256), at most 200 characters; returned unchanged."""
    algo = check_sum.split(":", 1)[0] if ":" in check_sum else "SHA256"
    if algo not in CHECKSUM_ALGORITHMS or len(check_sum) > 200:
        raise RequestError(f"check_sum is ALGO:HEX with ALGO one of {', '.join(CHECKSUM_ALGORITHMS)}")
    return check_sum
