"""``xflow preference RANKINGS.csv``: tie-aware Bradley–Terry analysis of a reader study."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "preference",
        help="fit Davidson and Rao-Kupper models to reader rankings (paper Table 4)",
        description="Read a long-format CSV 'case,reader,item,rank' (rank 1 best; tied items share "
        "a rank), turn each ranking into pairwise outcomes and fit the Davidson and Rao-Kupper "
        "tie-aware Bradley-Terry models by maximum likelihood. Prints a Markdown table of centred "
        "log-strengths with percentile bootstrap intervals over cases, mean ranks and the tie rate.",
    )
    p.add_argument("rankings", type=Path, help="CSV with columns case,reader,item,rank")
    p.add_argument(
        "--bootstrap", type=int, default=2000, help="bootstrap resamples over cases (default 2000; 0 = none)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed of the bootstrap (default 0)")
    p.add_argument("--level", type=float, default=0.95, help="interval coverage (default 0.95)")
    p.add_argument("--out", type=Path, default=None, help="write the full report as JSON here")
    p.set_defaults(func=run)


def run(args) -> int:
    from monailabel_xflow.eval.reader_study import PreferenceError, analyse, format_table, read_rankings

    if args.bootstrap < 0 or not 0 < args.level < 1:
        print("xflow preference: --bootstrap must be >= 0 and --level in (0, 1)", file=sys.stderr)
        return 2
    try:
        rankings = read_rankings(args.rankings)
    except PreferenceError as err:
        print(f"xflow preference: {err}", file=sys.stderr)
        return 2
    report = analyse(rankings, n_bootstrap=args.bootstrap, seed=args.seed, level=args.level, progress=True)
    print(format_table(report))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2))
        print(f"report written to {args.out}")
    return 0
