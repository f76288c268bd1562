"""Phantom speed on one core: images/s at 1024 px (generation alone, then the full set writer)
and the projected time for 10,000.

Run: ``.venv/bin/python benchmarks/bench_phantom.py [--size 1024] [--n 20]``. Pins BLAS threads to
one so the figure is per core (scale by cores for a parallel run).
"""

from __future__ import annotations

import argparse
import os
import time

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(var, "1")

from common import parse_args  # noqa: E402

from monailabel_xflow.data.phantom import generate_phantom  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--n", type=int, default=20)
    a = parse_args(ap, size=256, n=2)
    generate_phantom(0, size=a.size)  # warm-up (imports, caches)
    t0 = time.perf_counter()
    for s in range(1, a.n + 1):
        generate_phantom(s, size=a.size)
    dt = time.perf_counter() - t0
    rate = a.n / dt
    print(
        f"size {a.size}: {a.n} phantoms in {dt:.1f} s = {rate:.2f} images/s on one core "
        f"({1000 * dt / a.n:.0f} ms each); 10,000 images: {10000 / rate / 3600:.2f} h on one core"
    )

    # the whole set writer: PNG, DICOM, masks, pairs and JSON
    import tempfile
    from pathlib import Path

    from monailabel_xflow.data.export import export_set

    n = max(2, a.n // 3)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        export_set(Path(tmp), n, seed=0, size=a.size, dicom=True)
        dt = time.perf_counter() - t0
    rate = n / dt
    print(
        f"size {a.size}: export_set (+PNG, DICOM, masks, JSON) {rate:.2f} images/s "
        f"({1000 * dt / n:.0f} ms each); 10,000 images: {10000 / rate / 3600:.2f} h on one core"
    )


if __name__ == "__main__":
    main()
