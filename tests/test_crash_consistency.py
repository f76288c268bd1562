"""Issue 34, item 2: SIGKILL at random moments loses nothing acknowledged and never leaves a half
file, an unloadable index or half a model.

Two levels, both with real processes killed by ``SIGKILL`` at seeded random moments:

* the writers themselves (:mod:`monailabel_xflow.files`): a child process rewrites an index-like
  JSON file and promotes model-like folders in a loop, acknowledging each write on stdout; 60 kills,
  each followed by the start-up recovery and the checks (the last acknowledged version or a newer
  one, whole; no temporary file left);
* the real MONAI Label server with the XFlow app: killed (its whole process group, so the scoring
  and train subprocesses too) during label saves, during a scoring run (which rewrites the index
  from its subprocess while labels are saved) and during a train run (promotion), then restarted
  on the same studies and model folders and checked: it starts, the datastore loads and lists every
  image, every label acknowledged before the kill is on disk byte for byte (or the one in flight at
  the kill, whole), no temporary file is listed or left, the serving segmenter is whole. The
  default suite runs :data:`QUICK_SERVER_KILLS` cycles; ``-m slow`` runs :data:`FULL_SERVER_KILLS`.
  A damaged index (truncated, as upstream's in-place write could leave it) is recovered at start;
* the server on a PACS (a real Orthanc kept running, ``--studies`` its DICOMweb URL, the test
  CR/DX series) killed during SEG stores: a client saves ``final`` labels (each stored as a DICOM
  SEG over STOW, then cached), the server is killed at a random moment, restarted on the same PACS
  and cache, and checked: it starts, the datastore loads (``output=all`` and ``datalist()``), every
  acknowledged label is a SEG of its image in the PACS reading back equal (each save one SEG: none
  lost, none stored twice, the only extra ones sent and not acknowledged), each image's current
  label (the datastore's newest label SEG) is the last acknowledged one or one sent after it, the
  server answers ``GET /datastore/label`` with that one (before and after ``datalist()``), no
  temporary file is in its workspace or cache. :data:`QUICK_SEG_KILLS` in the default suite,
  :data:`FULL_SEG_KILLS` per seed (two) with ``-m slow``. A SEG stored but not cached (what a kill
  between the two leaves) is made on purpose once, deterministically.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pydicom
import pytest
import requests
from servers import REPO, monailabel_server, orthanc_binary, orthanc_server, orthanc_upload
from test_hostile_server import SQUARE, WIDE, hostile_setup, png_bytes

from monailabel_xflow.files import TEMP_MARK, recover_dir, remove_temps

pytestmark = pytest.mark.timeout(3600)

HELPER_KILLS = 60
QUICK_SERVER_KILLS = 3
FULL_SERVER_KILLS = 51


# --- 1. the writers, killed 60 times ------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    from monailabel_xflow.files import atomic_write_json, swap_dir, temp_name
    root = Path(sys.argv[1]); start = int(sys.argv[2])
    for n in range(start, start + 100000):
        atomic_write_json(root / "index.json", {"n": n, "pad": "x" * 50000})
        new = temp_name(root / "model")
        new.mkdir()
        (new / "weights.bin").write_bytes(bytes([n % 251]) * 300000)
        (new / "config.json").write_text(json.dumps({"n": n}))
        swap_dir(new, root / "model")
        print(n, flush=True)
    """
)


def test_atomic_writes_and_model_swaps_survive_sigkill(tmp_path):
    rng = random.Random(34)
    acked = -1
    for kill in range(HELPER_KILLS):
        # the start-up recovery, then the checks
        removed = remove_temps(tmp_path)
        recover_dir(tmp_path / "model")
        assert not [p for p in tmp_path.rglob("*") if TEMP_MARK in p.name], (kill, removed)
        if acked >= 0:
            index = json.loads((tmp_path / "index.json").read_text())
            assert index["n"] >= acked and index["pad"] == "x" * 50000
            model = tmp_path / "model"
            n = json.loads((model / "config.json").read_text())["n"]
            assert n >= acked
            assert (model / "weights.bin").read_bytes() == bytes([n % 251]) * 300000, "a model of two versions"
            assert not (tmp_path / "model.old").exists()
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), str(acked + 1)],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        lines: list[int] = []
        reader = threading.Thread(target=lambda p=proc, out=lines: out.extend(int(x) for x in p.stdout))
        reader.start()
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:  # let it get going, then kill at a random moment
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        reader.join(30)
        assert lines, "the writer acknowledged nothing"
        acked = lines[-1]
    assert acked > HELPER_KILLS


