"""The ``xflow`` command line.

Each sub-command lives in its own module under :mod:`monailabel_xflow.commands` and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking the parsed
arguments and returning an exit status. Modules are imported only to build the parser; heavy
imports (torch, monai, transformers) stay inside the ``func`` bodies so ``xflow --help`` is fast.

Exit statuses: 0 success, 2 bad input (parse or loading error, printed on stderr), 1 anything else.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from monailabel_xflow import __version__, commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xflow",
        description="XFlow: instruction-guided chest X-ray lesion segmentation (MONAI Label plugin).",
    )
    parser.add_argument("--version", action="version", version=f"xflow {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
