import dataclasses
import functools
import os
import signal
import threading
import time

from asteria_core.policy import Policy
from asteria_core.refresh.processes import ProcessWorkers
from asteria_core.refresh.workers import Job, ThreadWorkers
from asteria_core.train.trainer import Trainer
from tests.components import missing
from tests.procs import alive


def _priority_of_worker(snapshot, config):
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_thread_workers_run_at_the_configured_niceness_and_leave_the_caller_alone():
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    pool = ThreadWorkers(1, _priority_of_worker, nice=7)
    job = Job(snapshot=None, config=None, priority=(0, 0))
    pool.submit(job)
    assert job.done.wait(30)
    assert pool.close() == []
    assert job.error is None and job.result == 7
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before


# ---------------------------------------------------------------------- dead worker processes
def _hang_once(marker: str, snapshot, config):
    """Hangs while `marker` exists (removing it first, so only the first run hangs); answers
    the pid of the process that ran it."""
    if os.path.exists(marker):
        os.remove(marker)
        time.sleep(3600)
    return os.getpid()


def _wait(predicate, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_a_killed_worker_process_is_counted_replaced_and_its_job_runs_again(tmp_path):
    marker = tmp_path / "hang"
    marker.touch()
    pool = ProcessWorkers(1, functools.partial(_hang_once, str(marker)))
    try:
        job = Job(snapshot=None, config=None, priority=(0, 0))
        pool.submit(job)
        _wait(lambda: not marker.exists())  # the worker is inside the job, hanging
        [victim] = pool.pids()
        os.kill(victim, signal.SIGKILL)
        assert job.done.wait(60), "the dead worker's job never finished"
        [replacement] = pool.pids()
        assert job.error is None and job.result == replacement != victim
        assert pool.deaths == 1
    finally:
        assert pool.close() == []


def test_training_goes_on_within_two_steps_of_a_worker_process_kill(tiny):
    """SOAP refreshing on one worker process; its process is SIGKILLed between two steps. The
    default refresh_timeout_ms (30 s) would stall training that long before the refresh ran
    inline; the death must be seen at once, the job rerun on a new process."""
    config = tiny(steps=60, threads=1)
    config = dataclasses.replace(
        config, optim=dataclasses.replace(config.optim, name="soap"),
        policy=Policy(workers=1, worker_kind="process", refresh_interval=5, staleness_bound=10))
    trainer = Trainer(config, jsonl=False)
    records = []
    trainer.runtime.add_listener(records.append)
    try:
        trainer.train(stop_at=30, progress=False)
        pool = trainer.runtime.refresh.workers.pool
        [victim] = pool.pids()
        os.kill(victim, signal.SIGKILL)
        trainer.train(progress=False)
    finally:
        trainer.close()
    def waited(r):
        return r.timing.idle_seconds.get("refresh_wait", 0.0)

    # Process jobs come back a little late now and then (a few ms at the bound): the rhythm
    # before the kill. A step that waited well beyond it was held up by the death.
    usual = max(waited(r) for r in records if r.step <= 30)
    after = [r for r in records if r.step > 30]
    stalled = [(r.step, round(waited(r), 3)) for r in after if waited(r) > 3 * usual]
    assert len(stalled) <= 2, f"steps held up after the kill (usual wait {usual:.3f} s): {stalled}"
    # Held up by a new process's start (Python, torch), never by the timeout's full stall.
    timeout = config.policy.refresh_timeout_ms / 1e3
    assert all(wait < timeout / 2 for _, wait in stalled), stalled
    last = after[-1].refresh
    assert (last.worker_deaths, last.inline_fallbacks, last.failures) == (1, 0, 0)
    assert victim not in pool.pids()


def test_a_later_policy_change_undoes_an_earlier_process_pool(tiny):
    """Workers 2 as processes, then back to one thread: the processes end at once (after any
    job they are running), not when the run does."""
    config = tiny(steps=40, threads=1)
    config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, name="soap"),
                                 policy=Policy(workers=1, refresh_interval=5))
    trainer = Trainer(config, jsonl=False)
    try:
        trainer.policy.propose({"worker_kind": "process", "workers": 2})
        trainer.train(stop_at=10, progress=False)
        pool = trainer.runtime.refresh.workers.pool
        _wait(lambda: len(pool.pids()) == 2)  # started off the step boundary, one by one
        pids = pool.pids()
        trainer.policy.propose({"worker_kind": "thread", "workers": 1})
        trainer.train(stop_at=20, progress=False)
        assert trainer.runtime.refresh.workers.pool.kind == "thread"
        _wait(lambda: not any(alive(pid) for pid in pids), timeout=30)
    finally:
        trainer.close()


