"""Every benchmark script runs: each ``benchmarks/bench_*.py`` is started with ``--smoke`` (tiny
sizes, one repeat; ``benchmarks/common.py``) as its own process, must exit 0 and print its
figures. A figure is parsed from the output and must be a finite positive number, so a script
that runs but no longer measures fails too. Timings themselves are never asserted (they belong to
the scripts, run at full size by hand).

The scripts run two at a time (the machine's cores) as soon as the module starts; each test waits
for its own script.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TIMEOUT_S = 600

FIGURES = {
    # script: patterns whose first group is a figure the script printed (finite, > 0)
    "bench_builders.py": [r"init-sft .* ([\d.]+) attempts/s per core"],
    "bench_decode.py": [
        r"served\s+prefill\+1\s+([\d.]+) s",
        r"plain\s+prefill\+1\s+[\d.]+ s\s+\d+ tokens\s+([\d.]+) s",
    ],
    "bench_encode.py": [r"bfloat16\s+min IoU ([\d.]+)", r"(?m)^  float32\s+([\d.]+) s"],
    "bench_store.py": [r"Next Sample to masks\s+([\d.]+)", r"first click\s+([\d.]+)", r"disk per image .*?([\d.]+) MB"],
    "bench_click_round.py": [r'"later_click_ms": ([\d.]+)', r'"later_over_in_process": ([\d.]+)'],
    "bench_click_path.py": [
        r"before \(main .*?:\s+([\d.e-]+) ms",
        r"after .*?:\s+([\d.e-]+) ms",
        r"before / after = ([\d.]+)x",
        r"Stage 1 prompts: ([\d.e-]+) ms one by one",
        r"ms one by one, ([\d.e-]+) ms prepared once",
        r"Stage 2 turn: ([\d.e-]+) ms rle.encode",
        r"ms rle.encode, ([\d.e-]+) ms rle.LazyRLE",
    ],
    "bench_ils.py": [r"(?m)^all\s+([\d.]+)\s+[\d.]+$", r"everything above: ([\d.]+) h on one core"],
    "bench_ils_reports.py": [r"= (\d+) reports/s on one core", r"= ([\d.]+) reports/s; rules are"],
    "bench_load.py": [r'"click_p95_ratio_many_vs_one": ([\d.]+)', r'"info_p99_ratio_many_vs_one": ([\d.]+)'],
    "bench_metrics.py": [r"([\d.]+) ms/mask", r"10,000 masks: ([\d.]+) s"],
    "bench_oracle.py": [r"-> ([\d.]+) trajectories/s", r"one click decision: ([\d.]+) ms"],
    "bench_phantom.py": [r"= ([\d.]+) images/s on one core", r"export_set .* ([\d.]+) images/s"],
    "bench_policy.py": [r"wall: reuse is ([\d.]+)x faster", r"one finding\s+([\d.]+)"],
    "bench_rosalia.py": [r"question: ROSALIA .*?([\d.]+) s", r"XFlow Stage 1 / ROSALIA\s+([\d.]+) x"],
    "bench_segmenter.py": [r"encode_s\s+([\d.]+)", r"revision / encode = ([\d.]+)"],
    "bench_server.py": [r'"xflow_revise_round_trip": \{\s*"p50_ms": ([\d.]+)', r"app overhead p50 ([\d.]+) ms"],
    "bench_server_bounds.py": [r'"revise_idle_p50_ms": ([\d.]+)', r'"ratio_while_scoring_vs_idle": ([\d.]+)'],
    "bench_transforms.py": [r"00000129_000\.png\s+[\d.]+\s+[\d.]+\s+([\d.]+)", r"dx\.dcm\s+([\d.]+)"],
    "bench_workflow.py": [
        r"segmenter encode \(set_image\)\s+([\d.]+)",
        r"XFlow\.run, one finding \(end to end, new image\)\s+([\d.]+)",
    ],
}
# Something every run must also print; a failed request or a missing stage shows here.
ALSO = {
    "bench_load.py": [r'"errors": 0,', r'"images_lost": \[\]'],
    "bench_server.py": [r'"throughput_1_clients": \{[^}]*"errors": 0,', r'"throughput_8_clients": \{[^}]*"errors": 0,'],
    "bench_policy.py": [r"same text both ways: True"],
    "bench_ils.py": [r"(?m)^structure\s+[\d.]+"],  # medspaCy is a dependency: the report side runs
    "bench_store.py": [r"answered from the store: True"],
}


def _run(script: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--smoke"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        cwd=BENCHMARKS.parent,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return proc, time.perf_counter() - start


@pytest.fixture(scope="module")
def smoke_runs(request):
    """``{script: Future[(CompletedProcess, seconds)]}`` for the scripts this session selected."""
    wanted = sorted(
        {
            item.callspec.params["script"]
            for item in request.session.items
            if item.module is request.module and hasattr(item, "callspec")
        }
    )
    pool = ThreadPoolExecutor(max_workers=2)
    futures: dict[str, Future] = {s: pool.submit(_run, s) for s in wanted}
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


def test_every_script_is_listed():
    """A new script gets its figures listed here (and so runs in the suite)."""
    assert sorted(p.name for p in BENCHMARKS.glob("bench_*.py")) == sorted(FIGURES)


@pytest.mark.parametrize("script", sorted(FIGURES))
def test_smoke_run_prints_its_figures(script, smoke_runs):
    proc, seconds = smoke_runs[script].result(timeout=TIMEOUT_S + 60)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{script} --smoke exited {proc.returncode} after {seconds:.0f} s:\n{output[-4000:]}"
    for pattern in FIGURES[script]:
        found = re.search(pattern, proc.stdout)
        assert found, f"{script} --smoke printed no figure matching {pattern!r}:\n{proc.stdout[-3000:]}"
        value = float(found.group(1))
        assert math.isfinite(value) and value > 0, f"{script}: {pattern!r} gave {value}"
    for pattern in ALSO.get(script, []):
        assert re.search(pattern, proc.stdout), f"{script} --smoke lacks {pattern!r}:\n{proc.stdout[-3000:]}"


def test_smoke_values_must_name_options():
    """``--smoke`` values for an option the script lacks are an error, not a silent full-size run."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from common import parse_args
    finally:
        sys.path.remove(str(BENCHMARKS))
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1024)
    assert parse_args(parser, ["--smoke"], size=64).size == 64
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1024)
    assert parse_args(parser, [], size=64).size == 1024
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=1024)
    with pytest.raises(ValueError, match="sise"):
        parse_args(parser, [], sise=64)
