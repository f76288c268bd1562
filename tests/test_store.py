"""The workspace store (``segmenter/store.py``): atomic, checked, bounded, shared by processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from monailabel_xflow.segmenter.store import (
    HEADER,
    ResultStore,
    StoreError,
    configure_from_conf,
    configure_store,
    default_store,
    digest,
    pack,
    unpack,
)

NS = "ab" * 16
REPO = Path(__file__).resolve().parents[1]


def key(i: int) -> str:
    return digest("entry", i)


def test_round_trip_leaves_no_temporary_file(tmp_path):
    store = ResultStore(tmp_path, 1 << 20)
    assert store.get(NS, "emb", key(0)) is None
    assert store.put(NS, "emb", key(0), b"payload")
    assert store.get(NS, "emb", key(0)) == b"payload"
    assert store.has(NS, "emb", key(0)) and not store.has(NS, "ans", key(0))
    assert not [p for p in tmp_path.rglob(".tmp-*")]


def test_truncated_or_corrupt_entries_are_ignored_removed_and_never_served(tmp_path):
    store = ResultStore(tmp_path, 1 << 20)
    payload = os.urandom(5000)
    for i, damage in enumerate(("truncate", "flip", "header", "empty")):
        store.put(NS, "ans", key(i), payload)
        path = store.path(NS, "ans", key(i))
        data = path.read_bytes()
        if damage == "truncate":
            data = data[:-100]
        elif damage == "flip":
            data = data[:-1] + bytes([data[-1] ^ 1])
        elif damage == "header":
            data = b"Y" + data[1:]
        else:
            data = b""
        path.write_bytes(data)
        assert store.get(NS, "ans", key(i)) is None, damage
        assert not path.exists(), damage  # removed: the next put writes it again
        store.put(NS, "ans", key(i), payload)
        assert store.get(NS, "ans", key(i)) == payload
    assert store.corrupt == 4


def test_least_recently_used_entries_go_first_within_the_bound(tmp_path):
    store = ResultStore(tmp_path, 1 << 20)
    blob = b"x" * (300 << 10)  # four of them exceed 1 MiB
    for i in range(3):
        store.put(NS, "emb", key(i), blob)
        time.sleep(0.02)
    time.sleep(0.02)
    assert store.get(NS, "emb", key(0)) == blob  # used: now the most recent
    store.put(NS, "emb", key(3), blob)
    assert store.usage() <= store.max_bytes
    assert store.has(NS, "emb", key(0)) and store.has(NS, "emb", key(3))
    assert not store.has(NS, "emb", key(1))  # the least recently used went
    assert not store.put(NS, "emb", key(9), b"y" * (2 << 20))  # larger than the whole bound


def test_wipe_removes_one_namespace_only(tmp_path):
    store = ResultStore(tmp_path, 1 << 20)
    other = "cd" * 16
    store.put(NS, "emb", key(0), b"a")
    store.put(NS, "ans", key(1), b"b")
    store.put(other, "emb", key(0), b"c")
    assert store.wipe(NS) > 0
    assert store.get(NS, "emb", key(0)) is None and store.get(NS, "ans", key(1)) is None
    assert store.get(other, "emb", key(0)) == b"c"
    assert store.namespaces() == [other]
    assert store.wipe(NS) == 0


def test_names_that_could_be_paths_are_refused(tmp_path):
    store = ResultStore(tmp_path, 1 << 20)
    for ns, kind, k in [("../x", "emb", key(0)), (NS, "other", key(0)), (NS, "emb", "../../etc"), (NS, "emb", "AB")]:
        with pytest.raises(StoreError):
            store.put(ns, kind, k, b"x")
    with pytest.raises(ValueError):
        ResultStore(tmp_path, 1000)


def test_a_write_that_fails_is_dropped_not_raised(tmp_path):
    store = ResultStore(tmp_path, 1 << 20)
    (tmp_path / NS).write_text("a file where the namespace folder should be")
    assert store.put(NS, "emb", key(0), b"x") is False
    assert store.get(NS, "emb", key(0)) is None


def test_pack_round_trips_arrays_and_meta_without_pickle():
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([True, False])}
    got, meta = unpack(pack(arrays, {"levels": 2, "name": "x"}))
    assert meta == {"levels": 2, "name": "x"}
    assert set(got) == {"a", "b"} and (got["a"] == arrays["a"]).all() and got["a"].dtype == np.float32
    with pytest.raises(ValueError):
        unpack(b"not a zip")


def test_conf_keys_configure_and_switch_off_the_store(tmp_path):
    try:
        store = configure_from_conf(tmp_path, {"store_mb": "2"})
        assert store is not None and store.root == tmp_path / "store" and store.max_bytes == 2 << 20
        assert default_store() is store
        assert configure_from_conf(tmp_path, {"store_mb": "0"}) is None and default_store() is None
        with pytest.raises(Exception, match="store_mb"):
            configure_from_conf(tmp_path, {"store_mb": "-1"})
        assert configure_from_conf(tmp_path, {"store_dir": str(tmp_path / "elsewhere")}).root == tmp_path / "elsewhere"
    finally:
        configure_store(None)


WORKER = textwrap.dedent(
    """
    import os, sys, hashlib, pathlib, time
    from monailabel_xflow.segmenter.store import ResultStore, digest
    root, me, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = ResultStore(root, 1 << 20)  # small: both processes evict while the other writes
    # a start barrier: the loop takes a fraction of a second, so on a loaded machine one process
    # could finish before the other has started, and they would never meet in the store
    gate = pathlib.Path(root).parent
    (gate / f"ready-{me}").touch()
    deadline = time.monotonic() + 120
    while not all((gate / f"ready-{n}").exists() for n in range(2)) and time.monotonic() < deadline:
        time.sleep(0.005)
    ns = "ab" * 16
    bad = 0
    for r in range(rounds):
        i = r % 12
        k = digest("shared", i)
        want = hashlib.sha256(str(i).encode()).digest() * 4096  # 128 KiB, the same bytes in both processes
        got = store.get(ns, "emb", k)
        if got is not None and got != want:
            bad += 1
        store.put(ns, "emb", k, want)
    print("bad", bad, "hits", store.hits, "corrupt", store.corrupt)
    """
)


def test_two_processes_share_a_store_without_ever_reading_a_partial_entry(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path / "store"), str(n), "400"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for n in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        words = out.split()
        assert words[:2] == ["bad", "0"] and words[-2:] == ["corrupt", "0"], out
    assert sum(int(out.split()[3]) for out, _ in outs) > 0  # they did read each other's entries
    store = ResultStore(tmp_path / "store", 1 << 20)
    assert store.usage() <= (1 << 20) + 2 * (128 << 10 + HEADER.size)  # bounded (one put may overshoot)
    assert not [p for p in tmp_path.rglob(".tmp-*")]
