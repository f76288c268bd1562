"""A process-wide, thread-safe LRU cache of image embeddings (encode once per image).

The SAM3 image encoder costs orders of magnitude more than the mask decoder per radiograph,
so every box and click of a revision must reuse one embedding. The workflow, the MONAI Label
tasks and the trainers share :func:`default_cache`, keyed by image *content* (see
``segmenter.image_key``) plus the identity of the model that computed the value, never by file
name: the same radiograph reached through two paths (a DICOM and its PNG export) encodes once.

Guarantees:

* bounded by entry count and by bytes; least recently used entries go first;
* thread-safe; concurrent callers asking for the same missing key compute it **once** (the
  others wait for that result, or see its exception);
* a value larger than the byte budget is returned but not stored.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_MAX_ENTRIES = 16
DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB: ~50 full-size SAM3 embeddings (21 MB each in float32)


def nbytes_of(value: Any) -> int:
    """Bytes held by tensors/arrays inside ``value`` (nested lists, tuples, dicts); 0 for others."""
    if isinstance(value, (list, tuple)):
        return sum(nbytes_of(v) for v in value)
    if isinstance(value, dict):
        return sum(nbytes_of(v) for v in value.values())
    if hasattr(value, "element_size") and hasattr(value, "nelement"):  # torch.Tensor
        return int(value.element_size() * value.nelement())
    return int(getattr(value, "nbytes", 0))  # numpy arrays


@dataclass
class CacheStats:
    """Counters since creation (or the last :meth:`EmbeddingCache.clear`)."""

    hits: int = 0
    misses: int = 0  # computations started
    evictions: int = 0


class EmbeddingCache:
    """LRU cache bounded by entries and bytes, computing each missing key once.

    Args:
        max_entries: most values kept (>= 1).
        max_bytes: most bytes kept, as measured by ``sizeof`` (>= 0).
        sizeof: how many bytes a value holds; defaults to :func:`nbytes_of`.

    Raises:
        ValueError: a bound below its minimum.
    """

    def __init__(
        self,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        sizeof: Callable[[Any], int] = nbytes_of,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_entries = int(max_entries)
        self.max_bytes = int(max_bytes)
        self._sizeof = sizeof
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._pending: dict[Hashable, Future[Any]] = {}
        self._bytes = 0
        self.stats = CacheStats()

    # --- the one entry point callers need ---------------------------------------------------

    def get_or_compute(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The cached value of ``key``, computing it with ``compute()`` when missing.

        Concurrent calls with the same missing key run ``compute`` once; the others block until
        it finishes and get the same value (or the same exception, and nothing is cached).
        """
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self.stats.hits += 1
                return self._entries[key][0]
            pending = self._pending.get(key)
            owner = pending is None
            if pending is None:
                future: Future[Any] = Future()
                self._pending[key] = future
                self.stats.misses += 1
            else:
                future = pending
                self.stats.hits += 1
        if not owner:
            return future.result()
        try:
            value = compute()
        except BaseException as exc:
            with self._lock:
                self._pending.pop(key, None)
            future.set_exception(exc)
            raise
        with self._lock:
            self._store(key, value)
            self._pending.pop(key, None)
        future.set_result(value)
        return value

    # --- inspection and maintenance -----------------------------------------------------------

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The cached value (refreshing its recency), or ``default``; never computes."""
        with self._lock:
            if key not in self._entries:
                return default
            self._entries.move_to_end(key)
            return self._entries[key][0]

    def put(self, key: Hashable, value: Any) -> None:
        """Store a value computed elsewhere (replacing any previous one)."""
        with self._lock:
            self._store(key, value)

    def discard(self, key: Hashable) -> None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._bytes -= entry[1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self.stats = CacheStats()

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        """Bytes currently held."""
        with self._lock:
            return self._bytes

    def keys(self) -> list[Hashable]:
        """Keys from least to most recently used."""
        with self._lock:
            return list(self._entries)

    # --- internals (lock held) ----------------------------------------------------------------

    def _store(self, key: Hashable, value: Any) -> None:
        size = int(self._sizeof(value))
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if size > self.max_bytes:
            logger.debug("embedding of %d bytes exceeds the cache budget (%d); not cached", size, self.max_bytes)
            return
        self._entries[key] = (value, size)
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
            self.stats.evictions += 1


_default_cache: EmbeddingCache | None = None
_default_lock = threading.Lock()


def default_cache() -> EmbeddingCache:
    """The process-wide cache shared by the workflow, the app tasks and the trainers.

    Bounds come from the environment on first use: ``XFLOW_EMBEDDING_CACHE_ENTRIES`` (default 16)
    and ``XFLOW_EMBEDDING_CACHE_MB`` (default 1024).
    """
    global _default_cache
    with _default_lock:
        if _default_cache is None:
            import os

            entries = int(os.environ.get("XFLOW_EMBEDDING_CACHE_ENTRIES", DEFAULT_MAX_ENTRIES))
            megabytes = int(os.environ.get("XFLOW_EMBEDDING_CACHE_MB", DEFAULT_MAX_BYTES >> 20))
            _default_cache = EmbeddingCache(max_entries=entries, max_bytes=megabytes << 20)
        return _default_cache
