"""Replacing a web framework's functions at run time, in layers, for a framework without hooks.

A *layer* (a name such as ``"guard"``) replaces ``owner.<name>`` (a module or class attribute,
:func:`resolve` finds it from a dotted path) with :func:`wrap`, keeping what it replaced under a
marker of its own (``_xflow_<layer>_upstream_<name>``): the replacement reaches it with
:func:`upstream`, one layer never hides another's, and wrapping twice is a no-op. Which functions
may be replaced, and why, is the adapter's business (the MONAI Label app lists them in
:mod:`monailabel_xflow.app.wraps`); :func:`signature_of` renders a signature to pin, and
:func:`in_range` checks a framework's version against the range its replacements were checked on.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any


def in_range(version: str, supported: tuple[str, str]) -> bool:
    """Whether ``version`` lies in ``supported`` = (lowest, first excluded) (pre-releases of the
    lowest excluded; ``+local`` and ``.postN`` builds count as their release)."""
    found = re.match(r"(\d+(?:\.\d+)*)(.*)", version.strip())
    if found is None:
        return False
    release, rest = tuple(int(p) for p in found.group(1).split(".")), found.group(2)
    low, high = (tuple(int(p) for p in v.split(".")) for v in supported)
    return low <= release < high and (not rest or rest.startswith(("+", ".post")))


class _Shown:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def signature_of(obj: Callable[..., Any]) -> str:
    """``obj``'s parameters as a list of replaced functions records them: names, kinds and plain
    defaults, a FastAPI marker default (``Form(...)``, ``File(...)``) by its class name, no
    annotations."""
    sig = inspect.signature(obj)
    plain = (str, int, float, bool, type(None))
    params = [
        p.replace(
            annotation=p.empty,
            default=p.default
            if p.default is p.empty or isinstance(p.default, plain)
            else _Shown(type(p.default).__name__),
        )
        for p in sig.parameters.values()
    ]
    return str(sig.replace(parameters=params, return_annotation=sig.empty))


def resolve(target: str) -> tuple[Any, str]:
    """``(owner, name)`` of a dotted ``target``: the module or class holding the attribute."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:-1]:
            owner = getattr(owner, part)
        return owner, parts[-1]
    raise ImportError(f"cannot import any module of {target!r}")


INSTALLED: list[tuple[str, str, str]] = []
"""``(owner, name, layer)`` of every wrap installed in this process, in order."""


def _marker(name: str, layer: str) -> str:
    return f"_xflow_{layer}_upstream_{name}"


def wrap(owner: Any, name: str, layer: str, replacement: Callable[..., Any], static: bool = False) -> bool:
    """Replace ``owner.<name>`` by ``replacement`` for ``layer``, once; ``replacement`` reaches what
    it wraps with :func:`upstream`. Returns whether it was installed now (False: ``layer`` had
    wrapped it before). The MONAI Label app installs through
    :func:`monailabel_xflow.app.wraps.install`, which allows listed targets only."""
    marker = _marker(name, layer)
    if marker in vars(owner):
        return False
    current = getattr(owner, name)
    setattr(owner, marker, staticmethod(current) if static else current)
    setattr(owner, name, staticmethod(replacement) if static else replacement)
    INSTALLED.append((getattr(owner, "__name__", repr(owner)), name, layer))
    return True


def upstream(owner: Any, name: str, layer: str) -> Callable[..., Any]:
    """What ``layer``'s wrap of ``owner.<name>`` wraps (the framework's function or an earlier layer's).

    Raises:
        AttributeError: ``layer`` has not wrapped it.
    """
    return getattr(owner, _marker(name, layer))


def wrapped(owner: Any, name: str, layer: str) -> bool:
    """Whether ``layer`` has wrapped ``owner.<name>``."""
    return _marker(name, layer) in vars(owner)
