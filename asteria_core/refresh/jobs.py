"""Refresh jobs and what every worker pool shares: the priority queue, running one job, and
placing and renicing the threads and processes that run them."""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asteria_core.optim.seam import FactorSnapshot, RefreshConfig, RefreshResult

RefreshFn = Callable[[FactorSnapshot, RefreshConfig], RefreshResult]


@dataclass(eq=False)
class Job:
    """One refresh of one block; `done` is set when `result` or `error` is filled in."""

    snapshot: FactorSnapshot
    config: RefreshConfig
    priority: tuple
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    finished_at: float | None = None
    result: RefreshResult | None = None
    error: str | None = None
    cancelled: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    ready: Any = None
    """CUDA: an event marking the snapshot's host copy complete; waited for before the run."""

    @property
    def seconds(self) -> float:
        """Worker time spent on the job (0 until it finished)."""
        if self.started_at is None or self.finished_at is None:
            return 0.0
        return self.finished_at - self.started_at


class PriorityQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[tuple, int, Job]] = []
        self._count = itertools.count()
        self._cv = threading.Condition()
        self._closed = False

    def put(self, job: Job) -> None:
        with self._cv:
            heapq.heappush(self._heap, (job.priority, next(self._count), job))
            self._cv.notify()

    def get(self) -> Job | None:
        """The most urgent job not cancelled, or None once closed."""
        with self._cv:
            while True:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if self._heap:
                    return heapq.heappop(self._heap)[2]
                if self._closed:
                    return None
                self._cv.wait()

    def __len__(self) -> int:
        with self._cv:
            return sum(1 for _, _, job in self._heap if not job.cancelled)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()


def run_job(fn: RefreshFn, job: Job) -> None:
    try:
        if job.ready is not None:
            job.ready.synchronize()  # not counted in job.seconds: the device's time, not ours
        job.started_at = time.perf_counter()
        job.result = fn(job.snapshot, job.config)
    except Exception:  # any failure keeps the old basis; the engine counts it
        job.error = traceback.format_exc(limit=3)
    job.finished_at = time.perf_counter()
    job.done.set()


def pin_this_thread(cpus: frozenset[int] | None) -> None:
    """Run the calling thread (Linux: pid 0 is the calling thread) and the threads it starts
    from now on only on `cpus`; None leaves it where it is (by default, the CPUs of the thread
    that started it: the training thread's, `train.cpus`)."""
    if cpus:
        os.sched_setaffinity(0, cpus)


def renice(tid: int, nice: int) -> None:
    """Lower one thread's (Linux) or process's scheduling priority; a no-op for 0."""
    if nice:
        os.setpriority(os.PRIO_PROCESS, tid, nice)
