"""A persistent, bounded store of what the models computed (embeddings, answers), on disk.

The in-memory :mod:`.cache` dies with its process; this store keeps the same work in the
workspace, so the scoring subprocess's encodes and answers serve the server, and a restarted
server starts warm. It holds opaque payloads (bytes) under three names:

* ``namespace``: the fingerprint of the weights that computed the value (hex; one folder, wiped
  as a whole when those weights are replaced: :meth:`ResultStore.wipe`);
* ``kind``: ``emb`` (image embeddings) or ``ans`` (answers);
* ``key``: a hex digest of everything else the value depends on (image content, options).

Guarantees:

* **atomic**: an entry is written to a temporary file in its folder, flushed, fsync'ed and
  renamed over its name (then the folder is fsync'ed); a reader sees a whole entry or none;
* **checked**: every entry carries its length and SHA-256; a truncated or corrupt entry is
  ignored (and removed), never returned, so the caller recomputes;
* **bounded**: least recently used entries (by modification time; a hit refreshes it) are
  removed when the folder grows past ``max_bytes``, down to :data:`LOW_WATER` of it;
* **shared**: several processes (the server and MONAI Label's scoring subprocess) may read and
  write at once: writes are rename-based, eviction and wiping take an exclusive ``flock`` on
  ``<root>/.lock``; losing a race (a file removed under a reader) reads as a miss;
* never raises on I/O trouble (disk full, permissions): a failed write is logged and dropped.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from monailabel_xflow.errors import InputError

logger = logging.getLogger(__name__)

MAGIC = b"XFLOWST1"
HEADER = struct.Struct(">8s32sQ")  # magic, sha256 of the payload, payload length
KINDS = ("emb", "ans")
LOW_WATER = 0.9
"""Eviction brings the store down to this share of ``max_bytes``."""

STALE_TMP_S = 3600.0
"""Temporary files older than this (a writer that died) are removed by eviction."""

DEFAULT_STORE_MB = 8192
"""Default bound of the workspace store (``--conf store_mb``): ~350 full-size images with answers."""

_HEX = re.compile(r"^[0-9a-f]{8,128}$")


class StoreError(InputError):
    """A namespace, kind or key the store refuses (not hex, unknown kind)."""


def _check(namespace: str, kind: str, key: str) -> None:
    if not isinstance(namespace, str) or not _HEX.match(namespace):
        raise StoreError(f"store namespace must be 8-128 lowercase hex digits, got {namespace!r}")
    if kind not in KINDS:
        raise StoreError(f"store kind must be one of {KINDS}, got {kind!r}")
    if not isinstance(key, str) or not _HEX.match(key):
        raise StoreError(f"store key must be 8-128 lowercase hex digits, got {key!r}")


class ResultStore:
    """Entries under ``root/<namespace>/<kind>/<key[:2]>/<key>`` (see the module docstring).

    Args:
        root: the store's folder (created when missing).
        max_bytes: the bound on the entries' total size (>= 1 MiB).

    Raises:
        ValueError: ``max_bytes`` below 1 MiB.
        OSError: ``root`` cannot be created.
    """

    def __init__(self, root: str | os.PathLike[str], max_bytes: int) -> None:
        if int(max_bytes) < (1 << 20):
            raise ValueError(f"the store needs at least 1 MiB, got max_bytes={max_bytes}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._estimate: int | None = None  # this process's idea of the total; rescanned when over
        self.hits = 0
        self.misses = 0
        self.corrupt = 0

    # --- entries ------------------------------------------------------------------------------

    def path(self, namespace: str, kind: str, key: str) -> Path:
        """Where an entry lives (checks the names)."""
        _check(namespace, kind, key)
        return self.root / namespace / kind / key[:2] / key

    def get(self, namespace: str, kind: str, key: str) -> bytes | None:
        """The payload stored under the names, or None (missing, truncated or corrupt: removed)."""
        path = self.path(namespace, kind, key)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            self.misses += 1
            return None
        payload = _unframe(data)
        if payload is None:
            self.corrupt += 1
            self.misses += 1
            logger.warning("store: ignoring a corrupt or truncated entry %s (removed; it is recomputed)", path)
            with contextlib.suppress(OSError):
                os.unlink(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recency for the LRU bound
        self.hits += 1
        return payload

    def has(self, namespace: str, kind: str, key: str) -> bool:
        """Whether an entry exists under the names (not checked: :meth:`get` checks)."""
        return self.path(namespace, kind, key).is_file()

    def put(self, namespace: str, kind: str, key: str, payload: bytes) -> bool:
        """Store ``payload`` atomically; False when it could not be written (logged) or is larger
        than the whole bound."""
        path = self.path(namespace, kind, key)
        framed = _frame(payload)
        if len(framed) > self.max_bytes:
            logger.info("store: a %d-byte entry exceeds the bound (%d); not stored", len(framed), self.max_bytes)
            return False
        tmp = path.parent / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                fh.write(framed)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            _fsync_dir(path.parent)
        except OSError as exc:
            logger.warning("store: could not write %s (%s); the value is kept in memory only", path, exc)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        with self._lock:
            if self._estimate is not None:
                self._estimate += len(framed)
            over = self._estimate is None or self._estimate > self.max_bytes
        if over:
            self.evict()
        return True

    # --- maintenance --------------------------------------------------------------------------

    def usage(self) -> int:
        """Bytes the entries hold now (a scan of the folder)."""
        return sum(size for _, size, _ in self._entries())

    def evict(self) -> int:
        """Remove least recently used entries until the store is within :data:`LOW_WATER` of its
        bound (and stale temporary files); returns how many entries went."""
        removed = 0
        with self._exclusive():
            entries = sorted(self._entries(), key=lambda e: e[2])  # oldest first
            total = sum(size for _, size, _ in entries)
            if total > self.max_bytes:
                target = int(self.max_bytes * LOW_WATER)
                for path, size, _ in entries:
                    if total <= target:
                        break
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                        removed += 1
                    total -= size
            self._remove_stale_tmp()
        with self._lock:
            self._estimate = total
        if removed:
            logger.info("store: evicted %d least recently used entr%s", removed, "y" if removed == 1 else "ies")
        return removed

    def wipe(self, namespace: str) -> int:
        """Remove every entry of ``namespace`` (e.g. a segmenter replaced by a trained one);
        returns the bytes freed. The folder is renamed away first, so no reader sees half of it."""
        if not _HEX.match(str(namespace)):
            raise StoreError(f"store namespace must be 8-128 lowercase hex digits, got {namespace!r}")
        folder = self.root / namespace
        if not folder.is_dir():
            return 0
        with self._exclusive():
            freed = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
            trash = self.root / f".wipe-{uuid.uuid4().hex}"
            try:
                os.replace(folder, trash)
            except OSError as exc:
                logger.warning("store: could not wipe %s: %s", folder, exc)
                return 0
            shutil.rmtree(trash, ignore_errors=True)
        with self._lock:
            self._estimate = None
        logger.info("store: wiped %s (%.1f MB)", namespace, freed / 1e6)
        return freed

    def namespaces(self) -> list[str]:
        """The namespaces holding entries."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _HEX.match(p.name))

    # --- internals ----------------------------------------------------------------------------

    def _entries(self) -> Iterator[tuple[str, int, float]]:
        """``(path, size, mtime)`` of every entry (temporary files excluded)."""
        for ns in self.namespaces():
            for kind in KINDS:
                base = self.root / ns / kind
                if not base.is_dir():
                    continue
                with contextlib.suppress(OSError):
                    for shard in os.scandir(base):
                        if not shard.is_dir():
                            continue
                        with contextlib.suppress(OSError):
                            for entry in os.scandir(shard.path):
                                if entry.name.startswith("."):
                                    continue
                                with contextlib.suppress(OSError):
                                    st = entry.stat()
                                    yield entry.path, st.st_size, st.st_mtime

    def _remove_stale_tmp(self) -> None:
        now = time.time()
        for tmp in self.root.glob("*/*/*/.tmp-*"):
            with contextlib.suppress(OSError):
                if now - tmp.stat().st_mtime > STALE_TMP_S:
                    tmp.unlink()
        for trash in self.root.glob(".wipe-*"):
            shutil.rmtree(trash, ignore_errors=True)

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """An exclusive lock shared by every process using this root (``flock`` on ``.lock``)."""
        import fcntl

        with self._lock, open(self.root / ".lock", "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _frame(payload: bytes) -> bytes:
    return HEADER.pack(MAGIC, hashlib.sha256(payload).digest(), len(payload)) + payload


def _unframe(data: bytes) -> bytes | None:
    if len(data) < HEADER.size:
        return None
    magic, digest, length = HEADER.unpack_from(data)
    payload = data[HEADER.size :]
    if magic != MAGIC or length != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- payloads: named arrays and a JSON header, no pickle ----------------------------------------


def pack(arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None) -> bytes:
    """Named arrays plus a JSON-compatible ``meta`` as one payload (``numpy.savez``, no pickle)."""
    buf = io.BytesIO()
    header = np.frombuffer(json.dumps(dict(meta or {}), sort_keys=True).encode(), dtype=np.uint8)
    np.savez(buf, __meta__=header, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def unpack(payload: bytes) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and ``meta`` of :func:`pack`.

    Raises:
        ValueError: not a payload of :func:`pack` (the store's checksum makes this a bug, not
            disk damage).
    """
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except Exception as exc:  # zipfile, numpy and OS errors alike
        raise ValueError(f"not a store payload: {exc}") from exc
    meta = json.loads(bytes(arrays.pop("__meta__", np.zeros(0, np.uint8))).decode() or "{}")
    return arrays, meta


def digest(*parts: Any) -> str:
    """A 32-hex-digit key of JSON-compatible parts (sorted keys: equal values, equal keys)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --- the process's store ------------------------------------------------------------------------

_default: ResultStore | None = None
_default_lock = threading.Lock()


def configure_store(root: str | os.PathLike[str] | None, max_mb: int = DEFAULT_STORE_MB) -> ResultStore | None:
    """Set (or, with ``root`` None or ``max_mb`` 0, switch off) the process's store.

    Raises:
        ValueError: ``max_mb`` negative, or positive and below 1.
    """
    global _default
    if int(max_mb) < 0:
        raise ValueError(f"store_mb must be >= 0 (0 switches the store off), got {max_mb}")
    with _default_lock:
        _default = None if root is None or int(max_mb) == 0 else ResultStore(root, int(max_mb) << 20)
        return _default


def default_store() -> ResultStore | None:
    """The process's store (None until :func:`configure_store`, e.g. outside the app)."""
    return _default


STORE_DIR = "store"
"""The store's folder in the app's workspace (``--conf store_dir`` moves it)."""

MAX_STORE_MB = 1 << 22  # 4 TiB: a bound on the bound


def store_mb(conf: Mapping[str, Any]) -> int:
    """``--conf store_mb``: the store's bound in MB (default :data:`DEFAULT_STORE_MB`; 0 = off).

    Raises:
        RequestError: not an integer in ``0..MAX_STORE_MB``.
    """
    from monailabel_xflow.parameters import as_int

    return as_int(conf.get("store_mb"), "--conf store_mb", 0, MAX_STORE_MB, DEFAULT_STORE_MB)


def configure_from_conf(workspace: str | os.PathLike[str], conf: Mapping[str, Any]) -> ResultStore | None:
    """The app's store from its ``--conf``: ``store_mb`` (default :data:`DEFAULT_STORE_MB`; 0 = off)
    and ``store_dir`` (default ``<workspace>/store``).

    Raises:
        RequestError: ``store_mb`` not an integer in ``0..4194304``.
    """
    max_mb = store_mb(conf)
    root = str(conf.get("store_dir") or os.path.join(os.fspath(workspace), STORE_DIR))
    store = configure_store(root, max_mb)
    logger.info("workspace store: %s", f"{root} (at most {max_mb} MB)" if store else "off (store_mb 0)")
    return store
