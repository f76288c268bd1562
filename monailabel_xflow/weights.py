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

DTYPES = ("float32", "bfloat16", "float16")
"""The dtypes a policy model may be loaded in or saved as (the models file's ``dtype``, a merge's)."""

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


FINGERPRINT_FULL_BYTES = 1 << 22
"""Tensors up to 4 MiB are hashed whole by :func:`weights_fingerprint`; larger ones by a strided
sample of about this many bytes plus their shape and dtype."""

_fingerprints: dict[int, tuple[object, str]] = {}


def weights_fingerprint(module: torch.nn.Module) -> str:
    """A 32-hex-digit fingerprint of a module's loaded weights (parameters and buffers).

    Every tensor's name, shape and dtype enter it; tensors up to :data:`FINGERPRINT_FULL_BYTES`
    are hashed whole (LoRA adapters, F_seg's fine-tuned decoder layers), larger ones by a strided
    sample of that size (a trained copy of a large tensor differs all over, so the sample sees it).
    Hashing stays well under a second for a full-size SAM3 on CPU. Computed once per module
    object (while it lives); weights changed in place afterwards are not seen.
    """
    import hashlib
    import weakref

    import torch

    remembered = _fingerprints.get(id(module))
    if remembered is not None and remembered[0]() is module:  # type: ignore[operator]
        return remembered[1]
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in sorted(module.state_dict(keep_vars=False).items()):
            flat = tensor.detach().reshape(-1)
            digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
            if flat.numel() == 0:
                continue
            raw = flat.contiguous().view(torch.uint8)
            if raw.numel() > FINGERPRINT_FULL_BYTES:
                words = raw[: raw.numel() // 4 * 4].view(torch.int32)
                step = max(1, words.numel() // (FINGERPRINT_FULL_BYTES // 4))
                raw = words[::step].contiguous().view(torch.uint8)
            digest.update(raw.cpu().numpy().tobytes())
    value = digest.hexdigest()[:32]
    _fingerprints[id(module)] = (weakref.ref(module), value)
    return value


ENCODE_PRECISIONS = ("float32", "bfloat16")
"""How F_seg's image encoder runs (``encode_precision``): ``float32`` (the default) or ``bfloat16``
(autocast: weights stay float32, matrix products in bfloat16; faster on a CPU with bfloat16 units,
:func:`cpu_has_bf16`). ``benchmarks/bench_encode.py`` measures both; bfloat16 is not the default
because the demo weights' masks do not all agree with float32's at IoU >= 0.98 (see
``benchmarks/README.md``)."""


def cpu_has_bf16() -> bool:
    """Whether this CPU has bfloat16 matrix instructions (``amx_bf16`` or ``avx512_bf16`` in
    ``/proc/cpuinfo``); False where that cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"amx_bf16", "avx512_bf16"})
    except OSError:
        return False
    return False


def check_encode_precision(value: str | None) -> str:
    """``encode_precision`` checked (None: ``float32``).

    Raises:
        ValueError: a value not in :data:`ENCODE_PRECISIONS`.
    """
    choice = "float32" if value in (None, "") else str(value).strip().lower()
    if choice not in ENCODE_PRECISIONS:
        raise ValueError(f"encode_precision must be one of {', '.join(ENCODE_PRECISIONS)}, got {value!r}")
    return choice
