"""Shared fixtures. Real radiographs are read from ``../shared/cxr-samples`` (never copied here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("XFLOW_SHARED", REPO.parent / "shared"))
CXR_SAMPLES = SHARED / "cxr-samples"


@pytest.fixture(scope="session")
def cxr_samples() -> Path:
    """Folder of the real NIH/SIIM samples; the suite needs it (CI has it beside the repo)."""
    if not CXR_SAMPLES.is_dir():
        pytest.fail(f"missing {CXR_SAMPLES}: the tests read real radiographs from ../shared")
    return CXR_SAMPLES
