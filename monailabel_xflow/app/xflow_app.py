"""The MONAI Label app: :class:`XFlowApp`, what the server instantiates, and the checks around it.

MONAI Label loads an app from a folder's ``main.py`` and writes into that folder; the app lives in
the package, and both folders that serve it only import :class:`XFlowApp` in their ``main.py``:
the repository's ``apps/xflow/`` (upstream's ``monailabel start_server --app apps/xflow``) and the
workspace :mod:`monailabel_xflow.commands.serve` writes (``xflow serve``, from a wheel too). The
app sets the MONAI Label settings it needs itself (:mod:`monailabel_xflow.app.server_defaults`), so
both commands serve the same app. ``--conf`` keys: ``models_file`` (``models``
is its deprecated old name; :func:`app_conf`), ``model_dir`` (default ``<workspace>/model``),
``dicomweb_search_filter`` (JSON; default CR/DX), ``store_seg`` (the default of the option),
``allow_unsupported_monailabel`` (start on a MONAI Label outside :data:`.wraps.SUPPORTED`),
``store_mb`` / ``store_dir`` (the workspace store, :func:`~monailabel_xflow.segmenter.store.configure_from_conf`),
``encode_precision`` and ``click_refinement`` (over the models file's), ``prefetch`` (``false``: no work
ahead of Next Sample).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from monailabel.interfaces.app import MONAILabelApp

from monailabel_xflow import __version__
from monailabel_xflow.app.errors import ImageNotFoundError, RequestError, http_errors
from monailabel_xflow.workflow.runtime import XFlowRuntime

logger = logging.getLogger(__name__)


class XFlowApp(MONAILabelApp):
    """XFlow and ROSALIA behind MONAI Label's REST API (task names: ``docs/app.md``); ``app_dir`` is
    the workspace (logs, and trained models unless ``conf["model_dir"]``), ``studies`` a folder or
    a DICOMweb URL."""

    def __init__(self, app_dir: str, studies: str, conf: Mapping[str, str]):
        from monailabel_xflow.app import server_defaults
        from monailabel_xflow.app.configs import RosaliaConfig, XFlowConfig
        from monailabel_xflow.app.guard import install as install_guard
        from monailabel_xflow.app.slicer import install as install_slicer_samples
        from monailabel_xflow.app.wraps import check_monailabel
        from monailabel_xflow.segmenter.store import configure_from_conf
        from monailabel_xflow.serving.conf_keys import unknown_conf_keys

        check_monailabel(conf)  # before anything: the replaced upstream functions are version-bound
        for line in unknown_conf_keys(conf):  # a misspelt key would otherwise do nothing without a word
            logger.warning(line)
        server_defaults.apply(app_dir)  # DICOMweb cache expiry, cache and session folders
        conf = app_conf(conf)
        configure_from_conf(app_dir, conf)  # the workspace store: before any model runs (scoring subprocess too)
        model_dir = conf.get("model_dir") or os.path.join(app_dir, "model")
        recover_model_dir(model_dir)
        self.xflow = XFlowConfig()
        self.xflow.init("xflow", model_dir, conf, None)
        logger.info("XFlow models: %s", self.xflow.runtime.describe())
        self.rosalia = RosaliaConfig()  # the papers' baseline, beside XFlow
        self.rosalia.init("rosalia", model_dir, conf, None)
        logger.info("ROSALIA: %s", self.rosalia.runtime.describe())
        super().__init__(
            app_dir=app_dir,
            studies=studies,
            conf=conf,
            name="XFlow",
            description=app_description(self.xflow.runtime),
            version=__version__,
        )
        install_guard(conf=conf)  # body limit and time, sessions, worker threads, ids checked, infer params confined
        install_slicer_samples()  # next sample: one file for Slicer, never a numbered series

    def init_datastore(self):
        return init_datastore(self, super().init_datastore)

    def init_remote_datastore(self):
        from monailabel_xflow.app.datastore import make_dicomweb_datastore

        return make_dicomweb_datastore(self.studies, self.conf)  # no dcmqi download

    def init_infers(self):
        return {**self.xflow.infer(), **self.rosalia.infer()}

    def init_trainers(self):
        return {self.xflow.name: self.xflow.trainer()}

    def init_strategies(self):
        return self.xflow.strategy()

    def init_scoring_methods(self):
        return self.xflow.scoring_method()

    def info(self):
        return {
            **super().info(),
            "xflow_models": self.xflow.runtime.status(),
            "rosalia_models": self.rosalia.runtime.status(),
        }

    def infer(self, request, datastore=None):
        return checked_infer(self, super().infer, request, datastore)


def recover_model_dir(model_dir: str) -> None:
    """In the server (never a task subprocess, which may be training into it): undo what a kill
    left in ``model_dir`` (:func:`~monailabel_xflow.files.recover_folder`), each step logged."""
    from monailabel_xflow.app.scoring import background_task
    from monailabel_xflow.files import recover_folder
    from monailabel_xflow.workflow.runtime import TRAINED_SEGMENTER_DIR

    if background_task() is None and os.path.isdir(model_dir):
        for line in recover_folder(model_dir, (TRAINED_SEGMENTER_DIR, TRAINED_SEGMENTER_DIR + ".rejected")):
            logger.warning("model folder %s: %s", model_dir, line)


def app_conf(conf: Mapping[str, str] | None) -> dict[str, str]:
    """``conf`` with the model configuration file under ``models``, the key the runtimes read:
    ``models_file`` wins; ``models`` alone works with a deprecation warning."""
    conf = dict(conf or {})
    named, old = conf.get("models_file"), conf.get("models")
    if named:
        if old not in (None, "", named):
            logger.warning("--conf models_file %s and --conf models %s: using models_file", named, old)
        conf["models"] = named
    elif old:
        logger.warning(
            "--conf models is deprecated (MONAI Label's sample apps use that key for a list of task "
            "names): use --conf models_file %s (xflow serve --models %s)",
            old,
            old,
        )
    return conf


EXTRA_EXTENSIONS = ("*.dcm", "*.jpeg")
"""Radiograph files a studies folder may hold besides MONAI Label's defaults (png, jpg, nii ...)."""


