"""The run store when another connection holds SQLite's write lock, for real (`BEGIN IMMEDIATE`
on the same file): nothing queued is dropped, the caller never waits for it, a write a request
must see committed fails whole, and past its memory bound the backlog goes to a spill file."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
import time
from contextlib import contextmanager

import pytest

import backend.store as store_module
from asteria_core.policy import LivePolicy
from backend.store import RunStore, StoreError
from tests.backend.conftest import wait_for

LONG_HOLD = 14.0
"""Seconds: the writer fails try after try (each waits WRITER_BUSY_SECONDS for the lock), its
pause between them growing to the longest (RETRY_SECONDS) and several tries made at it, and the
hold outlasts the wait of a request that needs a write committed (DURABLE_WRITE_SECONDS)."""
CALL_GUARD = 2.0
"""Seconds an enqueueing call may take at most (a hang guard: it never waits on the lock)."""


@contextmanager
def write_lock(path):
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


def _record(step: int) -> str:
    return json.dumps({"step": step, "loss": 1.0})


@pytest.fixture
def store(tmp_path):
    s = RunStore(tmp_path / "asteria.db", flush_seconds=0.05)
    s.create_run("r", {}, "", 1000)
    yield s
    s.close()


def test_step_records_written_while_the_lock_is_held_long_are_all_kept(store):
    longest_try = store_module.WRITER_BUSY_SECONDS + store_module.RETRY_SECONDS[1]
    assert max(store_module.DURABLE_WRITE_SECONDS, 4 * longest_try) < LONG_HOLD
    with write_lock(store.path):
        start = time.monotonic()
        for step in range(1, 41):
            began = time.monotonic()
            store.add_step("r", step, _record(step))
            assert time.monotonic() - began < CALL_GUARD  # the training thread goes on
            if step in (2, 20):
                time.sleep(LONG_HOLD / 2)
        assert time.monotonic() - start > LONG_HOLD
    store.flush(timeout=60)
    assert [r["step"] for r in store.steps("r", 0, 100)] == list(range(1, 41))
    assert store.get_run("r")["step"] == 40


def test_a_write_a_request_waits_for_fails_whole_under_the_lock(store):
    with write_lock(store.path):
        with pytest.raises(StoreError, match="locked"):
            store.create_run("late", {}, "", 10)
        with pytest.raises(StoreError, match="locked"):
            store.set_status("r", "stopped", checked=True)
        time.sleep(2.0)  # past the request's wait: what was refused must not land later
    store.flush(timeout=60)
    assert store.get_run("late") is None
    assert store.get_run("r")["status"] == "running"


def test_a_policy_change_is_written_past_the_backlog_or_refused(store):
    live = LivePolicy()
    with write_lock(store.path):
        refused = live.stage({"staleness_bound": 3})
        with pytest.raises(StoreError, match="locked"):
            store.write_policy_change("r", refused)
        live.drop(refused)
        for step in range(1, 200):  # a backlog of step records, not yet written
            store.add_step("r", step, _record(step))
    change = live.propose({"staleness_bound": 4})
    assert change.version != refused.version  # a refused change's version is never reused
    store.write_policy_change("r", change)  # committed on return
    assert [c.version for c in store.policy_changes("r")] == [change.version]
    other = dataclasses.replace(change, diff={"refresh_interval": (10, 5)})
    with pytest.raises(StoreError, match="UNIQUE"):  # a stored version is never overwritten
        store.write_policy_change("r", other)
    assert store.policy_changes("r")[0].diff == {"staleness_bound": (10, 4)}


def test_past_its_bound_the_backlog_spills_to_a_file_and_comes_back(store, monkeypatch):
    monkeypatch.setattr(store_module, "MAX_BACKLOG", 20)
    with write_lock(store.path):
        for step in range(1, 101):
            store.add_step("r", step, _record(step))
        assert store.spill.path.exists() and store.spill.records > 0
    wait_for(lambda: len(store.steps("r", 0, 1000)) == 100, 60)
    assert [r["step"] for r in store.steps("r", 0, 1000)] == list(range(1, 101))
    wait_for(lambda: not store.spill.path.exists() and not store.spill.taken.exists(), 60)


def test_a_spill_file_left_at_a_crash_is_written_at_the_next_start(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "MAX_BACKLOG", 10)
    path = tmp_path / "asteria.db"
    first = RunStore(path, flush_seconds=0.05)
    first.create_run("r", {}, "", 1000)
    with write_lock(path):
        for step in range(1, 61):
            first.add_step("r", step, _record(step))
        first.close(timeout=1)  # the store never became writable: the process ends so
    again = RunStore(path, flush_seconds=0.05)
    try:
        wait_for(lambda: len(again.steps("r", 0, 1000)) >= 50, 60)  # the spilled ones
        spilled = {r["step"] for r in again.steps("r", 0, 1000)}
        assert set(range(61 - first.spill.records, 61)) <= spilled
    finally:
        again.close(timeout=5)


def test_a_policy_change_waits_out_a_short_hold_and_is_on_disk_when_it_returns(store):
    db = sqlite3.connect(store.path, isolation_level=None, check_same_thread=False)
    db.execute("BEGIN IMMEDIATE")
    released: list[float] = []

    def release():
        released.append(time.monotonic())
        db.execute("ROLLBACK")

    timer = threading.Timer(1.0, release)  # well within the change's wait
    timer.start()
    change = LivePolicy().stage({"staleness_bound": 3})
    store.write_policy_change("r", change)
    returned = time.monotonic()
    timer.join()
    db.close()
    assert returned >= released[0]
    with sqlite3.connect(store.path) as other:  # committed: another connection sees it
        assert other.execute("SELECT version FROM policy_changes").fetchall() == [(2,)]
    other.close()
