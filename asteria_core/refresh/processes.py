"""Worker processes for refreshes: spawned, one job each at a time, killed when hung.

A process owns its intra-op thread count and can be killed, which a thread cannot: a refresh
that hangs (or a process that is stopped) is ended and the process replaced. Snapshots travel
in shared-memory buffers reused job after job (`SharedBuffers`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from typing import Any, overload

import torch

from asteria_core.optim.seam import FactorSnapshot
from asteria_core.refresh.jobs import Job, PriorityQueue, RefreshFn, pin_this_thread, renice
from asteria_core.telemetry.energy import count_process, process_cpu_seconds

log = logging.getLogger(__name__)


class SharedBuffers:
    """Shared-memory tensors that carry snapshots to worker processes, reused job after job.

    A (possibly lent) snapshot must not be pickled as it is: pickling moves a tensor's storage
    into shared memory in place, which the optimizer's live tensors must not undergo. So it is
    copied once, on the dispatcher thread, into a buffer that is already shared: pickling it
    then sends a file descriptor and copies nothing, and no shared-memory segment is created or
    torn down per job (before: a clone, then a second copy into a new segment, per tensor per
    job). A buffer goes back to the pool when its worker is done with it: its result arrived,
    or its process died or was killed."""

    def __init__(self) -> None:
        self._free: dict[tuple, list[torch.Tensor]] = {}
        self._lock = threading.Lock()

    def copy(self, snapshot: FactorSnapshot) -> tuple[FactorSnapshot, list[torch.Tensor]]:
        """The snapshot with its tensors in shared buffers, and the buffers it holds."""
        if not isinstance(snapshot, FactorSnapshot):
            return snapshot, []  # not the optimizer's (a test's own job): nothing to protect
        held: list[torch.Tensor] = []

        @overload
        def shared(t: torch.Tensor) -> torch.Tensor: ...
        @overload
        def shared(t: None) -> None: ...
        def shared(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            with self._lock:
                free = self._free.get((tuple(t.shape), t.dtype))
                buf = free.pop() if free else None
            if buf is None:
                buf = torch.empty(t.shape, dtype=t.dtype).share_memory_()
            held.append(buf)
            return buf.copy_(t)

        return dataclasses.replace(snapshot, factor=shared(snapshot.factor),
                                   basis=shared(snapshot.basis)), held

    def give_back(self, buffers: list[torch.Tensor]) -> None:
        with self._lock:
            for buf in buffers:
                self._free.setdefault((tuple(buf.shape), buf.dtype), []).append(buf)


def _exit_with_parent() -> None:
    """End this worker process when the one that started it dies: a kill -9 of the server runs
    no cleanup, and a worker blocked on its inbox would otherwise live on, holding memory and
    the resource tracker."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()  # returns when the parent's end of the sentinel pipe closes
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


READY = "ready"
"""The first message of a worker process on the outbox: (READY, its pid, None, 0.0)."""


def _process_main(inbox: Any, outbox: Any, fn: RefreshFn, threads: int, nice: int,
                  cpus: frozenset[int] | None = None) -> None:
    pin_this_thread(cpus)  # before any thread starts: they inherit the CPUs
    _exit_with_parent()
    import torch

    torch.set_num_threads(threads)
    renice(0, nice)
    outbox.put((READY, os.getpid(), None, 0.0))
    while (item := inbox.get()) is not None:
        job_id, snapshot, config = item
        t0 = time.perf_counter()
        try:
            outbox.put((job_id, fn(snapshot, config), None, time.perf_counter() - t0))
        except Exception:
            outbox.put((job_id, None, traceback.format_exc(limit=3), time.perf_counter() - t0))


class _Process:
    def __init__(self, ctx: Any, index: int, fn: RefreshFn, threads: int, nice: int,
                 outbox: Any, cpus: frozenset[int] | None) -> None:
        self.inbox = ctx.Queue()
        self.proc = ctx.Process(target=_process_main,
                                args=(self.inbox, outbox, fn, threads, nice, cpus),
                                name=f"refresh-worker-{index}", daemon=True)
        self.proc.start()
        count_process(self.proc.pid)  # its CPU is the run's, in the host's energy estimate
        self.job: Job | None = None
        self.ready = False
        """Set when the process says it is up (torch imported): only then is a job handed to
        it, so a job's `started_at` is when a process really takes it up."""
        self._cpu: float | None = None
        self._progress_at = 0.0
        self.since = 0.0
        """When it took its job."""

    def took(self, job: Job) -> None:
        """`job` is handed to this process now: its progress is counted from here."""
        self.job = job
        self._cpu, self._progress_at = process_cpu_seconds(self.proc.pid), time.perf_counter()
        self.since = self._progress_at

    def let_go(self) -> float:
        """Its job is over (done, or the process is gone): the seconds it was busy with it."""
        busy = time.perf_counter() - self.since if self.job is not None else 0.0
        self.job = None
        return busy

    def stalled(self) -> float | None:
        """Seconds since this process last used any CPU (since it took its job, at most);
        None where its CPU time cannot be read. A stopped (SIGSTOP) or stuck process stalls; a
        refresh that computes, however slowly, uses CPU."""
        cpu, now = process_cpu_seconds(self.proc.pid), time.perf_counter()
        if cpu is None or self._cpu is None:
            return None
        if cpu != self._cpu:
            self._cpu, self._progress_at = cpu, now
        return now - self._progress_at


