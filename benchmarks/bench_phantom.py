"""Phantom speed on one core: images/s at 1024 px (generation alone, then the full set writer)
and the projected time for 10,000; the set writer's peak memory for n and 3n images.

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
    import tracemalloc
    from pathlib import Path

    from monailabel_xflow.data.export import export_set

    n = max(2, a.n // 3)
    peaks = []
    for count in (n, 3 * n):  # the peak must not grow with the set: one phantom in memory at a time
        with tempfile.TemporaryDirectory() as tmp:
            tracemalloc.start()
            t0 = time.perf_counter()
            export_set(Path(tmp), count, seed=0, size=a.size, dicom=True)
            dt = time.perf_counter() - t0
            peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
            tracemalloc.stop()
    rate = 3 * n / dt
    print(
        f"size {a.size}: export_set (+PNG, DICOM, masks, JSON) {rate:.2f} images/s "
        f"({1000 * dt / (3 * n):.0f} ms each); 10,000 images: {10000 / rate / 3600:.2f} h on one core"
    )
    print(
        f"size {a.size}: export_set peak traced memory {peaks[0]:.0f} MB for {n} images, {peaks[1]:.0f} MB for "
        f"{3 * n} (ratio {peaks[1] / peaks[0]:.2f}; 1.0 = independent of the set's size)"
    )


if __name__ == "__main__":
    main()
