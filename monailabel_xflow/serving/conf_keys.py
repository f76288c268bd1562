"""The ``--conf`` keys the XFlow app reads, in one list (``docs/app.md`` says what each does).

MONAI Label hands every ``--conf KEY VALUE`` to the app, so a misspelt key (``prefech false``)
would be ignored without a word. :func:`unknown_conf_keys` names each key that neither this app
nor MONAI Label reads, with the nearest known one; ``xflow serve`` prints it and the app logs it
at start. It warns rather than refuses: a key the app ignores does no harm, and setups that pass
other apps' keys keep starting. ``tests/test_conf_keys.py`` reads the package source and fails
when a key is read that this list lacks, or listed and never read.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from monailabel_xflow.workflow.model_config import SERVER_OVERRIDES

CONF_KEYS = frozenset(
    [
        "models_file",
        "models",  # the old name of models_file, still read with a deprecation warning
        "model_dir",
        "store_seg",
        "prefetch",
        "dicomweb_search_filter",
        "allow_unsupported_monailabel",
        "store_mb",
        "store_dir",
        "body_timeout_s",
        "max_sessions",
        "request_threads",
        *SERVER_OVERRIDES,  # over the models file's fields of the same name
    ]
)
"""Every key the app reads."""

UPSTREAM_CONF_KEYS = frozenset(["server_mode", "auth_token"])
"""Keys MONAI Label reads itself (``MONAILabelApp``, ``TaskConfig``)."""


def unknown_conf_keys(keys: Iterable[str]) -> list[str]:
    """One warning per key in ``keys`` that neither the app nor MONAI Label reads.

    Returns:
        ``"--conf prefech is not a key this app reads (did you mean prefetch?); ..."`` lines, in
        the order given; empty when every key is known.
    """
    known = sorted(CONF_KEYS | UPSTREAM_CONF_KEYS)
    out = []
    for key in dict.fromkeys(keys):
        if key not in CONF_KEYS and key not in UPSTREAM_CONF_KEYS:
            near = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            out.append(f"--conf {key} is not a key this app reads, so it has no effect{hint}; keys: docs/app.md")
    return out