class ProcessWorkers:
    """`n` worker processes (spawned, so no OpenMP state is forked); one job each at a time.

    A dispatcher thread starts the processes (so building a pool never holds up the step
    boundary) and hands the most urgent queued job to an idle one that is up (it says so once
    torch is imported, which takes seconds on a loaded machine); a collector thread receives
    results and watches the processes: one that died (killed, out of memory) is counted in
    `deaths`, replaced, and its job queued again. A hung job's process is killed and replaced.
    """

    kind = "process"
    REAP_SECONDS = 0.2
    """How often the collector looks for dead processes."""
    STOP_SECONDS = 1.0
    """How long `close` lets the processes exit by themselves before it kills them. Nothing in
    them outlives the pool (a result that arrived is in its Job; one still running is not
    wanted), and on a loaded machine a process still importing torch, or tearing it down, would
    otherwise hold up the end of a run for seconds."""

    def __init__(self, n: int, fn: RefreshFn, threads_per_worker: int = 1, nice: int = 0,
                 cpus: frozenset[int] | None = None) -> None:
        self._ctx = mp.get_context("spawn")
        self._n, self._fn, self._threads, self._nice = n, fn, threads_per_worker, nice
        self._cpus = cpus
        self._outbox = self._ctx.Queue()
        self._queue = PriorityQueue()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._ids = itertools.count()
        self._jobs: dict[int, tuple[Job, _Process]] = {}
        self._procs: list[_Process] = []
        self._shared = SharedBuffers()
        self._holding: dict[int, list[torch.Tensor]] = {}  # job id -> its snapshot's buffers
        self.deaths = 0
        """Worker processes that died without being asked to (each replaced, its job requeued)."""
        self._busy_total = 0.0
        self._closing = False
        self._retiring = False
        self._dispatcher = threading.Thread(target=self._dispatch, name="refresh-dispatch",
                                            daemon=True)
        self._collector = threading.Thread(target=self._collect, name="refresh-collect",
                                           daemon=True)
        self._dispatcher.start()
        self._collector.start()

    def _new_process(self, index: int) -> _Process:
        return _Process(self._ctx, index, self._fn, self._threads, self._nice, self._outbox,
                        self._cpus)

    def _start_processes(self) -> None:
        for index in range(self._n):
            with self._idle:
                if self._closing or self._retiring:
                    return
                try:
                    self._procs.append(self._new_process(index))
                except Exception:  # out of processes or memory: work with fewer
                    log.exception("could not start refresh worker %d of %d", index + 1, self._n)
                    return
                self._idle.notify_all()

    def _dispatch(self) -> None:
        pin_this_thread(self._cpus)  # it copies snapshots: host work, off the training CPUs
        self._start_processes()
        while (job := self._queue.get()) is not None:
            if job.ready is not None:
                job.ready.synchronize()  # its host copy, before a process is taken for it
            snapshot, buffers = self._shared.copy(job.snapshot)
            with self._idle:
                while not self._stopped() and self._idle_process() is None:
                    self._idle.wait()
                if self._stopped():
                    return
                proc = self._idle_process()
                assert proc is not None  # waited for above, under the same lock
                if job.cancelled:
                    self._shared.give_back(buffers)
                    continue
                job_id = next(self._ids)
                proc.took(job)
                self._jobs[job_id] = (job, proc)
                self._holding[job_id] = buffers
                job.started_at = time.perf_counter()
                # Under the lock: a retire() or close() that follows sends its stop after this.
                proc.inbox.put((job_id, snapshot, job.config))

    def _idle_process(self) -> _Process | None:
        return next((p for p in self._procs if p.ready and p.job is None), None)

    def _stopped(self) -> bool:
        return self._closing or self._retiring

    def _collect(self) -> None:
        pin_this_thread(self._cpus)  # it unpickles results: host work, off the training CPUs
        reaped = time.monotonic()
        while True:
            if time.monotonic() - reaped >= self.REAP_SECONDS:
                self._reap()
                reaped = time.monotonic()
            try:
                item = self._outbox.get(timeout=self.REAP_SECONDS)
            except queue.Empty:
                if self._closing or (self._retiring and not self._jobs):
                    return
                continue
            job_id, result, error, _seconds = item
            if job_id == READY:  # a process is up; `result` is its pid
                with self._idle:
                    for proc in self._procs:
                        proc.ready = proc.ready or proc.proc.pid == result
                    self._idle.notify_all()
                continue
            with self._idle:
                entry = self._jobs.pop(job_id, None)
                if entry is None:
                    continue  # a job abandoned as hung, or requeued: its process was replaced
                self._done_with(job_id)
                job, proc = entry
                self._busy_total += proc.let_go()
                self._idle.notify_all()
            job.result, job.error = result, error
            job.finished_at = time.perf_counter()
            job.done.set()

    def _reap(self) -> None:
        """Replace every process that died unasked, and queue its job again."""
        with self._idle:
            if self._stopped():
                return
            for index, proc in enumerate(self._procs):
                if proc.proc.is_alive():
                    continue
                self.deaths += 1
                job = proc.job
                log.warning("refresh worker %s (pid %s) died with exit code %s%s; starting a "
                            "new one", proc.proc.name, proc.proc.pid, proc.proc.exitcode,
                            "; its job is queued again" if job is not None else "")
                for job_id in [i for i, (_, p) in self._jobs.items() if p is proc]:
                    del self._jobs[job_id]
                    self._done_with(job_id)  # its process is gone: nothing reads them now
                self._busy_total += proc.let_go()
                self._procs[index] = self._new_process(index)
                if job is not None and not job.cancelled:
                    job.started_at = None
                    self._queue.put(job)
                self._idle.notify_all()

    def _done_with(self, job_id: int) -> None:
        """Job `job_id`'s process no longer reads its snapshot: its buffers can carry another."""
        self._shared.give_back(self._holding.pop(job_id, []))

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def abandon(self, job: Job) -> None:
        """Cancel a job; if a process is running it, kill that process and start a new one."""
        job.cancelled = True
        with self._idle:
            for job_id, (j, proc) in list(self._jobs.items()):
                if j is job:
                    del self._jobs[job_id]
                    self._busy_total += proc.let_go()
                    proc.proc.kill()
                    proc.proc.join(5)
                    if not proc.proc.is_alive():
                        self._done_with(job_id)
                    if not self._stopped():  # a retired pool only winds down
                        index = self._procs.index(proc)
                        self._procs[index] = self._new_process(index)
                    self._idle.notify_all()

    def stalled(self, job: Job) -> float | None:
        """Seconds the process running `job` has used no CPU; None when no process of this pool
        runs it or its CPU time cannot be read."""
        with self._lock:
            proc = next((p for j, p in self._jobs.values() if j is job), None)
        return None if proc is None else proc.stalled()

    def up(self) -> int:
        """Worker processes that are up and take jobs."""
        with self._lock:
            return sum(1 for p in self._procs if p.ready and p.proc.is_alive())

    def retire(self) -> None:
        """Take no more jobs (a policy change replaced this pool): each process exits after the
        job it is running, whose result still arrives."""
        with self._idle:
            self._retiring = True
            self._idle.notify_all()
            procs = list(self._procs)
        self._queue.close()
        for p in procs:
            p.inbox.put(None)  # after the job already in its inbox

    @property
    def size(self) -> int:
        return self._n

    def busy(self) -> int:
        with self._lock:
            return sum(1 for p in self._procs if p.job is not None)

    def busy_seconds(self) -> float:
        """Worker seconds spent in jobs so far (from hand-over to result), those running up to
        now included."""
        with self._lock:
            now = time.perf_counter()
            return self._busy_total + sum(now - p.since for p in self._procs if p.job is not None)

    def pids(self) -> list[int]:
        with self._lock:
            return [p.proc.pid for p in self._procs]

    def close(self, timeout: float = STOP_SECONDS) -> list[str]:
        with self._idle:
            self._closing = True
            self._idle.notify_all()
        self._queue.close()
        self._dispatcher.join(5)  # no process starts after this
        for p in self._procs:
            p.inbox.put(None)
        self._collector.join(5)  # it ends at its next empty poll, before any process is killed
        deadline = time.monotonic() + timeout
        for p in self._procs:
            p.proc.join(max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.proc.is_alive():
                p.proc.kill()  # still starting, running a refresh no one waits for, or hung
        left = []
        for p in self._procs:
            p.proc.join(5)
            if p.proc.is_alive():
                left.append(p.proc.name)
        return left
