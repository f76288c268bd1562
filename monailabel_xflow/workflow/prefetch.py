"""Work ahead of the annotator: one background worker that prepares the image just handed out.

When the active-learning strategy hands out the next sample, the annotator's client opens it
and (3D Slicer's Next Sample) auto-runs XFlow on it. :class:`Prefetcher` starts that work at
once, in the background: the image's embedding, then the auto-run's answer, each skipped when
the workspace store (:mod:`monailabel_xflow.segmenter.store`) already holds it. Rules:

* **one at a time**: a single worker thread; a job waits for the one before it;
* **superseded jobs are cancelled**: a newer :meth:`Prefetcher.submit` replaces a job not yet
  started, and a running job stops at its next step (between the encode and the answer);
* **low priority**: the worker thread lowers its own CPU niceness (Linux: per thread, inherited
  by the compute threads it starts) before any work, so interactive requests go first;
* a job's failure is logged and forgotten: prefetching never fails a request.

A job is a sequence of steps (callables); the app builds them (load the image, ``XFlow.encode``,
``XFlow.run_all`` with the auto-run's options).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)

PREFETCH_NICE = 10
"""Niceness the worker thread adds to itself (as MONAI Label's background tasks do)."""


@dataclass
class Job:
    """One prefetch: a name (the image id) and its steps, run in order until cancelled."""

    name: str
    steps: Sequence[Callable[[], object]]
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    completed: list[int] = field(default_factory=list)  # indices of the steps that ran to the end
    error: BaseException | None = None


class Prefetcher:
    """A single low-priority worker thread running the latest :class:`Job` (module docstring).

    Args:
        nice: niceness the worker adds to itself (0: none).
    """

    def __init__(self, nice: int = PREFETCH_NICE) -> None:
        self.nice = int(nice)
        self._lock = threading.Condition()
        self._pending: Job | None = None
        self._running: Job | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, name: str, steps: Sequence[Callable[[], object]]) -> Job:
        """Queue a job, cancelling the one waiting and the one running; a job for the same ``name``
        already waiting or running is returned instead (no second job for the same image)."""
        job = Job(name, list(steps))
        with self._lock:
            if self._closed:
                raise RuntimeError("the prefetcher is closed")
            for current in (self._pending, self._running):
                if current is not None and current.name == name and not current.cancelled.is_set():
                    return current  # the same image again: the job already queued or running goes on
            if self._pending is not None:
                self._pending.cancelled.set()
                self._pending.done.set()
            if self._running is not None:
                self._running.cancelled.set()
            self._pending = job
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._work, name="xflow-prefetch", daemon=True)
                self._thread.start()
            self._lock.notify_all()
        return job

    def close(self, timeout: float | None = None) -> None:
        """Cancel everything and stop the worker (waits up to ``timeout`` s for a running step)."""
        with self._lock:
            self._closed = True
            for job in (self._pending, self._running):
                if job is not None:
                    job.cancelled.set()
            if self._pending is not None:
                self._pending.done.set()
            self._pending = None
            self._lock.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _work(self) -> None:
        if self.nice:
            with contextlib.suppress(OSError, AttributeError):  # Linux: the thread's own niceness (a task id)
                os.setpriority(
                    os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + self.nice
                )
        while True:
            with self._lock:
                while self._pending is None and not self._closed:
                    self._lock.wait()
                if self._closed or self._pending is None:
                    return
                job: Job = self._pending
                self._pending = None
                self._running = job
            try:
                for index, step in enumerate(job.steps):
                    if job.cancelled.is_set():
                        logger.info("prefetch %s: superseded, stopped before step %d", job.name, index + 1)
                        break
                    step()
                    job.completed.append(index)
            except Exception as exc:  # never fail anyone: log and go on
                job.error = exc
                logger.warning("prefetch %s failed: %s", job.name, exc)
            finally:
                with self._lock:
                    self._running = None
                job.done.set()


def autorun_steps(get_xflow: Callable[[], object], load_image: Callable[[], object]) -> list[Callable[[], object]]:
    """The steps of one Next Sample prefetch: load the image, encode it, answer the auto-run
    (``XFlow.prepare``: Stage 1, all findings; skipped when stored). ``get_xflow`` returns the
    loaded :class:`~.xflow.XFlow` (called in the worker, so a model load happens there too)."""
    state: dict[str, object] = {}

    def load() -> None:
        state["image"] = load_image()

    def encode() -> None:
        get_xflow().encode(state["image"])  # type: ignore[attr-defined]

    def answer() -> None:
        get_xflow().prepare(state["image"])  # type: ignore[attr-defined]

    return [load, encode, answer]
