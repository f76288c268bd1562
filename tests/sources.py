"""The package's source files as the import system sees them, for tests that read the code.

``monailabel_xflow/transforms`` is a symbolic link to the top-level ``transforms/`` (the design
card's layout; docs/architecture.md, "Where the files are"), and ``Path.rglob`` on Python 3.11
does not descend into a linked folder, so a test that walks the package with it would silently
skip the transforms. Walk with :func:`package_files` instead; ``tests/test_packaging.py`` checks
that it finds exactly the modules ``pkgutil`` imports.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "monailabel_xflow"


def package_files(suffix: str = ".py", root: Path = PACKAGE) -> list[Path]:
    """Every file under ``root`` (default the package) whose name ends with ``suffix``, linked
    folders followed, ``__pycache__`` left out; paths stay under ``root`` (not resolved), sorted."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(folder) / f for f in files if f.endswith(suffix)]
    return sorted(found)
