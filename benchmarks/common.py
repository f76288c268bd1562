"""What every benchmark script shares: the ``--smoke`` option.

``--smoke`` runs a script at tiny sizes with one repeat, in seconds, so that the default test
suite (``tests/test_benchmarks.py``) runs every script and a refactor cannot break one unseen.
Its figures mean nothing; they only show that the script still measures what it says.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

SMOKE_HELP = "seconds-long run at tiny sizes, one repeat (figures meaningless; what the test suite runs)"


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, **smoke: Any) -> argparse.Namespace:
    """Add ``--smoke`` to ``parser`` and parse ``argv``.

    Args:
        parser: the script's parser, every other option already added.
        argv: the arguments (``None``: ``sys.argv[1:]``).
        **smoke: option destinations and the values ``--smoke`` gives them (it overrides what
            the command line said).

    Raises:
        ValueError: a ``smoke`` key names no option of ``parser`` (a typo would silently keep
            the full size).
    """
    parser.add_argument("--smoke", action="store_true", help=SMOKE_HELP)
    args = parser.parse_args(argv)
    unknown = sorted(set(smoke) - set(vars(args)))
    if unknown:
        raise ValueError(f"smoke values for options the parser lacks: {unknown}")
    if args.smoke:
        for dest, value in smoke.items():
            setattr(args, dest, value)
    return args


def synchronize() -> None:
    """Wait for queued GPU work, so a wall-clock timer sees it (a no-op without CUDA)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn``, in milliseconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)
