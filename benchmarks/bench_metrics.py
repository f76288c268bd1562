"""Throughput of the XFlow metrics: per-sample stats on 1024 x 1024 masks.

Run: ``.venv/bin/python benchmarks/bench_metrics.py [--n 10000] [--size 1024]``. Prints the time
for ``--n`` calls of :func:`~monailabel_xflow.metrics.sample_stats` plus the aggregation (target:
10,000 masks at 1024 px in under a minute). To keep memory flat the masks come from a pool of 200
synthetic pairs, cycled (the function caches nothing): positives get a GT ellipse and a shifted
prediction with 0-5 specks, negatives an empty prediction or, one time in ten, a false-positive
blob; the mix is 1 positive : 3 negatives, about CheXpercept's.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import parse_args

from monailabel_xflow.metrics import sample_stats, summarize


def make_pool(n: int, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:size, :size]
    pool = []
    for i in range(n):
        if i % 4 == 0:
            cy, cx = rng.integers(size // 4, 3 * size // 4, 2)
            ry, rx = rng.integers(size // 20, size // 5, 2)
            gt = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
            dy, dx = rng.integers(-size // 40, size // 40 + 1, 2)
            pred = np.roll(gt, (dy, dx), axis=(0, 1))
            for _ in range(rng.integers(0, 6)):
                y, x = rng.integers(0, size - 4, 2)
                pred[y : y + 3, x : x + 3] = True
        else:
            gt = None
            pred = np.zeros((size, size), bool)
            if rng.random() < 0.1:
                y, x = rng.integers(0, size - 40, 2)
                pred[y : y + 30, x : x + 30] = True
        pool.append((pred, gt))
    return pool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="sample_stats calls to time (default 10000)")
    parser.add_argument("--size", type=int, default=1024, help="mask side in pixels (default 1024)")
    args = parse_args(parser, n=20, size=128)
    pool = make_pool(200, args.size)
    start, cpu = time.perf_counter(), time.process_time()
    stats = [sample_stats(*pool[i % len(pool)]) for i in range(args.n)]
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    t0 = time.perf_counter()
    summarize(stats)
    t_sum = time.perf_counter() - t0
    n_pos = sum(s.positive for s in stats)
    print(f"masks: {args.n} at {args.size}x{args.size} ({n_pos} positive)")
    print(
        f"sample_stats: {elapsed:.1f} s wall ({cpu:.1f} s CPU), {1000 * elapsed / args.n:.2f} ms/mask, "
        f"{args.n / elapsed:.0f} masks/s"
    )
    print(f"summarize: {1000 * t_sum:.0f} ms for {args.n} records")
    print(f"10,000 masks: {(elapsed + t_sum) * 10_000 / args.n:.1f} s (target < 60 s)")


if __name__ == "__main__":
    main()
