"""The fence around MONAI Label: every upstream function the app replaces at run time, why, and the
MONAI Label versions that was checked against; the version check at start; the one way to wrap.

MONAI Label has no hook for request validation, so the app replaces functions of its server
process: endpoint functions (its routes look them up at call time) and ``AsyncTask``'s static
methods. Each replacement takes upstream's parameters and calls what it replaced.
:data:`PATCHES` lists all of them, :data:`RELIED_ON` the upstream internals the app calls or
subclasses beyond the public task and datastore API, each with upstream's signature
(:func:`~monailabel_xflow.serving.patching.signature_of`). ``tests/test_upstream_fence.py`` pins
every one against the installed MONAI Label, so an upgrade fails in CI instead of at a user's desk;
:func:`install` installs a layer's patches and nothing unlisted.

Checked against: MONAI Label 0.8.5 (the pinned version; the tests run against it). The recorded
signatures are also those of the 0.8.0, 0.8.1, 0.8.3 and 0.8.4 sources and of ``main`` at 058ddfc
(2025, OHIF 3.11), compared from the sources, not run. The server starts only on
:data:`SUPPORTED` (:func:`check_monailabel`) unless :data:`OVERRIDE_ENV` or ``--conf``
:data:`OVERRIDE_CONF` says otherwise.

Each wrapping layer (:mod:`.guard`, then :mod:`.slicer`) keeps what it wrapped under a marker of
its own (:mod:`monailabel_xflow.serving.patching`), so one layer never hides another's and
installing twice is a no-op.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from monailabel_xflow.errors import XFlowError
from monailabel_xflow.serving.patching import Patch, in_range, install_listed, original_of

logger = logging.getLogger(__name__)

SUPPORTED = ("0.8.5", "0.8.6")
"""MONAI Label versions the app starts on: from the first (inclusive) to the second (exclusive)."""
OVERRIDE_ENV = "XFLOW_ALLOW_UNSUPPORTED_MONAILABEL"
OVERRIDE_CONF = "allow_unsupported_monailabel"


_INFER, _DS, _TASKS = "monailabel.endpoints.infer", "monailabel.endpoints.datastore", "monailabel.utils.async_tasks"
PATCHES: tuple[Patch, ...] = (
    Patch(
        f"{_INFER}.run_inference",
        "guard",
        "(background_tasks, model, image='', session_id='', params=Form, file=File, label=File, output=None)",
        "client params would name server files; uploads typed by content, sessions checked, dicom_seg refused",
    ),
    Patch(
        "monailabel.endpoints.session.create_session",
        "guard",
        "(background_tasks, uncompress=False, expiry=0, files=File)",
        "archives could unpack outside the session folder; file names and count bounded",
    ),
    Patch(f"{_DS}.download_image", "guard", "(image, check_only=False, check_sum=None)", "bad checksum: 500 -> 422"),
    Patch(
        f"{_DS}.add_image",
        "guard",
        "(background_tasks, image=None, params=Form, file=File, user=None)",
        "the id checked, the upload typed by content",
    ),
    Patch(
        f"{_DS}.save_label",
        "guard",
        "(background_tasks, image, params=Form, tag='final', label=File, user=None)",
        "ids and tag checked, the upload typed by content",
    ),
    Patch(f"{_DS}.update_image_info", "guard", "(image, info=Form, user=None)", "id checked, info bounded"),
    Patch(f"{_DS}.update_label_info", "guard", "(label, tag, info=Form, user=None)", "ids checked, info bounded"),
    Patch(f"{_DS}.download_dataset", "guard", "(limit_cases=None)", "no labels: 500 -> 404; the ZIP removed once sent"),
    Patch(
        "monailabel.endpoints.activelearning.sample",
        "guard",
        "(strategy, params=None, user=None)",
        "params must be a JSON object; client_id bounded",
    ),
    Patch(
        f"{_TASKS}.utils._task_func", "guard", "(task, method, callback=None)", "a task stopped while queued never runs"
    ),
    Patch(
        f"{_TASKS}.task.AsyncTask.run",
        "guard",
        "(method, request=None, params=None, force_sync=False, enqueue=False)",
        "requests validated before the subprocess; one train / batch infer at a time; CPU batch infer",
    ),
    Patch(f"{_TASKS}.task.AsyncTask.stop", "guard", "(method)", "a stop also cancels what is queued"),
    Patch(
        "monailabel.endpoints.activelearning.sample",
        "slicer",
        "(strategy, params=None, user=None)",
        "3D Slicer would open numbered file names as one series: one file name per sample",
    ),
    Patch(f"{_TASKS}.task.AsyncTask.stop", "slicer", "(method)", "Slicer's Stop reads details[-1]: always a line"),
)
"""Every replacement, in install order. Besides these, :func:`~.guard.install` puts its middleware
first in the server's FastAPI app (``monailabel.app.app``, rebuilt with Starlette's
``build_middleware_stack``) and adds exception handlers (FastAPI's public API)."""

_LOCAL, _WEB = "monailabel.datastore.local.LocalDatastore", "monailabel.datastore.dicom.DICOMWebDatastore"
RELIED_ON: dict[str, str] = {
    f"{_INFER}.send_response": "(datastore, result, output, background_tasks)",
    f"{_TASKS}.utils.tasks": "(method)",
    "monailabel.interfaces.utils.app.app_instance": "(app_dir=None, studies=None, conf=None)",
    "monailabel.utils.sessions.Sessions.get_session": "(self, session_id, update_ts=True, fetch_cache=True)",
    "monailabel.utils.sessions.Sessions.remove_session": "(self, session_id)",
    "monailabel.utils.others.generic.file_ext": "(name)",
    "monailabel.datastore.dicom.DICOMwebClientX": "(url, session=None, qido_url_prefix=None, wado_url_prefix=None, "
    "stow_url_prefix=None, delete_url_prefix=None, proxies=None, headers=None, callback=None, chunk_size=1000000)",
    f"{_LOCAL}._to_id": "(self, file)",
    f"{_LOCAL}._filename": "(self, id, ext)",
    f"{_LOCAL}._update_datastore_file": "(self, lock=True)",
    _WEB: "(client, search_filter, cache_path=None, fetch_by_frame=False, convert_to_nifti=True)",
    f"{_WEB}._dicom_info": "(self, series_id)",
}
"""Upstream callables the app calls (private ones included) with their signatures; the methods its
subclasses override are pinned against upstream's by the fence test directly."""


class UnsupportedMonaiLabelError(XFlowError, RuntimeError):
    """The installed MONAI Label is outside :data:`SUPPORTED` (the server does not start)."""


def monailabel_version() -> str:
    """The installed MONAI Label's version (its distribution metadata)."""
    from importlib.metadata import version

    return version("monailabel")


def is_supported(version: str) -> bool:
    """Whether ``version`` lies in :data:`SUPPORTED` (:func:`~monailabel_xflow.serving.patching.in_range`)."""
    return in_range(version, SUPPORTED)


def conf_override(conf: Mapping[str, Any] | None) -> bool:
    """``--conf allow_unsupported_monailabel`` (false when unset).

    Raises:
        RequestError: a value that is not a boolean.
    """
    from monailabel_xflow.parameters import as_bool

    return as_bool((conf or {}).get(OVERRIDE_CONF, False), f"--conf {OVERRIDE_CONF}")


def check_monailabel(conf: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> str:
    """Refuse to start on a MONAI Label outside :data:`SUPPORTED`, unless overridden
    (``$XFLOW_ALLOW_UNSUPPORTED_MONAILABEL=1`` or ``--conf allow_unsupported_monailabel true``: a
    warning is logged instead). Returns the installed version.

    Raises:
        UnsupportedMonaiLabelError: outside the range and not overridden (the message names the
            range, the installed version and both overrides).
        RequestError: an override value that is not a boolean.
    """
    from monailabel_xflow.parameters import as_bool

    version = monailabel_version()
    if is_supported(version):
        return version
    env = os.environ if environ is None else environ
    message = (
        f"MONAI Label {version} is installed; the XFlow app supports MONAI Label >={SUPPORTED[0]},<{SUPPORTED[1]} "
        f"(its replaced functions are listed in monailabel_xflow/app/wraps.py). Install monailabel=={SUPPORTED[0]}, "
        f"or start anyway at your own risk with {OVERRIDE_ENV}=1 or --conf {OVERRIDE_CONF} true"
    )
    overridden = conf_override(conf) or as_bool(env.get(OVERRIDE_ENV, "") or False, OVERRIDE_ENV)
    if not overridden:
        logger.error(message)
        raise UnsupportedMonaiLabelError(message)
    logger.warning("%s (overridden: starting anyway)", message)
    return version


def original(target: str) -> Any:
    """What MONAI Label itself defines at ``target``, even after layers have wrapped it."""
    return original_of(PATCHES, target)


def install(layer: str, replacements: Mapping[str, Callable[..., Any]]) -> list[str]:
    """Install ``layer``'s entries of :data:`PATCHES` and nothing unlisted
    (:func:`~monailabel_xflow.serving.patching.install_listed`: a changed signature is logged, the
    version check decides whether the server starts). Returns the targets installed now.

    Raises:
        KeyError: ``replacements`` names a target that is not ``layer``'s in :data:`PATCHES`, or
            misses one (every replacement is listed here, and only those).
    """
    return install_listed(PATCHES, layer, replacements)


def upstream_class(path: str) -> Any:
    """The MONAI Label class at dotted ``path``, to subclass or call (``Any`` to mypy: monailabel ships
    no type information)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)
