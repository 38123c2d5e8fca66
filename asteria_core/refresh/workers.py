"""Host refresh workers: threads or processes that run the refresh seam off the training thread.

Both pools take jobs through `submit`, in priority order (lower `priority` first), and hand back
`Job`s whose `done` event is set with a result or an error. Each worker runs one job at a time.
torch's linear algebra releases the GIL, so threads run eighs beside the training step; processes
additionally own their intra-op thread count and can be killed when a refresh hangs.
`asteria bench critical-path` measures them against the inline refresh.
"""

from __future__ import annotations

import threading
import time

import torch

from asteria_core.policy import WorkerKind
from asteria_core.refresh.jobs import (
    Job,
    PriorityQueue,
    RefreshFn,
    pin_this_thread,
    renice,
    run_job,
)
from asteria_core.refresh.processes import ProcessWorkers

__all__ = ["Job", "ProcessWorkers", "RefreshFn", "ThreadWorkers", "make_pool",
           "pin_this_thread"]


class ThreadWorkers:
    """`n` daemon threads sharing one priority queue."""

    kind = "thread"
    deaths = 0  # a thread does not die unasked (a hung one is abandoned, not replaced)

    def __init__(self, n: int, fn: RefreshFn, threads_per_worker: int = 1, nice: int = 0,
                 cpus: frozenset[int] | None = None) -> None:
        self._fn = fn
        self._nice = nice
        self._cpus = cpus
        self._queue = PriorityQueue()
        self._busy = 0
        self._lock = threading.Lock()
        self._threads_per_worker = threads_per_worker
        self._running: dict[str, Job] = {}
        self._since: dict[str, float] = {}  # thread name -> when it took its job
        self._busy_total = 0.0
        self._threads = [threading.Thread(target=self._loop, name=f"refresh-worker-{i}",
                                          daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _loop(self) -> None:
        pin_this_thread(self._cpus)  # first: the OpenMP threads it starts inherit the CPUs
        torch.set_num_threads(self._threads_per_worker)  # per thread: OpenMP's own setting
        renice(threading.get_native_id(), self._nice)
        name = threading.current_thread().name
        while (job := self._queue.get()) is not None:
            with self._lock:
                self._busy += 1
                self._running[name] = job
                self._since[name] = time.perf_counter()
            try:
                run_job(self._fn, job)
            finally:
                with self._lock:
                    self._busy -= 1
                    del self._running[name]
                    self._busy_total += time.perf_counter() - self._since.pop(name)

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def abandon(self, job: Job) -> None:
        """Forget a job (a hung one): a thread cannot be killed, its late result is ignored."""
        job.cancelled = True

    def stalled(self, job: Job) -> float | None:
        """Unknown for a thread (a refresh may wait on its intra-op threads): the engine goes
        by the time a refresh is expected to take instead."""
        return None

    def retire(self) -> None:
        """Take no more jobs (a policy change replaced this pool): each thread ends after the
        job it is running."""
        self._queue.close()

    @property
    def size(self) -> int:
        return len(self._threads)

    def busy(self) -> int:
        with self._lock:
            return self._busy

    def busy_seconds(self) -> float:
        """Worker seconds spent in jobs so far, those running up to now included."""
        with self._lock:
            now = time.perf_counter()
            return self._busy_total + sum(now - since for since in self._since.values())

    def close(self, timeout: float = 10.0) -> list[str]:
        """Stop and join every worker; returns the names of any that did not stop in time.

        A thread stuck in an abandoned (hung) refresh cannot be stopped from Python: it is not
        waited for, and as a daemon it ends with the process. Process workers avoid this.
        """
        self._queue.close()
        deadline = time.monotonic() + timeout
        with self._lock:
            hung = {name for name, job in self._running.items() if job.cancelled}
        for t in self._threads:
            if t.name not in hung:
                t.join(max(0.0, deadline - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]


def make_pool(kind: str, n: int, fn: RefreshFn, threads_per_worker: int, nice: int = 0,
              cpus: frozenset[int] | None = None):
    """A pool of `n` workers; `cpus`: the CPUs its threads and processes run on (None: those
    of the thread that builds it)."""
    match kind:
        case WorkerKind.THREAD:
            return ThreadWorkers(n, fn, threads_per_worker, nice, cpus)
        case WorkerKind.PROCESS:
            return ProcessWorkers(n, fn, threads_per_worker, nice, cpus)
        case _:
            raise NotImplementedError(kind)
