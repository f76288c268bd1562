"""Sub-commands of ``xflow``: one module each, exposing ``register(subparsers)`` (see cli.py)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from pathlib import Path


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for an integer in ``lo..hi`` (no upper bound when ``hi`` is None).

    A value out of range is then refused by argparse itself, before any work: one line naming
    the option and its range, exit status 2.
    """

    def integer(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {value}")
        return value

    return integer


def not_a_folder(path: str | os.PathLike[str]) -> str | None:
    """What is wrong with an output folder ``path`` that exists and is not a folder (a file given
    by mistake), in the words a command prints after the option; None when it is usable."""
    return f"{path} is a file, not a folder" if Path(path).exists() and not Path(path).is_dir() else None


def user_folder(name: str, variable: str, environ: Mapping[str, str] | None = None) -> Path:
    """``$<variable>``, else ``$XDG_DATA_HOME/monailabel-xflow/<name>`` (XDG's default
    ``~/.local/share``): a per-user folder for what the commands write (the server's workspace,
    the OHIF viewer), never inside the installed package."""
    env = os.environ if environ is None else environ
    if env.get(variable):
        return Path(env[variable]).expanduser()
    data = Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share").expanduser()
    return data / "monailabel-xflow" / name


def checkout_root() -> Path | None:
    """The source checkout the package runs from (``make setup``'s editable install, or a clone on
    ``PYTHONPATH``): the folder above ``monailabel_xflow/`` when it holds the project's
    ``setup.cfg`` and ``Makefile``; None for an installed wheel (site-packages holds neither)."""
    import monailabel_xflow

    root = Path(monailabel_xflow.__file__).resolve().parent.parent
    return root if (root / "setup.cfg").is_file() and (root / "Makefile").is_file() else None
