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
    _name_leaf_parsers(parser)
    return parser


def _name_leaf_parsers(parser: argparse.ArgumentParser) -> None:
    """Record in each sub-command's defaults the parser that reads it (the deepest one wins), so
    an unknown option is refused with that sub-command's usage, not the top level's."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.set_defaults(_parser=sub)
                _name_leaf_parsers(sub)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # exits 2 with the sub-command's own usage line
        args._parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
