"""The XFlow models one MONAI Label app serves: configuration, loading, sharing, locking.

One :class:`XFlowRuntime` per app holds one :class:`~monailabel_xflow.workflow.xflow.XFlow`, shared
by the ``xflow``, ``xflow_revise`` and ``xflow_uncertainty`` tasks, so the segmenter's per-image
embedding cache serves them all. Configuration, first match wins: ``--conf models_file PATH``
(old name ``models``), then the environment (:mod:`monailabel_xflow.workflow.model_config`). With
nothing configured the app still starts; :meth:`XFlowRuntime.get` raises
:class:`~monailabel_xflow.app.errors.ModelsNotConfiguredError` (503) saying how to configure.

Runs take XFlow's own lock one at a time; a click revision works on a fork of the segmenter (same
embedding cache), so it does not wait for another image's run. The runtime locks only loading and
swapping in a fine-tuned segmenter.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from monailabel_xflow.app.errors import ModelsNotConfiguredError, ModelUnavailableError

logger = logging.getLogger(__name__)

LOAD_BACKOFF_S = 30.0
LOAD_BACKOFF_MAX_S = 600.0
"""After a failed model load, requests answer 503 (:class:`ModelUnavailableError`, with the
reason) for 30 s, doubling per further failure up to 10 min, instead of reloading per request."""

HOW_TO_CONFIGURE = (
    "No XFlow weights are configured. Start the server with `--conf models_file PATH` "
    "(`xflow serve ... --models models.yaml`) or set XFLOW_MODELS=PATH, where PATH is a "
    "YAML/JSON file naming vlm_base + init_adapter (+ rev_adapter) or init_model (+ rev_model), "
    "and segmenter (see monailabel_xflow/workflow/model_config.py)."
)


BACKGROUND_NICE = 10
"""CPU niceness MONAI Label's background task processes (scoring, training, batch infer) give
themselves, so that they never compete with the server's interactive requests."""


def background_task() -> str | None:
    """The method (``"scoring"``, ``"train"``, ``"batch_infer"`` ...) when this process is one of
    MONAI Label's background task subprocesses (``python -m monailabel.interfaces.utils.app -m
    METHOD``), else None."""
    import sys

    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(spec, "name", None) != "monailabel.interfaces.utils.app":
        return None
    argv = list(sys.argv)
    for flag in ("-m", "--method"):
        if flag in argv[:-1]:
            return argv[argv.index(flag) + 1]
    return None


def lower_priority_if_background() -> None:
    """In a background task subprocess, lower its CPU priority once (see :data:`BACKGROUND_NICE`)."""
    global _NICED
    if _NICED or background_task() is None:
        return
    _NICED = True
    try:
        os.nice(BACKGROUND_NICE)
        logger.info(
            "background %s task: CPU niceness +%d (interactive requests first)", background_task(), BACKGROUND_NICE
        )
    except OSError:
        pass


_NICED = False