def app_description(runtime: XFlowRuntime) -> str:
    base = "XFlow: instruction-guided chest X-ray lesion segmentation (Stage 1 grounding + Stage 2 click revision)"
    return f"{base}. Models: {runtime.describe()}"


def init_datastore(app: Any, upstream: Callable[[], Any]) -> Any:
    """A DICOMweb URL goes through ``upstream`` (which calls the app's ``init_remote_datastore``);
    a folder gets :class:`~monailabel_xflow.app.datastore.XFlowLocalDatastore`."""
    if app.studies.startswith(("http://", "https://")):
        return upstream()
    from monailabel.config import settings

    from monailabel_xflow.app.datastore import XFlowLocalDatastore

    extensions = list(dict.fromkeys([*settings.MONAI_LABEL_DATASTORE_FILE_EXT, *EXTRA_EXTENSIONS]))
    return XFlowLocalDatastore(
        app.studies,
        extensions=extensions,
        auto_reload=settings.MONAI_LABEL_DATASTORE_AUTO_RELOAD,
        read_only=settings.MONAI_LABEL_DATASTORE_READ_ONLY,
    )


def _under(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder and path != folder


def server_upload_folders() -> list[str]:
    """Where MONAI Label itself puts uploaded files (temporary files) and sessions."""
    import tempfile

    from monailabel.config import settings

    sessions = settings.MONAI_LABEL_SESSION_PATH or os.path.join(
        os.path.expanduser("~"), ".cache", "monailabel", "sessions"
    )
    return [tempfile.gettempdir(), sessions]


def confined_image(image: Any, datastore: Any) -> tuple[str, str | None]:
    """The file an infer request may read, and its datastore id (None for an upload).

    Inside the guarded infer route (:func:`~monailabel_xflow.app.guard.upload_paths_allowed`)
    the server's own upload or session path is accepted; otherwise ``image`` is an id
    (:func:`~monailabel_xflow.parameters.check_id`) that the datastore resolves.

    Raises:
        UnsafeIdError: not a plain id (400, the same answer whether or not such a file exists).
        ImageNotFoundError: a plain id the datastore does not hold (404).
    """
    from monailabel_xflow.app.guard import upload_paths_allowed
    from monailabel_xflow.parameters import check_id

    if (
        upload_paths_allowed()
        and isinstance(image, str)
        and os.path.isabs(image)
        and any(_under(image, folder) for folder in server_upload_folders())
    ):
        return image, None
    image_id = check_id(image, "image")
    if image_id not in datastore.list_images():
        raise ImageNotFoundError(f"unknown image {image_id!r}: the datastore has no such image")
    uri = datastore.get_image_uri(image_id)
    if not uri:
        raise ImageNotFoundError(f"unknown image {image_id!r}: the datastore has no such image")
    return uri, image_id


def checked_infer(app: Any, upstream: Callable[..., Any], request: Mapping[str, Any], datastore: Any = None) -> Any:
    """``MONAILabelApp.infer`` confined to the datastore with every documented error
    type mapped to its HTTP status (:mod:`.errors`).

    The image is resolved by :func:`confined_image` (upstream would read any existing path a
    client names); a previous ``label`` is only ever the server's own upload; with
    ``save_label`` (batch infer) the result is saved under a checked tag through the datastore.
    """
    from monailabel_xflow.app.guard import upload_paths_allowed
    from monailabel_xflow.app.requests import take_label_name
    from monailabel_xflow.parameters import as_bool, check_id

    with http_errors("infer"):
        request = dict(request)
        take_label_name(request)  # Slicer's `label`: the clicked segment's name, not a file
        store = datastore or app.datastore()
        request["image"], image_id = confined_image(request.get("image"), store)
        if image_id is not None:
            request["image_id"] = image_id
        label = request.get("label")
        if label not in (None, "") and not (
            upload_paths_allowed()
            and isinstance(label, str)
            and os.path.isabs(label)
            and any(_under(label, f) for f in server_upload_folders())
        ):
            raise RequestError("a previous label is uploaded as the `label` file of the request, never named")
        save = as_bool(request.pop("save_label", False), "save_label")
        tag = check_id(str(request.pop("label_tag", "") or "original"), "label tag")
        result = upstream(request, datastore)
        store_result_seg(store, image_id, result)
        if save and image_id is not None and result.get("file") and os.path.exists(result["file"]):
            result["label"] = store.save_label(
                image_id, result["file"], tag, {"model": request.get("model"), "params": result.get("params")}
            )
        return result


def store_result_seg(datastore: Any, image_id: str | None, result: Any) -> None:
    """The ``store_seg`` option: the result's masks (left by the task in ``params["store_seg"]``:
    findings, algorithm, ``{finding: bool (H, W)}``) as a DICOM SEG in the image's study; ``params``
    gain ``seg_series`` (None for an upload, with ``seg_not_stored`` saying why).

    Raises:
        RequestError: ``store_seg`` asked of a datastore that is not a DICOMweb PACS.
    """
    params = result.get("params") if isinstance(result, dict) else None
    if not isinstance(params, dict):
        return
    wanted = params.pop("store_seg", None)
    if not wanted:
        return
    if not hasattr(datastore, "store_seg"):
        raise RequestError(
            "store_seg: the studies are not a DICOMweb PACS (start the server with "
            "--studies http://.../dicom-web to store results as DICOM SEG)"
        )
    if image_id is None:  # e.g. a client uploading its own image while the server stores by default
        params["seg_series"] = None
        params["seg_not_stored"] = "the image is an upload, not a series of the PACS; name it by its `image` id"
        return
    algorithm = str(wanted.get("algorithm") or "XFlow")
    params["seg_series"] = datastore.store_seg(  # from the masks the task answered: nothing decoded again
        image_id, None, findings=wanted.get("findings", ()), algorithm=algorithm, masks=wanted["masks"]
    )
    logger.info("stored %s's answer for %s as SEG %s", algorithm, image_id, params["seg_series"])
