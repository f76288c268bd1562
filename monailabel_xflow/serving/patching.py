"""Replacing a web framework's functions at run time, in layers, for a framework without hooks.

A *layer* (a name such as ``"guard"``) replaces ``owner.<name>`` (a module or class attribute,
:func:`resolve` finds it from a dotted path) with :func:`wrap`, keeping what it replaced under a
marker of its own (``_xflow_<layer>_upstream_<name>``): the replacement reaches it with
:func:`upstream`, one layer never hides another's, and wrapping twice is a no-op. Which functions
may be replaced, and why, is the adapter's business (a list of :class:`Patch`; the MONAI Label app's
is :mod:`monailabel_xflow.app.wraps`): :func:`install_listed` installs a layer's listed patches and
nothing else, :func:`original_of` finds the framework's own function under every layer,
:func:`signature_of` renders a signature to pin, and :func:`in_range` checks a framework's version
against the range its replacements were checked on.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)


class Patch(NamedTuple):
    """One framework function replaced at run time: ``target`` (dotted path), the ``layer`` that
    replaces it, the framework's ``signature`` (:func:`signature_of`) and ``why``."""

    target: str
    layer: str
    signature: str
    why: str


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


def original_of(patches: Sequence[Patch], target: str) -> Any:
    """What the framework itself defines at ``target``, even after the layers of ``patches`` have
    wrapped it (the first layer to wrap holds the framework's)."""
    owner, name = resolve(target)
    for layer in dict.fromkeys(p.layer for p in patches):
        if wrapped(owner, name, layer):
            return upstream(owner, name, layer)
    return getattr(owner, name)


def install_listed(patches: Sequence[Patch], layer: str, replacements: Mapping[str, Callable[..., Any]]) -> list[str]:
    """Install ``layer``'s entries of ``patches``, each by ``replacements[target]`` (once per
    layer); a signature that differs from the recorded one is logged. Returns the targets
    installed now.

    Raises:
        KeyError: ``replacements`` names a target that is not ``layer``'s in ``patches``, or misses
            one (every replacement is listed, and only those).
    """
    mine = [p for p in patches if p.layer == layer]
    listed = {p.target for p in mine}
    if set(replacements) != listed:
        unlisted, missing = sorted(set(replacements) - listed), sorted(listed - set(replacements))
        raise KeyError(f"{layer}: replacements not listed in PATCHES {unlisted}, listed but not given {missing}")
    done = []
    for patch in mine:
        owner, name = resolve(patch.target)
        found = signature_of(original_of(patches, patch.target))
        if found != patch.signature:
            logger.warning("%s has changed: %s, wrapped for %s", patch.target, found, patch.signature)
        static = isinstance(inspect.getattr_static(owner, name), staticmethod)
        if wrap(owner, name, layer, replacements[patch.target], static=static):
            done.append(patch.target)
    return done
