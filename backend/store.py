"""The run store: SQLite in WAL mode, a versioned schema, writes batched off the training thread.

The training thread only enqueues; one writer thread commits batches at most `flush_seconds`
apart (status changes are flushed at once), so a step never waits on the disk. Reads open their
own short-lived connections, which WAL lets run beside the writer. A status that could not be
written (a full disk) is kept in memory, shown by reads and written again until it lands.
"""

from __future__ import annotations

import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asteria_core.policy import PolicyChange
from backend.run_states import ACTIVE, RunStatus

SCHEMA_VERSION = 2
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    config TEXT NOT NULL,
    run_dir TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    step INTEGER NOT NULL DEFAULT 0,
    total_steps INTEGER NOT NULL,
    checkpoint_step INTEGER,
    policy TEXT,
    policy_version INTEGER NOT NULL DEFAULT 1,
    error TEXT
);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL REFERENCES runs(id),
    step INTEGER NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS policy_changes (
    run_id TEXT NOT NULL REFERENCES runs(id),
    version INTEGER NOT NULL,
    effective_step INTEGER NOT NULL,
    diff TEXT NOT NULL,
    client TEXT NOT NULL,
    requested_at REAL NOT NULL,
    applied_at REAL,
    reason TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, version)
);
"""
MIGRATIONS = {
    # version 1 -> 2: a change says why (the autopilot's reasons)
    2: "ALTER TABLE policy_changes ADD COLUMN reason TEXT NOT NULL DEFAULT ''",
}
STATUS_SQL = "UPDATE runs SET status=?, error=?, updated_at=? WHERE id=?"
REPAIR_SECONDS = 1.0
log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """A write the run store could not make; the request (or run) that needed it fails."""


@dataclass(eq=False, slots=True)
class _Write:
    sql: str
    args: tuple
    what: str
    error: str | None = None

    def fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = f"{type(err).__name__}: {err}"
            log.error("run store: could not write %s: %s", self.what, self.error)


def _check(write: _Write) -> None:
    if write.error is not None:
        raise StoreError(f"the run store could not write {write.what}: {write.error}")


_FLUSH = _Write("", (), "flush")
"""Ends the batch being collected at once (`flush`)."""


class RunStore:
    def __init__(self, path: Path, *, flush_seconds: float = 0.5) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"run store {path} has schema version {version}; this "
                                   f"Asteria understands up to {SCHEMA_VERSION}")
            fresh = not db.execute("SELECT name FROM sqlite_master WHERE name='runs'").fetchone()
            db.executescript(SCHEMA)
            for target in range(max(version, 1) + 1, SCHEMA_VERSION + 1):
                if not fresh:  # a store an older Asteria wrote: bring its tables up to date
                    db.execute(MIGRATIONS[target])
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._flush_seconds = flush_seconds
        self._status_lock = threading.Lock()
        self._unsaved: dict[str, tuple[str, str | None, float]] = {}
        """run id -> (status, error, when) of a status write that failed (`set_status`)."""
        self._next_repair = 0.0
        self._queue: queue.Queue[_Write | None] = queue.Queue()
        self._flushed = threading.Condition()
        self._enqueued = 0
        self._written = 0
        self._writer = threading.Thread(target=self._write_loop, name="run-store-writer",
                                        daemon=True)
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        db.execute("PRAGMA busy_timeout=30000")
        return db

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            yield db
        finally:
            db.close()

    # ------------------------------------------------------------------ writes (queued)
    def _put(self, sql: str, args: tuple, *, urgent: bool = False, checked: bool = False,
             what: str = "") -> _Write:
        """Queue a write; `urgent` waits until it is committed, `checked` (urgent too) raises
        StoreError if it failed. A failed write is logged and fails alone: the writer goes on."""
        write = _Write(sql, args, what or sql.split("(")[0].strip())
        with self._flushed:
            self._enqueued += 1
        self._queue.put(write)
        if urgent or checked:
            self.flush()
        if checked:
            _check(write)
        return write

    def create_run(self, run_id: str, config: dict, run_dir: str, total_steps: int) -> None:
        now = time.time()
        self._put("INSERT INTO runs (id, status, config, run_dir, created_at, updated_at, "
                  "total_steps) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (run_id, RunStatus.RUNNING.value, json.dumps(config), run_dir, now, now,
                   total_steps), checked=True,
                  what=f"run {run_id}")

    def set_status(self, run_id: str, status: str, *, error: str | None = None,
                   checked: bool = False) -> None:
        """Written at once. If the write fails (a full disk), `checked` raises StoreError;
        otherwise the status is kept unsaved: reads show it, and they write it again until it
        lands, so a run that ended is never left `running` in the store."""
        with self._status_lock:
            now = time.time()
            write = self._put(STATUS_SQL, (status, error, now, run_id), urgent=True,
                              what=f"the status of run {run_id}")
            if write.error is None:
                self._unsaved.pop(run_id, None)
            elif checked:
                _check(write)
            else:
                self._unsaved[run_id] = (status, error, now)

    def _repair(self) -> None:
        """Write the unsaved statuses again, at most once per REPAIR_SECONDS (until then, and
        while writes fail, reads show them from memory)."""
        if not self._unsaved or time.monotonic() < self._next_repair:
            return
        with self._status_lock:
            self._next_repair = time.monotonic() + REPAIR_SECONDS
            for run_id, (status, error, when) in list(self._unsaved.items()):
                write = self._put(STATUS_SQL, (status, error, when, run_id), urgent=True,
                                  what=f"the status of run {run_id}")
                if write.error is None:
                    del self._unsaved[run_id]
                    log.info("run store: the status of run %s is written at last", run_id)

    def _unsaved_now(self) -> dict[str, tuple[str, str | None, float]]:
        """The unsaved statuses, taken before a read: one written meanwhile is the same."""
        self._repair()
        return dict(self._unsaved)  # no lock: a status write may hold it for a flush

    def set_checkpoint(self, run_id: str, step: int) -> None:
        # Flushed at once, with the steps before it: the store must not lag the checkpoint file.
        self._put("UPDATE runs SET checkpoint_step=?, updated_at=? WHERE id=?",
                  (step, time.time(), run_id), urgent=True)

    def add_step(self, run_id: str, step: int, record_json: str) -> None:
        self._put("INSERT OR REPLACE INTO steps (run_id, step, record) VALUES (?, ?, ?)",
                  (run_id, step, record_json))
        self._put("UPDATE runs SET step=?, updated_at=? WHERE id=?", (step, time.time(), run_id))

    def drop_steps_after(self, run_id: str, step: int) -> None:
        """A run resumed from its checkpoint at `step` trains the later steps again: their
        records go, and the run's step is the checkpoint's until they are recorded again.
        Raises StoreError if that could not be written."""
        self._put("DELETE FROM steps WHERE run_id=? AND step>?", (run_id, step))
        self._put("UPDATE runs SET step=?, updated_at=? WHERE id=?", (step, time.time(), run_id),
                  checked=True, what=f"the step of run {run_id}")

    def restore_steps(self, run_id: str, records: list[tuple[int, str]]) -> None:
        """Add (step, record JSON) the store lacks, keeping those it has; raises StoreError."""
        writes = [self._put("INSERT OR IGNORE INTO steps (run_id, step, record) VALUES (?, ?, ?)",
                            (run_id, step, record_json), what=f"step {step} of run {run_id}")
                  for step, record_json in records]
        self.flush()
        for write in writes:
            _check(write)

    def set_policy(self, run_id: str, policy: dict[str, Any], version: int) -> None:
        self._put("UPDATE runs SET policy=?, policy_version=?, updated_at=? WHERE id=?",
                  (json.dumps(policy), version, time.time(), run_id))

    def add_policy_change(self, run_id: str, change: PolicyChange, *,
                          durable: bool = False) -> None:
        """Record a change (pending while applied_at is None); `durable` returns only once it
        is committed, raising StoreError if it could not be."""
        self._put("INSERT OR REPLACE INTO policy_changes (run_id, version, effective_step, diff, "
                  "client, requested_at, applied_at, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                  (run_id, change.version, change.effective_step, json.dumps(change.diff),
                   change.client, change.requested_at, change.applied_at, change.reason),
                  checked=durable,
                  what=f"policy version {change.version} of run {run_id}")

    def flush(self, timeout: float = 30.0) -> None:
        """Block until everything enqueued so far is committed (or failed)."""
        with self._flushed:
            target = self._enqueued
            self._queue.put(_FLUSH)
            self._flushed.wait_for(lambda: self._written >= target, timeout=timeout)

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._writer.join(timeout=30)

    def _write_loop(self) -> None:
        db = self._connect()
        try:
            while (batch := self._next_batch()) is not None:
                writes = [w for w in batch if w is not _FLUSH]
                self._commit(db, writes)
                with self._flushed:
                    self._written += len(writes)
                    self._flushed.notify_all()
        finally:
            db.close()

    def _next_batch(self) -> list[_Write] | None:
        """The writes queued within `flush_seconds` of the first (a flush ends it early), or
        None when the store closes."""
        item = self._queue.get()
        if item is None:
            return None
        batch = [item]
        deadline = time.monotonic() + self._flush_seconds
        while item is not _FLUSH and (left := deadline - time.monotonic()) > 0:
            try:
                item = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # finish this batch, then stop
                break
            batch.append(item)
        return batch

    def _commit(self, db: sqlite3.Connection, writes: list[_Write]) -> None:
        """One transaction. A row that cannot be written (a value SQLite cannot hold, a broken
        constraint) fails alone; a failed commit fails the batch. Either is logged, and the
        writer keeps serving everyone else."""
        try:
            db.execute("BEGIN")
            for write in writes:
                try:
                    db.execute(write.sql, write.args)
                except Exception as err:
                    write.fail(err)
            db.execute("COMMIT")
        except sqlite3.Error as err:
            if db.in_transaction:
                db.execute("ROLLBACK")
            for write in writes:
                write.fail(err)

    # ------------------------------------------------------------------ reads
    def mark_interrupted(self) -> list[str]:
        """At start-up: runs left active by a process that died are interrupted, not running."""
        with self._db() as db:
            active = tuple(s.value for s in ACTIVE)
            rows = db.execute("SELECT id FROM runs WHERE status IN (?, ?)", active).fetchall()
            db.execute("UPDATE runs SET status=?, updated_at=? WHERE status IN (?, ?)",
                       (RunStatus.INTERRUPTED.value, time.time(), *active))
        return [r["id"] for r in rows]

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        unsaved = self._unsaved_now()
        with self._db() as db:
            row = db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        return _run_row(row, unsaved) if row else None

    def list_runs(self) -> list[dict[str, Any]]:
        unsaved = self._unsaved_now()
        with self._db() as db:
            rows = db.execute("SELECT * FROM runs ORDER BY created_at DESC").fetchall()
        return [_run_row(r, unsaved) for r in rows]

    def last_step(self, run_id: str) -> int:
        """The newest step with a record (0 if none)."""
        with self._db() as db:
            row = db.execute("SELECT MAX(step) FROM steps WHERE run_id=?", (run_id,)).fetchone()
        return row[0] or 0

    def steps(self, run_id: str, since: int, limit: int) -> list[dict[str, Any]]:
        with self._db() as db:
            rows = db.execute("SELECT record FROM steps WHERE run_id=? AND step>? ORDER BY step "
                              "LIMIT ?", (run_id, since, limit)).fetchall()
        return [json.loads(r["record"]) for r in rows]

    def policy_changes(self, run_id: str) -> list[PolicyChange]:
        """Every change of the run, by version (applied_at None: acknowledged, not applied)."""
        with self._db() as db:
            rows = db.execute("SELECT * FROM policy_changes WHERE run_id=? ORDER BY version",
                              (run_id,)).fetchall()
        return [PolicyChange(version=r["version"], effective_step=r["effective_step"],
                             diff={k: tuple(v) for k, v in json.loads(r["diff"]).items()},
                             client=r["client"], requested_at=r["requested_at"],
                             applied_at=r["applied_at"], reason=r["reason"]) for r in rows]


def _run_row(row: sqlite3.Row,
             unsaved: dict[str, tuple[str, str | None, float]]) -> dict[str, Any]:
    out = dict(row)
    if row["id"] in unsaved:
        out.update(zip(("status", "error", "updated_at"), unsaved[row["id"]], strict=True))
    out["config"] = json.loads(out["config"])
    out["policy"] = json.loads(out["policy"]) if out["policy"] else None
    return out
