"""Load (issue 34, item 5): eight simulated annotators against one server, scoring and a train run
in the background; the same server with one annotator first, so the ratios are of one run.

Each annotator does what the 3D Slicer module sends, in a loop: next sample
(``POST /activelearning/xflow_uncertainty``), auto-segmentation (``POST /infer/xflow``, Stage 1),
two clicks (``POST /infer/xflow_revise`` with a foreground click each), save
(``PUT /datastore/label``, a label of the image's size). Meanwhile a poller reads ``GET /info/``
every 0.5 s, a scoring run (``POST /scoring/xflow_uncertainty``) is started whenever none runs, and
a train run (``POST /train/xflow``) whenever none runs and labels exist.

Printed: errors (any answer but 200, or a connection failure; target 0), saves acknowledged and
kept (every image's label on disk is one of the label files acknowledged for it), click round trip
p50/p95 and ``/info/`` p50/p99 with one annotator and with eight, the ratios eight / one, the
resident memory of the server with its task subprocesses at the start and end of the
eight-annotator phase, and of the server process alone sampled through the phase (at its
quarters, its maximum, its growth overall and over the second half: growth that levels off is
warm-up, growth that does not is a leak).

Usage: ``nice -n 10 .venv/bin/python benchmarks/bench_load.py [--minutes 10] [--single-minutes 2]
[--annotators 8] [--images 8]``
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tempfile
import threading
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


def rss_mb(pid: int, children: bool = True) -> float:
    """Resident memory of ``pid`` (and its children, the task subprocesses), in MB."""
    total = 0
    pids = [pid]
    if not children:
        return _rss_kb(pid) / 1024.0
    for child in Path("/proc").iterdir():
        if child.name.isdigit():
            try:
                stat = (child / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid:  # parent pid
                    pids.append(int(child.name))
            except (OSError, IndexError, ValueError):
                pass
    for p in pids:
        total += _rss_kb(p)
    return total / 1024.0


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Stats:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.clicks: list[float] = []
        self.info: list[float] = []
        self.saves: dict[str, set[str]] = {}
        self.requests = 0

    def error(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)


def annotator(url: str, name: str, sizes: dict[str, tuple[int, int]], stop: threading.Event, stats: Stats, seed: int):
    rng = np.random.default_rng(seed)
    session = requests.Session()

    def call(method: str, path: str, **kw) -> requests.Response | None:
        try:
            r = session.request(method, f"{url}{path}", timeout=600, **kw)
        except requests.RequestException as exc:
            stats.error(f"{method} {path}: {type(exc).__name__}")
            return None
        with stats.lock:
            stats.requests += 1
        if r.status_code != 200:
            stats.error(f"{method} {path}: {r.status_code} {r.text[:200]}")
            return None
        return r

    while not stop.is_set():
        r = call("POST", "/activelearning/xflow_uncertainty", json={"client_id": name})
        image = (r.json() if r is not None else {}).get("id") or sorted(sizes)[int(rng.integers(len(sizes)))]
        if image not in sizes:
            stats.error(f"next sample answered unknown image {image!r}")
            continue
        call("POST", "/infer/xflow", params={"image": image}, data={"params": json.dumps({"revise": False})})
        h, w = sizes[image]
        for _ in range(2):
            click = [[int(rng.integers(w // 4, 3 * w // 4)), int(rng.integers(h // 4, 3 * h // 4)), 0]]
            start = time.perf_counter()
            r = call(
                "POST",
                "/infer/xflow_revise",
                params={"image": image},
                data={"params": json.dumps({"finding": "edema", "foreground": click})},
            )
            if r is not None:
                with stats.lock:
                    stats.clicks.append(time.perf_counter() - start)
        label = np.zeros((h, w), np.uint8)
        y, x = int(rng.integers(0, h - 200)), int(rng.integers(0, w - 200))
        label[y : y + 150, x : x + 150] = int(rng.integers(1, 8))
        buf = io.BytesIO()
        Image.fromarray(label).save(buf, format="PNG")
        data = buf.getvalue()
        r = call("PUT", "/datastore/label", params={"image": image, "tag": "final"}, files={"label": ("l.png", data)})
        if r is not None:
            with stats.lock:
                stats.saves.setdefault(image, set()).add(hashlib.sha256(data).hexdigest())


def background(url: str, stop: threading.Event, stats: Stats, counts: dict[str, int]):
    """/info/ every 0.5 s; scoring and train restarted whenever they are not running."""
    last_tasks = 0.0
    while not stop.is_set():
        start = time.perf_counter()
        try:
            r = requests.get(f"{url}/info/", timeout=60)
            ok = r.status_code == 200
        except requests.RequestException:
            ok = False
        if ok:
            with stats.lock:
                stats.info.append(time.perf_counter() - start)
        else:
            stats.error("GET /info/ failed")
        if time.monotonic() - last_tasks > 5:
            last_tasks = time.monotonic()
            for task, path, body in (
                ("scoring", "/scoring/xflow_uncertainty", {"max_images": 4}),
                ("train", "/train/xflow", {"steps": 3}),
            ):
                status = requests.get(f"{url}/{task}/", timeout=60)
                running = status.status_code == 200 and str(status.json().get("status", "")).upper() in (
                    "RUNNING",
                    "SUBMITTED",
                )
                if running or (task == "train" and not stats.saves):
                    continue
                r = requests.post(f"{url}{path}", json=body, timeout=60)
                if r.status_code == 200:
                    counts[task] += 1
                elif r.status_code != 429:  # 429: one just started between the two calls
                    stats.error(f"POST {path}: {r.status_code} {r.text[:200]}")
        time.sleep(max(0.0, 0.5 - (time.perf_counter() - start)))


def sample_rss(pid: int, stop: threading.Event, samples: list[float], every: float) -> None:
    """The server process's own resident memory (MB) every ``every`` seconds."""
    while not stop.wait(every):
        samples.append(rss_mb(pid, children=False))


