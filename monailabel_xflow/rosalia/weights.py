"""Which ROSALIA the app serves: the ``rosalia`` key of the models file, else the committed demo.

The models file (:class:`monailabel_xflow.workflow.model_config.ModelConfig`) holds the ``rosalia``
key beside XFlow's weights; this module decides what it means: a configured folder or hub id, else
the ROSALIA demo in ``monailabel_xflow/rosalia/demo/`` (``xflow train rosalia-demo --install``),
unless ``XFLOW_NO_DEMO`` turns the demo off.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping
from pathlib import Path

from monailabel_xflow.workflow.model_config import ModelConfig, demo_disabled

ROSALIA_DEMO_NAME = "rosalia-demo-phantoms"
"""Name of the ROSALIA demo (``monailabel_xflow/rosalia/demo/``) in logs, traces and ``/info``."""
ROSALIA_DEMO_NOTICE = (
    f"Using the ROSALIA demo model ({ROSALIA_DEMO_NAME}): demo model trained on synthetic "
    "phantoms; not for clinical images."
)
ROSALIA_DEMO_DIR = Path(str(importlib.resources.files(__package__) / "demo"))
"""Folder of the committed ROSALIA demo (a ROSALIA folder, ``xflow train rosalia-demo``)."""


def rosalia_source(config: ModelConfig, environ: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """Where the ``rosalia`` task's weights come from.

    Returns:
        ``(path, source)``: the configured ``rosalia`` (resolved locally, ``source`` "config"), else
        the committed ROSALIA demo (``"demo"``), else ``(None, "none")`` when the demo is disabled
        (``XFLOW_NO_DEMO``) or not installed.

    Raises:
        ModelConfigError: a configured ``rosalia`` that is not available locally.
    """
    if config.rosalia:
        return config.resolve("rosalia"), "config"
    if demo_disabled(environ) or not (ROSALIA_DEMO_DIR / "rosalia.json").is_file():
        return None, "none"
    return ROSALIA_DEMO_DIR, "demo"