# --- 2. the server, killed during label saves, scoring and training -------------------------------


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LabelClient:
    """Saves labels in a loop until stopped; keeps, per image, what may be on disk: the last
    acknowledged content plus every content sent after it and not acknowledged (in flight at the
    kill, or timed out on the client while the server went on), carried over across restarts."""

    def __init__(
        self,
        url: str,
        images: dict[str, tuple[int, int]],
        rng: random.Random,
        acked: dict[str, str],
        possible: dict[str, set[str]],
    ):
        self.url, self.images, self.rng = url, images, rng
        self.acked = acked
        self.possible = possible
        self.stop = threading.Event()
        self.saves = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            image = self.rng.choice(sorted(self.images))
            h, w = self.images[image]
            label = np.zeros((h, w), np.uint8)
            y, x = self.rng.randrange(0, h - 60), self.rng.randrange(0, w - 60)
            label[y : y + 50, x : x + 50] = self.rng.randrange(1, 8)
            data = png_bytes(label)
            self.possible.setdefault(image, set()).add(sha(data))
            try:
                r = requests.put(
                    f"{self.url}/datastore/label",
                    params={"image": image, "tag": "final"},
                    files={"label": ("l.png", data)},
                    timeout=300,
                )
            except requests.RequestException:
                return  # the server was killed
            if r.status_code == 200:
                self.acked[image] = sha(data)
                self.possible[image] = {sha(data)}
                self.saves += 1


def check_after_restart(url: str, studies: Path, model_dir: Path, acked: dict[str, str], possible: dict[str, set[str]]):
    listing = requests.get(f"{url}/datastore/", params={"output": "all"}, timeout=60)
    assert listing.status_code == 200, listing.text
    objects = listing.json()["objects"]
    assert {WIDE, SQUARE} <= set(objects)
    text = json.dumps(objects)
    assert TEMP_MARK not in text and ".damaged" not in text
    assert not [p for p in studies.rglob("*") if TEMP_MARK in p.name]
    for image, digest in acked.items():
        path = studies / "labels" / "final" / f"{image}.png"
        got = sha(path.read_bytes())
        assert got in possible[image] | {digest}, f"label of {image} is neither the acknowledged one nor a later one"
        assert "final" in objects[image]["labels"]
        r = requests.get(f"{url}/datastore/label", params={"label": image, "tag": "final"}, timeout=60)
        assert r.status_code == 200 and sha(r.content) == got
    serving = model_dir / "xflow_segmenter"
    assert not [p for p in model_dir.glob("*") if TEMP_MARK in p.name]
    if serving.exists():
        from safetensors import safe_open

        json.loads((serving / "config.json").read_text())
        weights = sorted(serving.glob("*.safetensors"))
        assert weights, "a serving segmenter without weights"
        for w in weights:
            with safe_open(str(w), "pt") as f:
                for key in list(f.keys())[:3]:
                    f.get_tensor(key)


