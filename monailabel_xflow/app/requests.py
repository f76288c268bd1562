"""MONAI Label's request as the XFlow app receives it: the keys a client may not set (the server's
bounds, body size and time, sessions and request threads, are :mod:`monailabel_xflow.serving.limits`).

MONAI Label copies a client's ``params`` over the request and the task's config, so ``params``
could otherwise name the request's files. Values are parsed by :mod:`monailabel_xflow.parameters`,
the tasks' options by :mod:`monailabel_xflow.task_options`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from monailabel_xflow.errors import RequestError
from monailabel_xflow.parameters import (
    MAX_PARAM_KEYS,
    as_bool,
    is_label_name,
    parse_json_object,
)
from monailabel_xflow.task_options import LABEL_NAME_KEY
from monailabel_xflow.vocabulary import FINDINGS

RESERVED_PARAMS = frozenset(
    {"image", "image_id", "label", "file", "session", "session_id", "model", "save_label", "label_tag", "result_dir"}
)
"""Keys a client may not set in an infer request's ``params`` (they would name files or
redirect where results are written). ``image``/``label`` come from the URL id and uploads."""


def parse_params(text: str | bytes | None) -> dict[str, Any]:
    """The ``params`` form field of an infer request: a bounded JSON object
    (:func:`~monailabel_xflow.parameters.parse_json_object`) with none of :data:`RESERVED_PARAMS`.

    Raises:
        RequestTooLargeError: over :data:`~monailabel_xflow.parameters.MAX_PARAMS_BYTES` (413).
        RequestError: not a JSON object, too many keys, or a reserved key (422).
    """
    params = parse_json_object(text, "params")
    check_params(params)
    return params


def check_params(params: Mapping[str, Any]) -> None:
    """Refuse reserved or too many keys in client params (see :func:`parse_params`).

    ``label`` may be set only to a declared label *name* (3D Slicer sends the selected segment's
    name there), never a path.
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


def take_label_name(request: dict[str, Any]) -> None:
    """Move a ``label`` that names a declared label to ``label_name`` (in place): MONAI Label copies
    Slicer's ``{"label": "effusion"}`` where an upload's path would be; after this, ``label`` is an
    upload path or absent."""
    if is_label_name(request.get("label")):
        request[LABEL_NAME_KEY] = request.pop("label")


def prefetch_enabled(conf: Mapping[str, Any] | None) -> bool:
    """Whether the app works ahead of the annotator (``--conf prefetch``; true when unset).

    Raises:
        RequestError: a value that is not a boolean (the message names ``--conf prefetch``).
    """
    return as_bool((conf or {}).get("prefetch", True), "--conf prefetch")


def dicomweb_filter_conf(conf: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``--conf dicomweb_search_filter`` as the JSON object it must be, or None when unset.

    Raises:
        RequestError: text that is not JSON, or JSON that is not an object.
    """
    text = (conf or {}).get("dicomweb_search_filter")
    if not text:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"--conf dicomweb_search_filter is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise RequestError(f"--conf dicomweb_search_filter must be a JSON object, got {text!r}")
    return value


def store_seg_default(conf: Mapping[str, Any] | None) -> bool:
    """The server-wide default of the ``store_seg`` option (``--conf store_seg``; false when unset).

    Raises:
        RequestError: a value that is not a boolean (the message names ``--conf store_seg``).
    """
    return as_bool((conf or {}).get("store_seg", False), "--conf store_seg")
