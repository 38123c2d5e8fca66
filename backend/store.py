"""The run store: SQLite in WAL mode, a versioned schema, writes batched off the training thread.

The training thread only enqueues; one writer thread commits batches at most `flush_seconds`
apart (status changes are flushed at once), so a step never waits on the disk. Reads open their
own short-lived connections, which WAL lets run beside the writer.
"""

from __future__ import annotations

import json
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
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
    PRIMARY KEY (run_id, version)
);
"""
ACTIVE_STATUSES = ("running", "paused")


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
            db.executescript(SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._flush_seconds = flush_seconds
        self._queue: queue.Queue[tuple[str, tuple] | None] = queue.Queue()
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
    def _put(self, sql: str, args: tuple, *, urgent: bool = False) -> None:
        with self._flushed:
            self._enqueued += 1
        self._queue.put((sql, args))
        if urgent:
            self.flush()

    def create_run(self, run_id: str, config: dict, run_dir: str, total_steps: int) -> None:
        now = time.time()
        self._put("INSERT INTO runs (id, status, config, run_dir, created_at, updated_at, "
                  "total_steps) VALUES (?, 'running', ?, ?, ?, ?, ?)",
                  (run_id, json.dumps(config), run_dir, now, now, total_steps), urgent=True)

    def set_status(self, run_id: str, status: str, *, error: str | None = None) -> None:
        self._put("UPDATE runs SET status=?, error=?, updated_at=? WHERE id=?",
                  (status, error, time.time(), run_id), urgent=True)

    def set_checkpoint(self, run_id: str, step: int) -> None:
        # Flushed at once, with the steps before it: the store must not lag the checkpoint file.
        self._put("UPDATE runs SET checkpoint_step=?, updated_at=? WHERE id=?",
                  (step, time.time(), run_id), urgent=True)

    def add_step(self, run_id: str, step: int, record_json: str) -> None:
        self._put("INSERT OR REPLACE INTO steps (run_id, step, record) VALUES (?, ?, ?)",
                  (run_id, step, record_json))
        self._put("UPDATE runs SET step=?, updated_at=? WHERE id=?", (step, time.time(), run_id))

    def set_policy(self, run_id: str, policy: dict[str, Any], version: int) -> None:
        self._put("UPDATE runs SET policy=?, policy_version=?, updated_at=? WHERE id=?",
                  (json.dumps(policy), version, time.time(), run_id))

    def add_policy_change(self, run_id: str, change: dict[str, Any]) -> None:
        self._put("INSERT OR REPLACE INTO policy_changes (run_id, version, effective_step, diff, "
                  "client, requested_at, applied_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                  (run_id, change["version"], change["effective_step"],
                   json.dumps(change["diff"]), change["client"], change["requested_at"],
                   change["applied_at"]))

    def flush(self, timeout: float = 30.0) -> None:
        """Block until everything enqueued so far is committed."""
        with self._flushed:
            target = self._enqueued
            self._queue.put(("__flush__", ()))
            self._flushed.wait_for(lambda: self._written >= target, timeout=timeout)

    def close(self) -> None:
        self.flush()
        self._queue.put(None)
        self._writer.join(timeout=30)

    def _write_loop(self) -> None:
        db = self._connect()
        try:
            while True:
                item = self._queue.get()
                if item is None:
                    return
                batch = [item]
                deadline = time.monotonic() + self._flush_seconds
                while item[0] != "__flush__" and (left := deadline - time.monotonic()) > 0:
                    try:
                        item = self._queue.get(timeout=left)
                    except queue.Empty:
                        break
                    if item is None:
                        self._queue.put(None)  # finish this batch, then stop
                        break
                    batch.append(item)
                writes = [(sql, args) for sql, args in batch if sql != "__flush__"]
                db.execute("BEGIN")
                for sql, args in writes:
                    db.execute(sql, args)
                db.execute("COMMIT")
                with self._flushed:
                    self._written += len(writes)
                    self._flushed.notify_all()
        finally:
            db.close()

    # ------------------------------------------------------------------ reads
    def mark_interrupted(self) -> list[str]:
        """At start-up: runs left active by a process that died are interrupted, not running."""
        with self._db() as db:
            rows = db.execute("SELECT id FROM runs WHERE status IN (?, ?)",
                              ACTIVE_STATUSES).fetchall()
            db.execute("UPDATE runs SET status='interrupted', updated_at=? WHERE status IN (?, ?)",
                       (time.time(), *ACTIVE_STATUSES))
        return [r["id"] for r in rows]

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        with self._db() as db:
            row = db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
        return _run_row(row) if row else None

    def list_runs(self) -> list[dict[str, Any]]:
        with self._db() as db:
            rows = db.execute("SELECT * FROM runs ORDER BY created_at DESC").fetchall()
        return [_run_row(r) for r in rows]

    def steps(self, run_id: str, since: int, limit: int) -> list[dict[str, Any]]:
        with self._db() as db:
            rows = db.execute("SELECT record FROM steps WHERE run_id=? AND step>? ORDER BY step "
                              "LIMIT ?", (run_id, since, limit)).fetchall()
        return [json.loads(r["record"]) for r in rows]

    def policy_changes(self, run_id: str) -> list[dict[str, Any]]:
        with self._db() as db:
            rows = db.execute("SELECT * FROM policy_changes WHERE run_id=? ORDER BY version",
                              (run_id,)).fetchall()
        return [{**dict(r), "diff": json.loads(r["diff"])} for r in rows]


def _run_row(row: sqlite3.Row) -> dict[str, Any]:
    out = dict(row)
    out["config"] = json.loads(out["config"])
    out["policy"] = json.loads(out["policy"]) if out["policy"] else None
    return out
