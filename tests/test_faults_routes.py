"""Issue 34, item 1, against the real server: upstream routes' parameters checked and converted
before MONAI Label sees them, ``run_sync`` work off the event loop, deletes consistent with the
index (with MONAI Label's default file watcher on, as ``xflow serve`` runs it), bounded sessions and
slow bodies (``--conf max_sessions``, ``--conf body_timeout_s``), non-finite NIfTI scaling refused.

One MONAI Label server for the module (tiny random models, two real radiographs), stopped by pid.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from types import SimpleNamespace
from urllib.parse import urlparse

import numpy as np
import pytest
import requests
from servers import monailabel_server
from test_hostile_server import SQUARE, WIDE, hostile_setup, png_bytes

pytestmark = pytest.mark.timeout(900)

MAX_SESSIONS = 3
BODY_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def srv(tmp_path_factory, cxr_samples, tiny_models):
    tmp = tmp_path_factory.mktemp("faults")
    models, studies, _ = hostile_setup(tmp, cxr_samples, tiny_models, "unused.png")
    conf = {"models": str(models), "max_sessions": str(MAX_SESSIONS), "body_timeout_s": str(BODY_TIMEOUT_S)}
    env = {"MONAI_LABEL_DATASTORE_AUTO_RELOAD": "true"}  # MONAI Label's default, as `xflow serve` runs
    with monailabel_server(studies, tmp / "server", conf=conf, env=env) as server:
        yield SimpleNamespace(url=server.url, studies=studies, server=server, tmp=tmp)


def nifti_bytes(tmp, slope: float) -> bytes:
    from monailabel_xflow.transforms.loading import save_nifti_2d

    path = save_nifti_2d(np.random.default_rng(0).random((64, 64), dtype=np.float32), tmp / "scaled.nii")
    raw = bytearray(path.read_bytes())
    raw[112:116] = struct.pack("<f", slope)  # NIfTI-1 scl_slope
    return bytes(raw)


def batch(srv, params, run_sync=True, images="all"):
    return requests.post(
        f"{srv.url}/batch/infer/xflow",
        params={"run_sync": str(run_sync).lower(), "images": images},
        json=params,
        timeout=600,
    )


def test_batch_infer_values_are_converted_or_refused_with_the_reason(srv):
    for params, word in (
        ({"gpus": 5}, "gpus"),
        ({"gpus": "0,1"}, "gpus"),
        ({"max_batch_size": "many"}, "max_batch_size"),
        ({"max_batch_size": -1}, "max_batch_size"),
        ({"max_workers": 99}, "max_workers"),
        ({"device": "tpu"}, "device"),
        ({"logging": "LOUD"}, "logging"),
        ({"save_label": "maybe"}, "save_label"),
        ({"multi_gpu": [1]}, "multi_gpu"),
        ({"label_tag": "final"}, "final"),
        ({"label_tag": "../x"}, "label tag"),
    ):
        r = batch(srv, params)
        assert r.status_code in (400, 422), (params, r.status_code, r.text)
        assert word in r.json()["detail"], (params, r.text)
    # the same values as text are converted, not passed on as text (MONAI Label compares them)
    r = batch(srv, {"max_batch_size": "1", "max_workers": "1", "save_label": "true", "logging": "info"})
    assert r.status_code == 200, r.text
    saved = sorted(p.name for p in (srv.studies / "labels" / "original").iterdir() if not p.name.startswith("."))
    assert len(saved) == 1, saved  # max_batch_size 1 was read as the number 1


def test_info_answers_while_a_run_sync_task_holds_its_request(srv):
    """A run_sync batch infer over both images runs in a worker thread: /info/ (and a datastore
    read) are answered while the task's own request is still open."""
    done = threading.Event()
    result: dict = {}

    def run():
        result["r"] = batch(srv, {"label_tag": "sync_check", "max_workers": 1})
        done.set()

    t = threading.Thread(target=run)
    t.start()
    answered_during = 0
    try:
        time.sleep(0.3)
        while not done.is_set():
            info = requests.get(f"{srv.url}/info/", timeout=60)
            listing = requests.get(f"{srv.url}/datastore/", params={"output": "all"}, timeout=60)
            assert info.status_code == 200 and listing.status_code == 200
            if not done.is_set():
                answered_during += 1
            time.sleep(0.05)
    finally:
        t.join(600)
    assert result["r"].status_code == 200, result["r"].text
    assert answered_during >= 1, "no /info/ answer arrived while the run_sync task was running"


