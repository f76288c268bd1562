"""MONAI Label server with the XFlow app: start time, per-request overhead, concurrent throughput.

Starts the real server (``tests/servers.py``) with random tiny models on a studies folder of
real 1024 x 1024 NIH PNGs and measures, through MONAI Label's Python client:

* **start**: seconds from process start until ``/info/`` answers;
* **overhead** of the app around the models, per request: client round trip minus the model
  time the task reports (``latencies.infer``: XFlow / F_seg calls), for ``xflow_revise``
  (clicks; one mask decode) and ``xflow`` (one instruction, Stage 1 only). It covers HTTP,
  multipart, MONAI Label's plumbing, loading the PNG, writing the label, the JSON (p50/p95;
  target p50 <= 100 ms);
* **throughput** of ``xflow_revise`` with 1 and 8 concurrent clients on different images.

Usage: ``.venv/bin/python benchmarks/bench_server.py [--requests 30] [--images 8] [--json OUT]``
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from common import parse_args  # noqa: E402
from radiographs import copy_nih_pngs  # noqa: E402
from servers import build_tiny_models, monailabel_server  # noqa: E402


def timed_infer(client, model, image_id, params):
    start = time.perf_counter()
    _, out = client.infer(model, image_id, params)
    wall = time.perf_counter() - start
    return wall, float(out["latencies"]["infer"]), float(out["latencies"]["total"])


def percentiles(values):
    a = np.asarray(values) * 1000.0
    return {
        "p50_ms": round(float(np.percentile(a, 50)), 1),
        "p95_ms": round(float(np.percentile(a, 95)), 1),
        "mean_ms": round(float(a.mean()), 1),
        "n": int(a.size),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=30, help="timed xflow_revise requests (default 30)")
    parser.add_argument("--instructions", type=int, default=5, help="timed xflow requests (default 5)")
    parser.add_argument("--images", type=int, default=8, help="images in the studies folder (default 8)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, requests=2, instructions=1, images=2)

    tmp = Path(tempfile.mkdtemp(prefix="bench_server_"))
    try:
        models = build_tiny_models(tmp / "models")
        studies = tmp / "studies"
        studies.mkdir()
        names = copy_nih_pngs(studies, args.images)
        with monailabel_server(studies, tmp / "server", conf={"models": str(models)}) as server:
            results = {"start_s": round(server.start_seconds, 2)}
            print(f"server ready in {server.start_seconds:.1f} s", flush=True)
            client = server.client(tmp)
            for name in names:  # warm: first touch of each image encodes it (cached afterwards)
                client.infer("xflow_revise", name, {"finding": "edema", "foreground": [[500, 500, 0]]})

            rng = np.random.default_rng(0)
            revise = []
            for k in range(args.requests):
                fg = [[int(v) for v in rng.integers(100, 900, 2)] + [0]]
                revise.append(
                    timed_infer(client, "xflow_revise", names[k % len(names)], {"finding": "edema", "foreground": fg})
                )
            results["xflow_revise_overhead"] = percentiles([w - m for w, m, _ in revise])
            results["xflow_revise_round_trip"] = percentiles([w for w, _, _ in revise])
            results["xflow_revise_model"] = percentiles([m for _, m, _ in revise])

            instr = [
                timed_infer(
                    client,
                    "xflow",
                    names[k % len(names)],
                    {"instruction": "Segment the effusion in the left lung.", "revise": False, "trace": False},
                )
                for k in range(args.instructions)
            ]
            results["xflow_overhead"] = percentiles([w - m for w, m, _ in instr])
            results["xflow_model"] = percentiles([m for _, m, _ in instr])

            for clients in (1, 8):
                per_client = max(2, args.requests // clients)
                errors = []

                def work(c, per_client=per_client, errors=errors):
                    mine = server.client(tmp)
                    for k in range(per_client):
                        try:
                            mine.infer(
                                "xflow_revise",
                                names[(c + k) % len(names)],
                                {"finding": "edema", "foreground": [[300 + 40 * c, 300 + 20 * k, 0]]},
                            )
                        except Exception as exc:  # noqa: BLE001 - counted and reported
                            errors.append(repr(exc))

                threads = [threading.Thread(target=work, args=(c,)) for c in range(clients)]
                start = time.perf_counter()
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - start
                done = clients * per_client - len(errors)
                results[f"throughput_{clients}_clients"] = {
                    "requests": done,
                    "errors": len(errors),
                    "seconds": round(wall, 2),
                    "req_per_s": round(done / wall, 2),
                }
            one, eight = results["throughput_1_clients"], results["throughput_8_clients"]
            results["throughput_ratio_8_vs_1"] = round(eight["req_per_s"] / one["req_per_s"], 2)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(json.dumps(results, indent=1))
    ov = results["xflow_revise_overhead"]["p50_ms"]
    print(f"app overhead p50 {ov:.1f} ms (target <= 100 ms): {'OK' if ov <= 100 else 'ABOVE TARGET'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