def run_server_kills(tmp: Path, cxr_samples, tiny_models, kills: int, seed: int = 34) -> dict:
    rng = random.Random(seed)
    models, studies, _ = hostile_setup(tmp, cxr_samples, tiny_models, "unused.png")
    images = {WIDE: (400, 512), SQUARE: (384, 384)}
    model_dir = tmp / "server" / "model"
    acked: dict[str, str] = {}
    possible: dict[str, set[str]] = {}
    modes = ["label", "scoring", "train"]
    stats = {"kills": 0, "saves": 0, "by_mode": {m: 0 for m in modes}, "restart_s": []}
    conf = {"models": str(models), "model_dir": str(model_dir)}
    for cycle in range(kills + 1):
        with monailabel_server(studies, tmp / "server", conf=conf) as server:
            stats["restart_s"].append(round(server.start_seconds, 1))
            check_after_restart(server.url, studies, model_dir, acked, possible)
            if cycle == kills:
                break
            mode = modes[cycle % len(modes)]
            client = LabelClient(server.url, images, rng, acked, possible)
            if mode == "label":
                client.thread.start()
                time.sleep(rng.uniform(0.3, 4.0))
            elif mode == "scoring":
                r = requests.post(f"{server.url}/scoring/xflow_uncertainty", json={"max_images": 2}, timeout=60)
                assert r.status_code == 200, r.text
                client.thread.start()
                time.sleep(rng.uniform(1.0, 12.0))
            else:
                if len(acked) < 2:  # training needs final labels on two images
                    client.thread.start()
                    while len(acked) < 2:
                        time.sleep(0.1)
                r = requests.post(f"{server.url}/train/xflow", json={"steps": 2}, timeout=60)
                assert r.status_code == 200, r.text
                time.sleep(rng.uniform(1.0, 30.0))
            os.killpg(server.proc.pid, signal.SIGKILL)
            client.stop.set()
            if client.thread.ident:
                client.thread.join(60)
            stats["kills"] += 1
            stats["saves"] += client.saves
            stats["by_mode"][mode] += 1
            print(f"kill {cycle + 1}/{kills} during {mode}: {client.saves} saves acknowledged", flush=True)
    return stats


def test_server_killed_during_writes_loses_nothing_acknowledged(tmp_path, cxr_samples, tiny_models):
    stats = run_server_kills(tmp_path, cxr_samples, tiny_models, QUICK_SERVER_KILLS)
    print("server kills:", stats)
    assert stats["kills"] == QUICK_SERVER_KILLS and stats["saves"] > 0


@pytest.mark.slow
def test_server_killed_51_times_loses_nothing_acknowledged(tmp_path, cxr_samples, tiny_models):
    stats = run_server_kills(tmp_path, cxr_samples, tiny_models, FULL_SERVER_KILLS)
    print("server kills:", stats)
    assert stats["kills"] == FULL_SERVER_KILLS and stats["saves"] > 0


def test_a_damaged_index_is_rebuilt_from_the_files_at_start(tmp_path, cxr_samples, tiny_models):
    models, studies, _ = hostile_setup(tmp_path, cxr_samples, tiny_models, "unused.png")
    label = np.zeros((400, 512), np.uint8)
    label[100:200, 100:200] = 3
    (studies / "labels" / "final").mkdir(parents=True)
    (studies / "labels" / "final" / f"{WIDE}.png").write_bytes(png_bytes(label))
    (studies / "datastore_v2.json").write_text('{"name": "new-dataset", "objects": {"' + WIDE + '": {"ima')
    with monailabel_server(studies, tmp_path / "server", conf={"models": str(models)}) as server:
        objects = requests.get(f"{server.url}/datastore/", params={"output": "all"}, timeout=60).json()["objects"]
        assert {WIDE, SQUARE} <= set(objects) and "final" in objects[WIDE]["labels"]
        log = server.proc.tail(200_000)
    assert "datastore_v2.json was damaged" in log and "rebuilt from the files on disk: 2 images, 1 labels" in log
    aside = list(studies.glob("datastore_v2.json.damaged-*"))
    assert len(aside) == 1 and aside[0].read_text().endswith('"ima')
    json.loads((studies / "datastore_v2.json").read_text())


# --- 3. the server on a PACS, killed during SEG stores --------------------------------------------