def index_ids(srv) -> set[str]:
    return set(json.loads((srv.studies / "datastore_v2.json").read_text())["objects"])


def test_delete_leaves_neither_file_nor_index_entry(srv):
    png = (srv.studies / f"{SQUARE}.png").read_bytes()
    for image_id in ("datastore_v2.json", "plain_upload"):
        r = requests.put(
            f"{srv.url}/datastore/image", params={"image": image_id}, files={"file": ("x.png", png)}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert image_id in index_ids(srv)
        label = np.zeros((384, 384), np.uint8)
        label[10:50, 10:50] = 2
        r = requests.put(
            f"{srv.url}/datastore/label",
            params={"image": image_id, "tag": "final"},
            files={"label": ("l.png", png_bytes(label))},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        r = requests.delete(f"{srv.url}/datastore/image", params={"id": image_id}, timeout=60)
        assert r.status_code == 200, r.text
        # at once, not after a file-watcher event
        assert image_id not in index_ids(srv)
        listing = requests.get(f"{srv.url}/datastore/", params={"output": "all"}, timeout=60).json()
        assert image_id not in listing["objects"]
        assert not (srv.studies / f"{image_id}.png").exists()
        assert not (srv.studies / "labels" / "final" / f"{image_id}.png").exists()
        assert requests.delete(f"{srv.url}/datastore/image", params={"id": image_id}, timeout=60).status_code == 404
    assert (srv.studies / "datastore_v2.json").is_file() and WIDE in index_ids(srv)


def test_sessions_are_bounded_by_conf(srv):
    png = (srv.studies / f"{SQUARE}.png").read_bytes()
    made = []
    for _ in range(MAX_SESSIONS):
        r = requests.put(f"{srv.url}/session/", files={"files": ("a.png", png)}, timeout=60)
        assert r.status_code == 200, r.text
        made.append(r.json()["session_id"])
    r = requests.put(f"{srv.url}/session/", files={"files": ("a.png", png)}, timeout=60)
    assert r.status_code == 429 and "max_sessions" in r.json()["detail"], r.text
    assert requests.delete(f"{srv.url}/session/{made.pop()}", timeout=60).status_code == 200
    r = requests.put(f"{srv.url}/session/", files={"files": ("a.png", png)}, timeout=60)
    assert r.status_code == 200, r.text
    for sid in [*made, r.json()["session_id"]]:
        requests.delete(f"{srv.url}/session/{sid}", timeout=60)


def test_a_slow_body_is_cut_off_and_others_are_served(srv):
    u = urlparse(srv.url)
    socks = []
    for _ in range(4):
        s = socket.create_connection((u.hostname, u.port), timeout=60)
        s.sendall(
            b"PUT /datastore/image?image=slow HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n--b\r\n"
        )
        socks.append(s)
    assert requests.get(f"{srv.url}/info/", timeout=60).status_code == 200  # served meanwhile
    for s in socks:
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b"body_timeout_s" in answer + s.recv(4096)
        s.close()
    assert "slow" not in index_ids(srv)


def test_non_finite_nifti_scaling_is_refused(srv):
    bad = nifti_bytes(srv.tmp, float("inf"))
    r = requests.put(
        f"{srv.url}/datastore/image", params={"image": "inf_scaled"}, files={"file": ("a.nii", bad)}, timeout=60
    )
    assert r.status_code == 422 and "scl_slope" in r.json()["detail"], r.text
    r = requests.post(
        f"{srv.url}/infer/xflow", files={"file": ("a.nii", bad)}, data={"params": json.dumps({})}, timeout=600
    )
    assert r.status_code == 422 and "scl_slope" in r.json()["detail"], r.text
    good = nifti_bytes(srv.tmp, 1.0)
    r = requests.put(
        f"{srv.url}/datastore/image", params={"image": "scaled_ok"}, files={"file": ("a.nii", good)}, timeout=60
    )
    assert r.status_code == 200, r.text
    assert requests.delete(f"{srv.url}/datastore/image", params={"id": "scaled_ok"}, timeout=60).status_code == 200
