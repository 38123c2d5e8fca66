import os
import threading

from asteria_core.refresh.workers import Job, ThreadWorkers


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
