"""Chest radiograph loading transforms, installed as ``monailabel_xflow.transforms``.

* :func:`load_cxr` ``(path, allow_lateral=False) -> (image (H, W) float32 in [0, 1], meta)``
  for plain callers; :class:`LoadCXR` / :class:`LoadCXRd` give the same as a MONAI
  ``MetaTensor`` ``(1, H, W)``.
* :func:`save_nifti_2d` writes an ``(H, W)`` image or mask as the ``(W, H, 1)`` NIfTI that
  MONAI Label and ITK expect.
* :func:`from_reader_order` / :func:`to_reader_order`: the one transpose between MONAI readers'
  ``(W, H[, ...])`` and the package's ``(H, W[, ...])``.
* :class:`CXRLoadError` (a ``ValueError`` with ``path`` and ``reason``) for every file that
  cannot be loaded.

Names resolve lazily (PEP 562) so that importing this package costs numpy only: the MONAI
transforms import monai (slow) when first touched, and ``load_cxr`` imports its readers
when first called.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CXRLoadError": "loading",
    "LATERAL_VIEWS": "loading",
    "META_KEYS": "loading",
    "load_cxr": "loading",
    "save_nifti_2d": "loading",
    "from_reader_order": "loading",
    "to_reader_order": "loading",
    "LoadCXR": "array",
    "cxr_to_metatensor": "array",
    "LoadCXRd": "dictionary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
