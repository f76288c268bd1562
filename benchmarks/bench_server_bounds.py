"""Server bounds (issue 15): memory of one request by image size, and interactive latency while
background scoring runs.

Starts the real server (``tests/servers.py``, random tiny models) on a studies folder of real NIH
radiographs (1024 x 1024) plus one of them enlarged to ``--big`` pixels a side (default 7000:
49 MP, just under the 50 MP cap), and measures:

* **memory per request**: the server process's peak resident memory (``VmHWM``, reset through
  ``/proc/PID/clear_refs`` before each request) above its resident memory before the request,
  for ``xflow`` "segment all findings" with Stage 2 (7 findings x (1 + 4 clicks) = 35 policy
  steps) on a 1024 px and on the big image. Models are loaded by a warm-up request first, so the
  figure is what one request adds;
* **scoring interference**: ``xflow_revise`` round trips (p50) with the server idle, then while
  a scoring run (``POST /scoring/xflow_uncertainty``, a subprocess at CPU niceness +10) works
  through the studies. Ratio while-scoring / idle (target: close to 1; on a machine whose cores
  are all busy the niced subprocess still takes some CPU).

Usage: ``.venv/bin/python benchmarks/bench_server_bounds.py [--big 7000] [--images 6] [--requests 10]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import parse_args  # noqa: E402
from radiographs import copy_nih_pngs  # noqa: E402
from servers import build_tiny_models, monailabel_server  # noqa: E402


def proc_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def request_memory_mb(server, client, image_id: str, params: dict) -> tuple[float, float]:
    """(MB the request added at its peak above the resident memory before it, seconds)."""
    pid = server.proc.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = proc_kb(pid, "VmRSS")
    start = time.perf_counter()
    client.infer("xflow", image_id, params)
    seconds = time.perf_counter() - start
    return (proc_kb(pid, "VmHWM") - before) / 1024.0, seconds


def revise_round_trips(client, names: list[str], n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        fg = [[int(v) for v in rng.integers(100, 900, 2)] + [0]]
        start = time.perf_counter()
        client.infer("xflow_revise", names[k % len(names)], {"finding": "edema", "foreground": fg})
        out.append(time.perf_counter() - start)
    return out


def scoring_running(url: str) -> bool:
    r = requests.get(f"{url}/scoring/", timeout=30)
    return r.status_code == 200 and str(r.json().get("status", "")).upper() == "RUNNING"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--big", type=int, default=7000, help="side of the big image in pixels (default 7000)")
    parser.add_argument("--images", type=int, default=6, help="1024 px studies (default 6)")
    parser.add_argument("--requests", type=int, default=10, help="timed xflow_revise requests per phase")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, big=1536, images=2, requests=2)

    tmp = Path(tempfile.mkdtemp(prefix="bench_bounds_"))
    results: dict = {}
    try:
        models = build_tiny_models(tmp / "models")
        studies = tmp / "studies"
        studies.mkdir()
        names = copy_nih_pngs(studies, args.images)
        Image.open(studies / f"{names[0]}.png").convert("L").resize((args.big, args.big)).save(studies / "big.png")
        env = {"XFLOW_MAX_BODY_MB": "256"}
        with monailabel_server(studies, tmp / "server", conf={"models": str(models)}, env=env) as server:
            client = server.client(tmp)
            for _ in range(600):  # the start-up scoring run first, so that "idle" is idle
                if not scoring_running(server.url):
                    break
                time.sleep(1)
            client.infer("xflow", names[0], {"instruction": "edema", "revise": False})  # load the models
            rss = proc_kb(server.proc.pid, "VmRSS") / 1024.0
            results["server_rss_after_warmup_mb"] = round(rss, 0)
            all_findings = {"instruction": "segment all findings", "revise": True, "max_clicks": 4, "trace": False}
            for label, image_id in (("1024px", names[1]), (f"{args.big}px", "big")):
                mb, s = request_memory_mb(server, client, image_id, all_findings)
                results[f"request_peak_mb_{label}"] = round(mb, 0)
                results[f"request_seconds_{label}"] = round(s, 2)
                print(f"{label}: +{mb:.0f} MB peak over {rss:.0f} MB resident, {s:.1f} s", flush=True)

            revise_round_trips(client, names, len(names), seed=1)  # encode each image once
            idle = revise_round_trips(client, names, args.requests, seed=2)
            r = requests.post(
                f"{server.url}/scoring/xflow_uncertainty",
                json={
                    "images": names,
                    "max_images": len(names),
                    "max_clicks": 4,
                    "instruction": "segment all findings",
                },
                timeout=60,
            )
            r.raise_for_status()
            time.sleep(2.0)  # the subprocess starts and loads its models
            busy, running = [], 0
            for k in range(args.requests):
                running += scoring_running(server.url)
                busy += revise_round_trips(client, names, 1, seed=100 + k)
            results["revise_idle_p50_ms"] = round(1000 * float(np.median(idle)), 1)
            results["revise_while_scoring_p50_ms"] = round(1000 * float(np.median(busy)), 1)
            results["requests_measured_while_scoring_ran"] = f"{running}/{args.requests}"
            results["ratio_while_scoring_vs_idle"] = round(float(np.median(busy) / np.median(idle)), 2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