# ---------------------------------------------------------------------- pinned to given CPUs
def _cpus_of_worker(snapshot, config):
    """The CPUs the thread running the job may run on."""
    return sorted(os.sched_getaffinity(0))


def _two_cpus() -> tuple[int, int]:
    """Two CPUs this process may use: the first for the caller, the last for the workers."""
    if not hasattr(os, "sched_setaffinity"):
        missing("os.sched_setaffinity (pinning a thread needs Linux)")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        missing("two CPUs to pin the caller and the workers apart")
    return cpus[0], cpus[-1]


def _run_one_job(pool) -> list[int]:
    job = Job(snapshot=None, config=None, priority=(0, 0))
    pool.submit(job)
    try:
        assert job.done.wait(120), "the job never finished"
    finally:
        assert pool.close() == []
    assert job.error is None, job.error
    return job.result


def _in_thread_pinned_to(cpu: int, fn):
    """`fn()` on a thread pinned to `cpu` (as the training thread is by train.cpus)."""
    out = {}

    def run():
        os.sched_setaffinity(0, {cpu})
        out["result"] = fn()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out["result"]


def test_thread_workers_run_on_the_given_cpus_not_on_the_training_threads():
    train_cpu, worker_cpu = _two_cpus()
    before = os.sched_getaffinity(0)
    seen = _in_thread_pinned_to(train_cpu, lambda: _run_one_job(
        ThreadWorkers(1, _cpus_of_worker, cpus=frozenset({worker_cpu}))))
    assert seen == [worker_cpu]
    assert os.sched_getaffinity(0) == before  # the caller's own CPUs are left alone


def test_process_workers_and_their_helper_threads_run_on_the_given_cpus():
    train_cpu, worker_cpu = _two_cpus()
    holder = {}

    def build_and_run():
        pool = ProcessWorkers(1, _cpus_of_worker, cpus=frozenset({worker_cpu}))
        holder["helpers"] = [os.sched_getaffinity(t.native_id)
                             for t in (pool._dispatcher, pool._collector)]
        return _run_one_job(pool)

    assert _in_thread_pinned_to(train_cpu, build_and_run) == [worker_cpu]
    assert holder["helpers"] == [{worker_cpu}, {worker_cpu}]  # they copy and unpickle


def test_train_worker_cpus_pins_the_trainers_refresh_workers(tiny):
    """train.cpus puts training on one CPU, train.worker_cpus its refresh worker on another."""
    train_cpu, worker_cpu = _two_cpus()
    config = tiny(steps=12, cpus=str(train_cpu), worker_cpus=str(worker_cpu))
    config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, name="soap"),
                                 policy=Policy(refresh_interval=5, workers=1))

    def train_and_look() -> list[set[int]]:
        # Thread objects, not idents: a thread that ends after this snapshot frees its ident
        # for the next thread, and a new worker could take it.
        before = set(threading.enumerate())
        trainer = Trainer(config, jsonl=False)
        seen = []
        trainer.runtime.at_boundary(lambda step: seen.extend(
            os.sched_getaffinity(t.native_id) for t in threading.enumerate()
            if t not in before and t.name.startswith("refresh-worker")))
        try:
            trainer.train(progress=False)
        finally:
            trainer.close()
        assert trainer.runtime.refresh.refreshes > 0  # the worker did refresh
        return seen

    seen = _in_thread_pinned_to(train_cpu, train_and_look)
    assert seen and all(cpus == {worker_cpu} for cpus in seen)