class XFlowRuntime:
    """Lazily loaded, lock-protected XFlow models of one app.

    Args:
        conf: the app's ``--conf``; ``models`` names the model configuration file.
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
        self._load_lock = threading.Lock()  # loading and swapping models; XFlow locks its own use
        self._conf = dict(conf or {})
        self.model_dir = model_dir
        self._segmenter_stamp: float | None = None
        self._environ = os.environ if environ is None else environ
        self._xflow: Any = None
        self.trained_segmenter: str | None = None
        self._error: Exception | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._config_error: Exception | None = None
        from monailabel_xflow.workflow.model_config import ModelConfig, ModelConfigError

        try:
            self.source, self.config = self._read_config()
        except ModelConfigError as exc:  # a missing or malformed file: keep serving, say so
            logger.error("XFlow model configuration unusable: %s", exc)
            self.source, self.config, self._config_error = str(self._conf.get("models")), ModelConfig(), exc
        lower_priority_if_background()  # before loading models in a scoring/train subprocess
        if preload and self.configured:
            try:
                self.get()
            except Exception as exc:  # keep serving: /info and every request report it
                logger.error("XFlow models could not be loaded: %s", exc)

    # --- configuration ------------------------------------------------------------------------

    def _read_config(self) -> tuple[str, Any]:
        from monailabel_xflow.workflow.model_config import ModelConfig

        path = self._conf.get("models")
        if path:
            src, config = f"--conf models_file {path}", ModelConfig.from_file(path)
        else:
            from monailabel_xflow.workflow.model_config import default_config

            # The environment when it names weights, else the committed demo model (unless disabled).
            config, src = default_config(self._environ)
        if self._conf.get("encode_precision"):  # --conf encode_precision over the models file's
            config = config.with_overrides(encode_precision=self._conf["encode_precision"])
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
            "loaded": self._xflow is not None,
            "trained_segmenter": self.trained_segmenter,
        }
        if self.config.is_demo:
            from monailabel_xflow.workflow.model_config import DEMO_NAME, DEMO_NOTICE

            out.update(demo=DEMO_NOTICE, model_name=DEMO_NAME)
        if self._error is not None:
            out["error"] = str(self._error)
        return out

    def describe(self) -> str:
        """One line naming the models in use (for task descriptions and the log)."""
        if self._config_error is not None:
            return f"MODEL CONFIGURATION ERROR - {self._config_error}"
        if not self.configured:
            return "NOT CONFIGURED - " + HOW_TO_CONFIGURE
        names = ", ".join(f"{k}={v}" for k, v in self.config.identities().items())
        if self.config.is_demo:
            from monailabel_xflow.workflow.model_config import DEMO_NOTICE

            return f"{DEMO_NOTICE} ({names})"
        return names

    # --- access -------------------------------------------------------------------------------

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
        with self._load_lock:
            if self._xflow is None:
                from monailabel_xflow.workflow.xflow import XFlow

                wait = self._retry_at - time.monotonic()
                if self._error is not None and wait > 0:  # back off: no reload under the lock per request
                    raise ModelUnavailableError(
                        f"the XFlow models failed to load ({self._error}); next attempt in {wait:.0f} s"
                    )
                logger.info("loading XFlow models (%s): %s", self.source, self.describe())
                try:
                    self._xflow = XFlow.from_config(self.config)
                except Exception as exc:
                    self._error = exc
                    self._failures += 1
                    self._retry_at = time.monotonic() + min(
                        LOAD_BACKOFF_MAX_S, LOAD_BACKOFF_S * 2 ** (self._failures - 1)
                    )
                    from monailabel_xflow.app.errors import status_of

                    if status_of(exc) is None:  # e.g. a torch or I/O error: still a 503 with the reason
                        raise ModelUnavailableError(f"the XFlow models failed to load: {exc}") from exc
                    raise
                self._error, self._failures = None, 0
                logger.info("XFlow models in use: %s", self.describe())
            self._refresh_segmenter()
            return self._xflow

    def _refresh_segmenter(self) -> None:
        """Swap in the train task's fine-tuned segmenter when it is newer than the one in use."""
        path = trained_segmenter(self.model_dir)
        if path is None:
            return
        stamp = max(p.stat().st_mtime for p in Path(path).iterdir())
        if self._segmenter_stamp is not None and stamp <= self._segmenter_stamp:
            return
        from monailabel_xflow.segmenter.loading import load_segmenter

        logger.info("using the fine-tuned segmenter %s (replaces %s)", path, self.config.segmenter)
        self._xflow.replace_segmenter(load_segmenter(path, device=self.config.device))
        self._segmenter_stamp = stamp
        self.trained_segmenter = path


def trained_segmenter(model_dir: str | os.PathLike | None) -> str | None:
    """The fine-tuned segmenter folder in ``model_dir`` if training has written one."""
    if not model_dir:
        return None
    path = Path(model_dir) / TRAINED_SEGMENTER_DIR
    return str(path) if (path / "config.json").is_file() else None


TRAINED_SEGMENTER_DIR = "xflow_segmenter"