QUICK_SEG_KILLS = 2
FULL_SEG_KILLS = 12
SEG_SOURCES = ("cr.dcm", "cr_monochrome1.dcm", "dx.dcm")
NEEDS_ORTHANC = pytest.mark.skipif(
    orthanc_binary() is None, reason="Orthanc is not installed (apt-get install -y orthanc orthanc-dicomweb)"
)


class SegLabelClient:
    """Saves ``final`` labels of the PACS's series through the server in a loop until stopped, as
    MONAI Label's client and the Slicer module do (``PUT /datastore/label?image=<series>&tag=final``,
    one square of a random finding per label). Shared across restarts, per image: ``acked`` every
    acknowledged label's content hash in order, ``unacked`` every label sent and not acknowledged,
    ``possible`` what may be its current label (the last acknowledged one plus any sent after it)."""

    def __init__(self, url: str, images: dict[str, tuple[int, int]], rng: random.Random, state: dict):
        self.url, self.images, self.rng = url, images, rng
        self.acked: dict[str, list[str]] = state["acked"]
        self.unacked: dict[str, list[str]] = state["unacked"]
        self.possible: dict[str, set[str]] = state["possible"]
        self.stop = threading.Event()
        self.saves = 0
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.is_set():
            image = self.rng.choice(sorted(self.images))
            h, w = self.images[image]
            label = np.zeros((h, w), np.uint8)
            y, x = self.rng.randrange(0, h - 90), self.rng.randrange(0, w - 90)
            label[y : y + self.rng.randrange(20, 90), x : x + self.rng.randrange(20, 90)] = self.rng.randrange(1, 8)
            digest = sha(label.tobytes())
            self.possible.setdefault(image, set()).add(digest)
            try:
                r = requests.put(
                    f"{self.url}/datastore/label",
                    params={"image": image, "tag": "final"},
                    files={"label": ("label.png", png_bytes(label))},
                    timeout=300,
                )
            except requests.RequestException:
                self.unacked.setdefault(image, []).append(digest)
                return  # the server was killed
            if r.status_code != 200:  # not acknowledged; the test fails on it
                self.errors.append(f"{r.status_code}: {r.text[:500]}")
                self.unacked.setdefault(image, []).append(digest)
                return
            self.acked.setdefault(image, []).append(digest)
            self.possible[image] = {digest}
            self.saves += 1


def label_segs(orthanc: str) -> dict[str, list[tuple[str, str]]]:
    """Every label SEG in the PACS (not XFlow's pre-annotations), read back from Orthanc:
    ``{referenced image series: [(SEG series, content hash of its label map), ...]}``."""
    from monailabel_xflow.data.seg import PREANNOTATION_CONTENT_LABEL, read_seg

    out: dict[str, list[tuple[str, str]]] = {}
    for sid in requests.get(f"{orthanc}/series", timeout=60).json():
        info = requests.get(f"{orthanc}/series/{sid}", timeout=60).json()
        if info["MainDicomTags"].get("Modality") != "SEG":
            continue
        assert len(info["Instances"]) == 1, f"SEG series {sid} holds {len(info['Instances'])} instances"
        raw = requests.get(f"{orthanc}/instances/{info['Instances'][0]}/file", timeout=60).content
        ds = pydicom.dcmread(io.BytesIO(raw))
        if str(getattr(ds, "ContentLabel", "")) == PREANNOTATION_CONTENT_LABEL:
            continue
        image = str(ds.ReferencedSeriesSequence[0].SeriesInstanceUID)
        out.setdefault(image, []).append((str(ds.SeriesInstanceUID), sha(read_seg(ds).tobytes())))
    return out


def served_label(url: str, image: str, folder: Path) -> str:
    """The content hash of the final label the server answers ``GET /datastore/label`` with."""
    from monailabel_xflow.transforms.labels import read_label

    r = requests.get(f"{url}/datastore/label", params={"label": image, "tag": "final"}, timeout=60)
    assert r.status_code == 200, r.text
    served = folder / "served.nii.gz"
    served.write_bytes(r.content)
    try:
        return sha(read_label(str(served)).tobytes())
    finally:
        served.unlink()