def phase(url, sizes, annotators: int, seconds: float, seed: int, pid: int = 0, rss: list[float] | None = None):
    stats, stop = Stats(), threading.Event()
    counts = {"scoring": 0, "train": 0}
    threads = [threading.Thread(target=background, args=(url, stop, stats, counts))]
    if rss is not None:
        threads.append(threading.Thread(target=sample_rss, args=(pid, stop, rss, max(1.0, seconds / 20))))
    threads += [
        threading.Thread(target=annotator, args=(url, f"annotator{i}", sizes, stop, stats, seed + i))
        for i in range(annotators)
    ]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(900)
    return stats, counts


def pct(values: list[float], q: float) -> float:
    return round(1000 * float(np.percentile(values, q)), 1) if values else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="eight-annotator phase (default 10)")
    parser.add_argument("--single-minutes", type=float, default=2.0, help="one-annotator phase first (default 2)")
    parser.add_argument("--annotators", type=int, default=8)
    parser.add_argument("--images", type=int, default=8, help="1024 px studies (default 8)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(parser, minutes=0.2, single_minutes=0.15, images=2)

    tmp = Path(tempfile.mkdtemp(prefix="bench_load_"))
    results: dict = {}
    try:
        models = build_tiny_models(tmp / "models")
        with open(models, "a") as f:
            f.write("max_new_tokens: 24\n")
        studies = tmp / "studies"
        studies.mkdir()
        names = copy_nih_pngs(studies, args.images)
        sizes = {n: Image.open(studies / f"{n}.png").size[::-1] for n in names}
        with monailabel_server(studies, tmp / "server", conf={"models": str(models)}) as server:
            warm = requests.post(
                f"{server.url}/infer/xflow", params={"image": names[0]}, data={"params": "{}"}, timeout=600
            )
            warm.raise_for_status()
            one, _ = phase(server.url, sizes, 1, 60 * args.single_minutes, seed=1)
            rss_start = rss_mb(server.proc.pid)
            own = [rss_mb(server.proc.pid, children=False)]
            many, counts = phase(
                server.url, sizes, args.annotators, 60 * args.minutes, seed=100, pid=server.proc.pid, rss=own
            )
            rss_end = rss_mb(server.proc.pid)
            own.append(rss_mb(server.proc.pid, children=False))
            kept, lost = 0, []
            for image in {**one.saves, **many.saves}:
                all_acked = one.saves.get(image, set()) | many.saves.get(image, set())
                on_disk = studies / "labels" / "final" / f"{image}.png"
                if on_disk.is_file() and hashlib.sha256(on_disk.read_bytes()).hexdigest() in all_acked:
                    kept += 1
                else:
                    lost.append(image)
            alive = requests.get(f"{server.url}/info/", timeout=60).status_code == 200
        results = {
            "annotators": args.annotators,
            "minutes": args.minutes,
            "requests": one.requests + many.requests,
            "errors": len(one.errors) + len(many.errors),
            "first_errors": (one.errors + many.errors)[:5],
            "saves_acknowledged": sum(len(v) for v in one.saves.values()) + sum(len(v) for v in many.saves.values()),
            "images_saved": len({**one.saves, **many.saves}),
            "images_kept": kept,
            "images_lost": lost,
            "background_runs_started": counts,
            "click_p50_ms_one": pct(one.clicks, 50),
            "click_p95_ms_one": pct(one.clicks, 95),
            "click_p50_ms_many": pct(many.clicks, 50),
            "click_p95_ms_many": pct(many.clicks, 95),
            "click_p95_ratio_many_vs_one": round(pct(many.clicks, 95) / pct(one.clicks, 95), 2),
            "info_p50_ms_one": pct(one.info, 50),
            "info_p99_ms_one": pct(one.info, 99),
            "info_p50_ms_many": pct(many.info, 50),
            "info_p99_ms_many": pct(many.info, 99),
            "info_p99_ratio_many_vs_one": round(pct(many.info, 99) / pct(one.info, 99), 2),
            "clicks_many": len(many.clicks),
            "rss_mb_start": round(rss_start, 0),
            "rss_mb_end": round(rss_end, 0),
            "rss_growth_pct": round(100 * (rss_end - rss_start) / rss_start, 1),
            "server_rss_mb_quarters": [round(own[min(len(own) - 1, len(own) * q // 4)], 0) for q in range(5)],
            "server_rss_mb_max": round(max(own), 0),
            "server_rss_growth_pct": round(100 * (own[-1] - own[0]) / own[0], 1),
            "server_rss_growth_second_half_pct": round(100 * (own[-1] - own[len(own) // 2]) / own[len(own) // 2], 1),
            "server_alive_after": alive,
        }
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(results, indent=1))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0 if results.get("errors") == 0 and not results.get("images_lost") else 1


if __name__ == "__main__":
    sys.exit(main())
