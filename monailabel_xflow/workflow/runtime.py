"""The models a server holds: loaded on first use, shared by every request, backed off after a failed load.

:class:`LazyModel` is the one lazily loaded model of a server, whatever the model: the
XFlow models (:class:`XFlowRuntime`, here) and ROSALIA
(:class:`monailabel_xflow.rosalia.runtime.RosaliaRuntime`) both hold theirs in one. It loads under
a lock, once; after a failed load, requests answer 503
(:class:`~monailabel_xflow.errors.ModelUnavailableError`, with the reason) for
:data:`LOAD_BACKOFF_S`, doubling per further failure up to :data:`LOAD_BACKOFF_MAX_S`, instead of
reloading per request.

:class:`XFlowRuntime`: one :class:`~monailabel_xflow.workflow.xflow.XFlow` per app, shared by the
``xflow``, ``xflow_revise`` and ``xflow_uncertainty`` tasks, so the segmenter's per-image embedding
cache serves them all. Configuration, first match wins: ``conf["models"]`` (the app's ``--conf
models_file PATH``), then the environment (:mod:`monailabel_xflow.workflow.model_config`). With
nothing configured the app still starts; :meth:`XFlowRuntime.get` raises
:class:`~monailabel_xflow.errors.ModelsNotConfiguredError` (503) saying how to configure. Runs take
XFlow's own lock one at a time; the runtime locks only loading and swapping in a fine-tuned
segmenter.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from monailabel_xflow.errors import ModelsNotConfiguredError, ModelUnavailableError, http_status
from monailabel_xflow.files import serving_dir

logger = logging.getLogger(__name__)

T = TypeVar("T")

LOAD_BACKOFF_S = 30.0
LOAD_BACKOFF_MAX_S = 600.0
"""After a failed load: 503 for 30 s, doubling per further failure up to 10 min."""


class LazyModel(Generic[T]):
    """A model loaded by ``load`` on the first :meth:`get`, under a lock, and shared afterwards.

    Args:
        what: the model's name in messages (``"the <what> failed to load ..."``).
        load: builds the model; an error of the package's tree keeps its type (and HTTP status),
            any other becomes :class:`~monailabel_xflow.errors.ModelUnavailableError`.
        clock: seconds, monotonic (default ``time.monotonic``).
    """

    def __init__(self, what: str, load: Callable[[], T], clock: Callable[[], float] | None = None) -> None:
        self.what = what
        self._load = load
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self.value: T | None = None
        self.error: Exception | None = None
        """The last load's error (None once a load succeeds)."""
        self.failures = 0
        """Failed loads in a row."""
        self.retry_at = 0.0
        """``clock()`` time before which :meth:`get` does not try to load again."""

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory."""
        return self.value is not None

    def get(self, then: Callable[[T], None] | None = None) -> T:
        """The model, loaded now if it is not yet (one load at a time).

        Args:
            then: called with the model under the same lock, on every call (e.g. to swap in a
                newer part).

        Raises:
            ModelUnavailableError: the last load failed less than the back-off ago (503), or a
                load failed with an error outside the package's tree (503 with the reason).
            XFlowError: a load failed with an error of the tree (as raised: its status holds).
        """
        with self._lock:
            if self.value is None:
                wait = self.retry_at - self._clock()
                if self.error is not None and wait > 0:  # back off: no reload under the lock per request
                    raise ModelUnavailableError(
                        f"the {self.what} failed to load ({self.error}); next attempt in {wait:.0f} s"
                    )
                try:
                    self.value = self._load()
                except Exception as exc:
                    self.error = exc
                    self.failures += 1
                    self.retry_at = self._clock() + min(LOAD_BACKOFF_MAX_S, LOAD_BACKOFF_S * 2 ** (self.failures - 1))
                    if http_status(exc) is None:  # e.g. a torch or I/O error: still a 503 with the reason
                        raise ModelUnavailableError(f"the {self.what} failed to load: {exc}") from exc
                    raise
                self.error, self.failures = None, 0
            if then is not None:
                then(self.value)
            return self.value


HOW_TO_CONFIGURE = (
    "No XFlow weights are configured. Start the server with `--conf models_file PATH` "
    "(`xflow serve ... --models models.yaml`) or set XFLOW_MODELS=PATH, where PATH is a "
    "YAML/JSON file naming vlm_base + init_adapter (+ rev_adapter) or init_model (+ rev_model), "
    "and segmenter (see monailabel_xflow/workflow/model_config.py)."
)

TRAINED_SEGMENTER_DIR = "xflow_segmenter"
"""The folder of ``model_dir`` where F_seg fine-tuned on saved labels is promoted to."""


def trained_segmenter(model_dir: str | os.PathLike | None) -> str | None:
    """The fine-tuned segmenter folder in ``model_dir`` if training has written one (the previous
    one while a promotion's swap is between its renames: :func:`~monailabel_xflow.files.serving_dir`)."""
    if not model_dir:
        return None
    path = serving_dir(Path(model_dir) / TRAINED_SEGMENTER_DIR)  # the previous one while a swap is half done
    return str(path) if path is not None and (path / "config.json").is_file() else None


class XFlowRuntime:
    """Lazily loaded, lock-protected XFlow models of one app (see the module docstring).

    Args:
        conf: the app's configuration; ``models`` names the model configuration file.
        environ: where ``XFLOW_MODELS`` etc. are read (default ``os.environ``).
        preload: load now (the server does, so its log names the models).
        model_dir: where the train task saves a fine-tuned segmenter; a newer one there replaces
            the serving segmenter at the next :meth:`get`.
    """

    def __init__(
        self,
        conf: Mapping[str, str] | None = None,
        environ: Mapping[str, str] | None = None,
        preload: bool = True,
        model_dir: str | os.PathLike | None = None,
    ):
        from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError

        self._conf = dict(conf or {})
        self.model_dir = model_dir
        self._segmenter_stamp: float | None = None
        self._environ = os.environ if environ is None else environ
        self.model: LazyModel[Any] = LazyModel("XFlow models", self._load)
        self.trained_segmenter: str | None = None
        self._config_error: Exception | None = None
        try:
            self.source, self.config = self._read_config()
        except ModelConfigError as exc:  # a missing or malformed file: keep serving, say so
            logger.error("XFlow model configuration unusable: %s", exc)
            self.source, self.config, self._config_error = str(self._conf.get("models")), ModelConfig(), exc
        if preload and self.configured:
            try:
                self.get()
            except Exception as exc:  # keep serving: /info and every request report it
                logger.error("XFlow models could not be loaded: %s", exc)

    def _read_config(self) -> tuple[str, Any]:
        from monailabel_xflow.workflow.model_config import SERVER_OVERRIDES, ModelConfig, default_config

        path = self._conf.get("models")
        if path:
            src, config = f"--conf models_file {path}", ModelConfig.from_file(path)
        else:
            # The environment when it names weights, else the committed demo model (unless disabled).
            config, src = default_config(self._environ)
        # --conf encode_precision / click_refinement over the models file's (validated by ModelConfig)
        overrides = {k: self._conf[k] for k in SERVER_OVERRIDES if self._conf.get(k)}
        if overrides:
            config = config.with_overrides(**overrides)
        return src, config

    @property
    def configured(self) -> bool:
        """Whether any weights are named (they may still fail to load)."""
        return bool(self.config.weights())

    def status(self) -> dict[str, Any]:
        """For ``/info``: what is configured and loaded, or how to configure it."""
        if self._config_error is not None:
            return {"configured": False, "error": str(self._config_error), "message": HOW_TO_CONFIGURE}
        if not self.configured:
            return {"configured": False, "message": HOW_TO_CONFIGURE}
        out: dict[str, Any] = {
            "configured": True,
            "source": self.source,
            "models": self.config.identities(),
            "loaded": self.model.loaded,
            "trained_segmenter": self.trained_segmenter,
        }
        if self.config.is_demo:
            from monailabel_xflow.workflow.model_config import DEMO_NAME, DEMO_NOTICE

            out.update(demo=DEMO_NOTICE, model_name=DEMO_NAME)
        if self.model.error is not None:
            out["error"] = str(self.model.error)
        return out

    def describe(self) -> str:
        """One line naming the models in use (for task descriptions and the log)."""
        if self._config_error is not None:
            return f"MODEL CONFIGURATION ERROR - {self._config_error}"
        if not self.configured:
            return "NOT CONFIGURED - " + HOW_TO_CONFIGURE
        names = ", ".join(f"{k}={v}" for k, v in self.config.identities().items())
        trained = trained_segmenter(self.model_dir)
        if trained is not None:  # it serves in place of the configured one (cached scores key on this line)
            stamp = max(p.stat().st_mtime_ns for p in Path(trained).iterdir())
            names += f", fine-tuned segmenter={Path(trained).name}@{stamp}"
        if self.config.is_demo:
            from monailabel_xflow.workflow.model_config import DEMO_NOTICE

            return f"{DEMO_NOTICE} ({names})"
        return names

    def get(self) -> Any:
        """The loaded :class:`~monailabel_xflow.workflow.xflow.XFlow`; loads it on first use.

        Raises:
            ModelsNotConfiguredError: nothing configured (the message says how to configure).
            ModelConfigError: the configured weights cannot be loaded.
            ModelUnavailableError: the last load failed less than the back-off ago (503).
        """
        if self._config_error is not None:
            raise self._config_error
        if not self.configured:
            raise ModelsNotConfiguredError(HOW_TO_CONFIGURE)
        return self.model.get(then=self._refresh_segmenter)

    def _load(self) -> Any:
        from monailabel_xflow.workflow.xflow import XFlow

        logger.info("loading XFlow models (%s): %s", self.source, self.describe())
        xflow = XFlow.from_config(self.config)
        logger.info("XFlow models in use: %s", self.describe())
        return xflow

    def _refresh_segmenter(self, xflow: Any) -> None:
        """Swap in the train task's fine-tuned segmenter when it is newer than the one in use."""
        path = trained_segmenter(self.model_dir)
        if path is None:
            return
        stamp = max(p.stat().st_mtime for p in Path(path).iterdir())
        if self._segmenter_stamp is not None and stamp <= self._segmenter_stamp:
            return
        from monailabel_xflow.segmenter.loading import load_segmenter

        logger.info("using the fine-tuned segmenter %s (replaces %s)", path, self.config.segmenter)
        xflow.replace_segmenter(load_segmenter(path, device=self.config.device))
        self._segmenter_stamp = stamp
        self.trained_segmenter = path