def check_segs_after_restart(url: str, orthanc: str, server_tmp: Path, state: dict) -> int:
    """The checks after a restart on the PACS (see the module docstring). Returns the label SEGs read."""
    from monailabel_xflow.app.datastore import make_dicomweb_datastore

    acked, unacked, possible = state["acked"], state["unacked"], state["possible"]
    listing = requests.get(f"{url}/datastore/", params={"output": "all"}, timeout=60)
    assert listing.status_code == 200, listing.text
    assert TEMP_MARK not in listing.text and ".damaged" not in listing.text
    assert not [p for p in server_tmp.rglob("*") if TEMP_MARK in p.name]
    segs = label_segs(orthanc)
    assert set(segs) <= set(possible), "a label SEG of an image nobody labelled"
    for image, found in segs.items():
        stored = Counter(digest for _, digest in found)
        missing = Counter(acked.get(image, [])) - stored
        assert not missing, f"{image}: {sum(missing.values())} acknowledged labels are not in the PACS"
        extra = stored - Counter(acked.get(image, []))
        assert not extra - Counter(unacked.get(image, [])), f"{image}: a SEG stored twice or never sent: {extra}"
    assert all(image in segs for image in acked), "an image with acknowledged labels has no SEG"
    # the current label, as the datastore picks it (the newest label SEG), is the last acknowledged
    # one or one sent after it; the server answers with it (from its cache, refreshed by datalist())
    current = make_dicomweb_datastore(f"{orthanc}/dicom-web", cache_path=str(server_tmp / "check-cache")).label_series()
    by_uid = {uid: digest for found in segs.values() for uid, digest in found}
    assert set(current) == set(segs)
    for image, uid in current.items():
        assert by_uid[uid] in possible[image], (
            f"{image}: its current label is neither the acknowledged one nor a later one"
        )
    for image, uid in current.items():  # before datalist() refreshes the cache
        assert served_label(url, image, server_tmp) == by_uid[uid], f"{image}: the server serves an older label"
    train = requests.get(f"{url}/datastore/", params={"output": "train"}, timeout=300)
    assert train.status_code == 200, train.text
    labelled = {Path(d["image"]).name.split(".nii")[0]: d["label"] for d in train.json() if d.get("label")}
    assert set(labelled) >= set(current), (sorted(labelled), sorted(current))
    for image, uid in current.items():
        assert served_label(url, image, server_tmp) == by_uid[uid], f"{image}: the server serves another label"
    return sum(len(found) for found in segs.values())


def run_seg_kills(tmp: Path, cxr_samples, tiny_models, kills: int, seed: int = 34) -> dict:
    """Orthanc (kept running) with the test CR/DX series; the server on its DICOMweb URL, killed
    ``kills`` times while a client saves final labels, restarted on the same PACS and folders."""
    rng = random.Random(seed)
    models = tiny_models(tmp / "models")
    with open(models, "a") as f:
        f.write("max_new_tokens: 24\n")
    state: dict = {"acked": {}, "unacked": {}, "possible": {}}
    stats = {"kills": 0, "saves": 0, "segs_checked": 0, "restart_s": []}
    server_tmp = tmp / "server"
    system_tmp = server_tmp / "tmp"  # the server's TMPDIR: what a kill leaves there is counted
    system_tmp.mkdir(parents=True)
    with orthanc_server(tmp / "orthanc") as orthanc:
        images = {}
        for name in SEG_SOURCES:
            path = cxr_samples / "dicom" / name
            orthanc_upload(orthanc, path)
            ds = pydicom.dcmread(path, stop_before_pixels=True)
            images[str(ds.SeriesInstanceUID)] = (int(ds.Rows), int(ds.Columns))
        conf = {"models": str(models)}
        for cycle in range(kills + 1):
            with monailabel_server(
                f"{orthanc}/dicom-web", server_tmp, conf=conf, env={"TMPDIR": str(system_tmp)}
            ) as server:
                stats["restart_s"].append(round(server.start_seconds, 1))
                stats["segs_checked"] += check_segs_after_restart(server.url, orthanc, server_tmp, state)
                if cycle == kills:
                    break
                client = SegLabelClient(server.url, images, random.Random(rng.random()), state)
                client.thread.start()
                deadline = time.monotonic() + 300
                while client.saves == 0 and client.thread.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert client.saves and not client.errors, f"{client.errors}\n{server.proc.tail()}"
                time.sleep(rng.uniform(0.0, 4.0))  # then the kill, at a random moment of the saves
                os.killpg(server.proc.pid, signal.SIGKILL)
                client.stop.set()
                client.thread.join(60)
                assert not client.errors, client.errors
                stats["kills"] += 1
                stats["saves"] += client.saves
                print(f"SEG kill {cycle + 1}/{kills}: {client.saves} saves acknowledged", flush=True)
        stats["segs_in_pacs"] = sum(len(found) for found in label_segs(orthanc).values())
        stats["uploads_left_in_tmpdir"] = len(list(system_tmp.glob("xflow-upload-*")))
    return stats


