"""The run store: SQLite in WAL mode, a versioned schema, writes batched off the training thread.

The training thread only enqueues; one writer thread commits batches at most `flush_seconds`
apart, so a step never waits on the disk. A batch that cannot be committed (another process
holds the write lock, the disk is full) is kept and tried again until it lands: nothing queued
is dropped. Reads open their own short-lived connections, which WAL lets run beside the writer;
a status not yet written is shown by reads from memory.

A policy change is written apart from that queue (`write_policy_change`): at once, on its own
connection, so the change a request waits for never queues behind the step records.

At start the store is checked (`PRAGMA quick_check`); a damaged store, or an empty one beside
run folders, is refused with what to do (backend/store_check.py).
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
from backend.store_check import check_store, relative_run_dir, resolve_run_dir
from backend.store_spill import Spill

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
CHANGE_SQL = ("INTO policy_changes (run_id, version, effective_step, diff, client, requested_at, "
              "applied_at, reason) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
DURABLE_WRITE_SECONDS = 5.0
"""How long a request waits for a write it must see committed (a policy change, a run's row)
before it is answered 503: long enough for the writer's own commits, short of a client's
patience and of tying up a server thread."""
WRITER_BUSY_SECONDS = 1.0
"""One try of the writer at SQLite's write lock; it tries again (backing off) until it lands."""
RETRY_SECONDS = (0.05, 2.0)
"""The writer's pause between tries of a batch that did not land: from the first, doubling."""
MAX_BACKLOG = 200_000
"""Writes held in memory while the store cannot commit (about 100,000 steps); step records past
it go to a spill file beside the store, read back once the backlog is written."""
log = logging.getLogger(__name__)


class StoreError(RuntimeError):
    """A write the run store could not make; the request (or run) that needed it fails."""


@dataclass(eq=False, slots=True)
class _Write:
    sql: str
    args: tuple
    what: str
    error: str | None = None
    done: bool = False
    cancelled: bool = False
    unsaved: tuple[str, dict[str, Any]] | None = None
    """A write of a run's row: (run id, the fields reads show from memory until it lands)."""

    def fail(self, err: BaseException) -> None:
        if self.error is None:
            self.error = f"{type(err).__name__}: {err}"
            log.error("run store: could not write %s: %s", self.what, self.error)


_FLUSH = _Write("", (), "flush")
"""Ends the batch being collected at once (`flush`)."""


def _row_fails_alone(err: BaseException) -> bool:
    """A value SQLite cannot hold or a broken constraint fails its own row; anything else (a
    lock held elsewhere, a full disk, an I/O error) fails the batch, which is tried again."""
    return not (isinstance(err, sqlite3.OperationalError) or type(err) is sqlite3.DatabaseError)


def _spilled(sql: str, args: tuple) -> _Write:
    return _Write(sql, args, f"spilled step {args[1] if 'steps' in sql else args[0]}")


class RunStore:
    def __init__(self, path: Path, *, flush_seconds: float = 0.5,
                 data_dir: Path | None = None) -> None:
        self.path = path
        self.data_dir = (data_dir or path.parent).absolute()
        """Run folders are stored relative to it (a copied data folder keeps its own runs)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        check_store(path, self.data_dir)  # raises StoreDamaged, saying what to do
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
            self._relativize_run_dirs(db)
        self._flush_seconds = flush_seconds
        self._unsaved: dict[str, dict[str, Any]] = {}
        """run id -> fields of its row written but not yet committed (status, checkpoint)."""
        self._unsaved_lock = threading.Lock()
        self._queue: queue.Queue[_Write | None] = queue.Queue()
        self._flushed = threading.Condition()
        self._attempt = threading.Lock()
        """Held by the writer while it tries a batch: a cancelled write is either in a
        committed batch or never written."""
        self._enqueued = 0
        self._written = 0
        self.last_error: str | None = None
        """Why the batch being tried did not land, while it does not (None once it does)."""
        self.spill = Spill(path.with_name(path.name + ".spill"))
        self._closing = False
        self._writer = threading.Thread(target=self._write_loop, name="run-store-writer",
                                        daemon=True)
        self._writer.start()

    def _connect(self, busy_seconds: float = 30.0) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=busy_seconds, isolation_level=None,
                             check_same_thread=False)
        db.row_factory = sqlite3.Row
        db.execute(f"PRAGMA busy_timeout={int(busy_seconds * 1000)}")
        return db

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = self._connect()
        try:
            yield db
        except sqlite3.DatabaseError as err:  # a page damaged since the check at start
            if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
                raise StoreError(f"the run store is busy ({err}); try again") from err
            raise StoreError(f"the run store {self.path} could not be read ({err}); it may be "
                             f"damaged: stop the server and run `sqlite3 {self.path} 'PRAGMA "
                             "integrity_check'`") from err
        finally:
            db.close()

    def _relativize_run_dirs(self, db: sqlite3.Connection) -> None:
        """Rows an older Asteria wrote name their run folder by absolute path: a copy of the
        data folder would train into the original's. Each becomes relative to the data
        folder where that folder holds the run's folder."""
        for row in db.execute("SELECT id, run_dir FROM runs").fetchall():
            relative = relative_run_dir(row["run_dir"], row["id"], self.data_dir)
            if relative != row["run_dir"]:
                db.execute("UPDATE runs SET run_dir=? WHERE id=?", (relative, row["id"]))

    # ------------------------------------------------------------------ writes (queued)
    def _put(self, sql: str, args: tuple, *, what: str = "",
             unsaved: tuple[str, dict[str, Any]] | None = None) -> _Write:
        """Queue a write; it is retried until it lands (a row SQLite refuses fails alone).
        `unsaved`: (run id, fields) that reads show from memory meanwhile."""
        write = _Write(sql, args, what or sql.split("(")[0].strip(), unsaved=unsaved)
        if unsaved is not None:
            with self._unsaved_lock:
                self._unsaved.setdefault(unsaved[0], {}).update(unsaved[1])
        with self._flushed:
            self._enqueued += 1
        self._queue.put(write)
        return write

    def _wait(self, writes: list[_Write], timeout: float = DURABLE_WRITE_SECONDS) -> None:
        """Until `writes` are committed; raises StoreError if one failed or they did not land
        within `timeout` (then none of those not yet written ever will be: they are
        withdrawn, so a request answered 503 leaves no trace)."""
        self.flush(timeout)
        if not all(w.done for w in writes):
            with self._attempt:  # the writer is between tries: withdraw what is not written
                late = [w for w in writes if not w.done]
                for write in late:
                    write.cancelled = True
            if late:
                raise StoreError(f"the run store could not write {late[0].what} within "
                                 f"{timeout:g} s ({self.last_error or 'busy'}); nothing of it "
                                 "was written")
        for write in writes:
            if write.error is not None:
                raise StoreError(f"the run store could not write {write.what}: {write.error}")

    def create_run(self, run_id: str, config: dict, run_dir: str | Path, total_steps: int) -> None:
        """`run_dir`: the run's folder (stored relative to the data folder when inside it),
        or "" for a run without one here (an attached run's script keeps its own files)."""
        now = time.time()
        self._wait([self._put(
            "INSERT INTO runs (id, status, config, run_dir, created_at, updated_at, "
            "total_steps) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run_id, RunStatus.RUNNING.value, json.dumps(config),
             relative_run_dir(str(run_dir), run_id, self.data_dir) if run_dir else "", now,
             now, total_steps), what=f"run {run_id}")])

    def set_status(self, run_id: str, status: str, *, error: str | None = None,
                   checked: bool = False) -> None:
        """Queued; reads show it at once. `checked` waits until it is committed and raises
        StoreError if it is not (the status is then not written at all)."""
        now = time.time()
        write = self._put(STATUS_SQL, (status, error, now, run_id),
                          what=f"the status of run {run_id}",
                          unsaved=(run_id, {"status": status, "error": error, "updated_at": now}))
        if checked:
            try:
                self._wait([write])
            except StoreError:
                self._saved(write)  # withdrawn: reads show the row as stored
                raise

    def _saved(self, write: _Write) -> None:
        """`write` landed (or was withdrawn): reads stop showing its fields from memory,
        unless a later write set them again."""
        if write.unsaved is None:
            return
        run_id, fields = write.unsaved
        with self._unsaved_lock:
            held = self._unsaved.get(run_id, {})
            for key, value in fields.items():
                if key in held and held[key] == value:
                    del held[key]
            if not held:
                self._unsaved.pop(run_id, None)

    def _unsaved_now(self) -> dict[str, dict[str, Any]]:
        with self._unsaved_lock:
            return {run_id: dict(fields) for run_id, fields in self._unsaved.items()}

    def set_checkpoint(self, run_id: str, step: int) -> None:
        """Queued like a step record: the checkpoint file names its own step, so the store
        may learn of it late (a resume reads the step from the file)."""
        self._put("UPDATE runs SET checkpoint_step=?, updated_at=? WHERE id=?",
                  (step, time.time(), run_id), what=f"the checkpoint of run {run_id}",
                  unsaved=(run_id, {"checkpoint_step": step}))

    def add_step(self, run_id: str, step: int, record_json: str) -> None:
        if self.spill.active or self._queue.qsize() >= MAX_BACKLOG:
            self.spill.add(run_id, step, record_json)  # a file append: the step goes on
            return
        self._put("INSERT OR REPLACE INTO steps (run_id, step, record) VALUES (?, ?, ?)",
                  (run_id, step, record_json))
        self._put("UPDATE runs SET step=MAX(step, ?), updated_at=? WHERE id=?",
                  (step, time.time(), run_id))

    def drop_steps_after(self, run_id: str, step: int) -> None:
        """A run resumed from its checkpoint at `step` trains the later steps again: their
        records go, and the run's step is the checkpoint's until they are recorded again.
        Raises StoreError if that could not be written."""
        self._wait([self._put("DELETE FROM steps WHERE run_id=? AND step>?", (run_id, step)),
                    self._put("UPDATE runs SET step=?, updated_at=? WHERE id=?",
                              (step, time.time(), run_id), what=f"the step of run {run_id}")])

    def restore_steps(self, run_id: str, records: list[tuple[int, str]]) -> None:
        """Add (step, record JSON) the store lacks, keeping those it has; raises StoreError."""
        self._wait([self._put("INSERT OR IGNORE INTO steps (run_id, step, record) VALUES "
                              "(?, ?, ?)", (run_id, step, record_json),
                              what=f"step {step} of run {run_id}")
                    for step, record_json in records])

    def set_policy(self, run_id: str, policy: dict[str, Any], version: int) -> None:
        self._put("UPDATE runs SET policy=?, policy_version=?, updated_at=? WHERE id=?",
                  (json.dumps(policy), version, time.time(), run_id))

    def add_policy_change(self, run_id: str, change: PolicyChange) -> None:
        """Record a change taken into force (queued, as the step records are)."""
        self._put(f"INSERT OR REPLACE {CHANGE_SQL}", _change_args(run_id, change),
                  what=f"policy version {change.version} of run {run_id}")

    def write_policy_change(self, run_id: str, change: PolicyChange,
                            timeout: float = DURABLE_WRITE_SECONDS) -> None:
        """Commit a change (pending: applied_at None) before it is queued, on a connection of
        its own: it waits for SQLite's write lock at most `timeout` seconds, never for the
        writer's backlog. Returns once it is on disk; raises StoreError (nothing written)
        otherwise. A version already stored is refused, never overwritten."""
        what = f"policy version {change.version} of run {run_id}"
        try:
            db = self._connect(busy_seconds=timeout)
            try:
                db.execute("BEGIN IMMEDIATE")
                db.execute(f"INSERT {CHANGE_SQL}", _change_args(run_id, change))
                db.execute("COMMIT")
            finally:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                db.close()
        except sqlite3.Error as err:
            log.error("run store: could not write %s: %s", what, err)
            raise StoreError(f"the run store could not write {what}: {type(err).__name__}: "
                             f"{err}; the change was not made") from err

    def issued_version(self, run_id: str) -> int:
        """The highest policy version the store has seen for the run (its row's, or a
        change's): a restarted run's next change gets a version above it."""
        with self._db() as db:
            row = db.execute("SELECT MAX(version) FROM policy_changes WHERE run_id=?",
                             (run_id,)).fetchone()
            run = db.execute("SELECT policy_version FROM runs WHERE id=?", (run_id,)).fetchone()
        return max(row[0] or 0, run[0] if run else 0)

    def flush(self, timeout: float = 30.0) -> bool:
        """Block until everything enqueued so far is committed (or failed alone); False if
        that did not happen within `timeout` (the writes stay queued)."""
        with self._flushed:
            target = self._enqueued
            self._queue.put(_FLUSH)
            return self._flushed.wait_for(lambda: self._written >= target, timeout=timeout)

    def close(self, timeout: float = 30.0) -> None:
        if not self.flush(timeout):
            log.error("run store: %d writes not committed at close (%s); the run folders' "
                      "steps.jsonl keep the step records", self._queue.qsize(), self.last_error)
        self._closing = True
        self._queue.put(None)
        self._writer.join(timeout=WRITER_BUSY_SECONDS + RETRY_SECONDS[1] + 1)

    def _write_loop(self) -> None:
        db = self._connect(busy_seconds=WRITER_BUSY_SECONDS)
        try:
            # records a process that died left in the spill file first
            self.spill.catch_up(self._commit_until_landed, db, _spilled)
            while (batch := self._next_batch()) is not None:
                writes = [w for w in batch if w is not _FLUSH]
                if not self._commit_until_landed(db, writes):
                    return  # closing with the store still unwritable
                with self._flushed:
                    self._written += len(writes)
                    self._flushed.notify_all()
                if self._queue.empty() and self.spill.active:
                    self.spill.catch_up(self._commit_until_landed, db, _spilled)
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

    def _commit_until_landed(self, db: sqlite3.Connection, writes: list[_Write]) -> bool:
        """Commit `writes` in one transaction, trying again until it lands; False only when
        the store is closing and still cannot write."""
        pause, failing_since = RETRY_SECONDS[0], None
        while True:
            with self._attempt:
                landed = self._commit(db, [w for w in writes if not w.cancelled])
            if landed:
                if failing_since is not None:
                    log.warning("run store: written again after %.1f s", time.monotonic() -
                                failing_since)
                self.last_error = None
                for write in writes:
                    write.done = True
                    self._saved(write)
                return True
            if failing_since is None:
                failing_since = time.monotonic()
                log.warning("run store: %d writes wait (%s); trying again until they land",
                            len(writes), self.last_error)
            if self._closing:
                return False
            time.sleep(pause)
            pause = min(2 * pause, RETRY_SECONDS[1])

    def _commit(self, db: sqlite3.Connection, writes: list[_Write]) -> bool:
        """One transaction; False (rolled back, nothing written) when it must be tried again.
        A row SQLite refuses fails alone, logged, and the others are written."""
        try:
            db.execute("BEGIN IMMEDIATE")  # the write lock now, not mid-batch
            for write in writes:
                try:
                    db.execute(write.sql, write.args)
                except Exception as err:
                    if not _row_fails_alone(err):
                        raise
                    write.fail(err)
            db.execute("COMMIT")
            return True
        except sqlite3.Error as err:
            self.last_error = f"{type(err).__name__}: {err}"
            if db.in_transaction:
                db.execute("ROLLBACK")
            return False

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
        return _run_row(row, unsaved, self.data_dir) if row else None

    def list_runs(self) -> list[dict[str, Any]]:
        unsaved = self._unsaved_now()
        with self._db() as db:
            rows = db.execute("SELECT * FROM runs ORDER BY created_at DESC").fetchall()
        return [_run_row(r, unsaved, self.data_dir) for r in rows]

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


def _run_row(row: sqlite3.Row, unsaved: dict[str, dict[str, Any]],
             data_dir: Path) -> dict[str, Any]:
    out = dict(row)
    out["run_dir"] = resolve_run_dir(out["run_dir"], data_dir)
    if row["id"] in unsaved:
        out.update(unsaved[row["id"]])
    out["config"] = json.loads(out["config"])
    out["policy"] = json.loads(out["policy"]) if out["policy"] else None
    return out


def _change_args(run_id: str, change: PolicyChange) -> tuple:
    return (run_id, change.version, change.effective_step, json.dumps(change.diff),
            change.client, change.requested_at, change.applied_at, change.reason)
