"""What the app takes from MONAI Label: its base classes (:func:`upstream_class`) and the one registry
of the app's wraps of its functions.

MONAI Label's routes look their endpoint functions up at call time, so a route changes when its
function is replaced. Each wrapping layer (:mod:`.guard`, then :mod:`.slicer`) keeps what it wrapped
under a marker of its own (``_xflow_<layer>_upstream_<name>``), so one layer never hides another's
and installing twice is a no-op.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def upstream_class(path: str) -> Any:
    """The MONAI Label class at dotted ``path``, to subclass or call (``Any`` to mypy: monailabel ships
    no type information)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


INSTALLED: list[tuple[str, str, str]] = []
"""``(owner, name, layer)`` of every wrap installed in this process, in order."""


def _marker(name: str, layer: str) -> str:
    return f"_xflow_{layer}_upstream_{name}"


def wrap(owner: Any, name: str, layer: str, replacement: Callable[..., Any], static: bool = False) -> bool:
    """Replace ``owner.<name>`` (a MONAI Label module or class attribute) by ``replacement`` for
    ``layer``, once; ``replacement`` reaches what it wraps with :func:`upstream`. Returns whether it
    was installed now (False: ``layer`` had wrapped it before)."""
    marker = _marker(name, layer)
    if marker in vars(owner):
        return False
    current = getattr(owner, name)
    setattr(owner, marker, staticmethod(current) if static else current)
    setattr(owner, name, staticmethod(replacement) if static else replacement)
    INSTALLED.append((getattr(owner, "__name__", repr(owner)), name, layer))
    return True


def upstream(owner: Any, name: str, layer: str) -> Callable[..., Any]:
    """What ``layer``'s wrap of ``owner.<name>`` wraps (MONAI Label's function or an earlier layer's).

    Raises:
        AttributeError: ``layer`` has not wrapped it.
    """
    return getattr(owner, _marker(name, layer))


def wrapped(owner: Any, name: str, layer: str) -> bool:
    """Whether ``layer`` has wrapped ``owner.<name>``."""
    return _marker(name, layer) in vars(owner)