@NEEDS_ORTHANC
def test_a_seg_stored_but_not_cached_is_the_label_served(tmp_path, cxr_samples, tiny_models):
    """What a kill between the SEG store and the cache write leaves, made on purpose: the PACS's
    newest label SEG is newer than the server's cached label. The server answers with the PACS's."""
    from monailabel_xflow.data.seg import LABEL_CONTENT_LABEL, write_seg

    models = tiny_models(tmp_path / "models")
    source = cxr_samples / "dicom" / "cr.dcm"
    ds = pydicom.dcmread(source, stop_before_pixels=True)
    image, shape = str(ds.SeriesInstanceUID), (int(ds.Rows), int(ds.Columns))
    saved, stored = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)
    saved[100:200, 100:200], stored[300:400, 200:300] = 2, 5
    with orthanc_server(tmp_path / "orthanc") as orthanc:
        orthanc_upload(orthanc, source)
        with monailabel_server(f"{orthanc}/dicom-web", tmp_path / "server", conf={"models": str(models)}) as server:
            r = requests.put(
                f"{server.url}/datastore/label",
                params={"image": image, "tag": "final"},
                files={"label": ("label.png", png_bytes(saved))},
                timeout=300,
            )
            assert r.status_code == 200, r.text
            assert served_label(server.url, image, tmp_path) == sha(saved.tobytes())
            seg = write_seg(stored, source)
            seg.ContentLabel = LABEL_CONTENT_LABEL
            seg.save_as(str(tmp_path / "seg.dcm"))
            orthanc_upload(orthanc, tmp_path / "seg.dcm")
            time.sleep(1.5)  # MONAI_LABEL_DICOMWEB_CACHE_EXPIRY=1 in the tests
            assert served_label(server.url, image, tmp_path) == sha(stored.tobytes())


@NEEDS_ORTHANC
def test_server_on_a_pacs_killed_during_seg_stores_loses_nothing_acknowledged(tmp_path, cxr_samples, tiny_models):
    stats = run_seg_kills(tmp_path, cxr_samples, tiny_models, QUICK_SEG_KILLS)
    print("SEG store kills:", stats)
    assert stats["kills"] == QUICK_SEG_KILLS and stats["saves"] >= QUICK_SEG_KILLS and stats["segs_checked"] > 0


@pytest.mark.slow
@NEEDS_ORTHANC
@pytest.mark.parametrize("seed", [34, 35])
def test_server_on_a_pacs_killed_many_times_during_seg_stores(tmp_path, cxr_samples, tiny_models, seed):
    stats = run_seg_kills(tmp_path, cxr_samples, tiny_models, FULL_SEG_KILLS, seed=seed)
    print("SEG store kills:", stats)
    assert stats["kills"] == FULL_SEG_KILLS and stats["saves"] >= FULL_SEG_KILLS and stats["segs_checked"] > 0
