"""Where weights come from and where they run: the one rule for "local path or hub id", and the
one choice of device and dtype, for every model of the package (F_seg, the policies, ROSALIA).

A value names a **local path** when it exists on disk, is a ``Path``, starts with ``/``, ``.``
or ``~``, ends in a checkpoint suffix, or has more than one ``/``; otherwise, when it has the form
``org/name[@revision]``, it is a **hub id**, downloaded only when a user asks for it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

CHECKPOINT_SUFFIXES = (".pt", ".pth")
"""Single-file checkpoints (the official SAM3 release); folders are Hugging Face format."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+(@[\w.\-/]+)?$")


def is_hub_id(value: str) -> bool:
    """Whether ``value`` has the form of a hub id, ``org/name`` or ``org/name@revision``."""
    return bool(_HUB_ID.match(value))


def split_hub_id(value: str) -> tuple[str, str | None]:
    """``"org/name@rev"`` -> ``("org/name", "rev")``; no ``@`` -> revision None."""
    repo_id, _, revision = value.partition("@")
    return repo_id, (revision or None)


def choose_device(device: str | torch.device | None = None) -> torch.device:
    """The requested device, or CUDA when available, else the CPU."""
    import torch

    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def choose_dtype(device: torch.device, dtype: torch.dtype | str | None = None) -> torch.dtype:
    """The requested dtype (a ``torch.dtype`` or its name, e.g. ``"bfloat16"``), or bfloat16 on a
    CUDA device that supports it, else float32.

    Raises:
        ValueError: a name that is not a floating torch dtype.
    """
    import torch

    if isinstance(dtype, str):
        named = getattr(torch, dtype, None)
        if not isinstance(named, torch.dtype) or not named.is_floating_point:
            raise ValueError(f"dtype {dtype!r} is not a floating torch dtype (float32, bfloat16, float16)")
        return named
    if dtype is not None:
        return dtype
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def looks_like_local_path(value: str | Path) -> bool:
    """True when ``value`` names a local file or folder (see the module docstring), False for a
    hub id. A local path need not exist: the caller says so with its own error."""
    if isinstance(value, Path):
        return True
    name = str(value)
    return (
        os.path.isabs(name)
        or name.startswith((".", "~"))
        or name.endswith(CHECKPOINT_SUFFIXES)
        or Path(os.path.expanduser(name)).exists()
        or not is_hub_id(name)
    )


def weights_tag(name_or_path: str | Path) -> str:
    """Cache tag of some weights: the resolved path plus the weights file's size and mtime (so
    embeddings of weights a trainer overwrote are not reused), or the hub id."""
    path = Path(os.path.expanduser(str(name_or_path)))
    if not path.exists():
        return str(name_or_path)
    weights = path
    if path.is_dir():
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        weights = files[0] if files else path
    stat = weights.stat()
    return f"{path.resolve()}@{stat.st_size}:{stat.st_mtime_ns}"
