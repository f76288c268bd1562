"""What 3D Slicer's MONAI Label module needs from a server's *next sample* answer.

Slicer opens a single-slice image without its "single file" option, so ITK's archetype reader
stacks every file of the folder whose name differs in one group of digits
(``phantom_1_00000.png``, ``phantom_1_00001.png`` ... would open as one volume).
:func:`single_file_sample` answers ``name`` = ``<image id>.<tag><ext>`` with ``tag`` eight letters
derived from the id, and ``path`` = that name alone (no server path), so Slicer downloads the image
under ``name``, where it opens alone. The MONAI Label app wraps
``/activelearning`` with it (:mod:`monailabel_xflow.app.slicer`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def letter_tag(image_id: str, length: int = 8) -> str:
    """``length`` lowercase letters derived from ``image_id`` (SHA-256, no digits)."""
    digest = hashlib.sha256(image_id.encode("utf-8")).digest()
    return "".join(chr(ord("a") + b % 26) for b in digest[:length])


def file_extension(path: str) -> str:
    """The image's extension as Slicer's readers need it (``.nii.gz`` kept whole)."""
    lower = path.lower()
    for double in (".nii.gz", ".nrrd.gz"):
        if lower.endswith(double):
            return path[-len(double) :]
    return Path(path).suffix


def single_file_name(image_id: str, path: str) -> str:
    """``<image id>.<letter tag><ext>``: a file name no other sample's name differs from in one
    digit group only (see the module docstring)."""
    return f"{image_id}.{letter_tag(image_id)}{file_extension(path)}"


def single_file_sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """``sample`` (MONAI Label's next-sample answer) with ``name`` the single-file name and
    ``path`` that name alone; an answer without ``id`` unchanged."""
    out = dict(sample)
    image_id = out.get("id")
    if not image_id:
        return out
    out["name"] = single_file_name(str(image_id), str(out.get("path") or out.get("name") or ""))
    out["path"] = out["name"]
    return out
