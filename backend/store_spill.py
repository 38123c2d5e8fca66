"""Step records the run store could not hold in memory, kept in a file until it writes them.

While SQLite cannot be written (another process holds its write lock, the disk is full) the
store's writer keeps its batch and tries again; records go on queueing in memory up to a bound.
Past it, each record is appended to this file instead (one line; the training thread never
waits on SQLite), and once the writer has written its backlog it reads the file back, writes
those records and empties it. A file left by a process that died is read back at the next start.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
CHUNK = 2_000
"""Records written back per transaction."""


class Spill:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.taken = path.with_name(path.name + ".taken")
        """The records being written back (left over if a process died meanwhile)."""
        self.active = self.taken.exists() or (path.exists() and path.stat().st_size > 0)
        """True while records go to the file (and until the writer has written them back)."""
        self.records = 0

    def add(self, run_id: str, step: int, record_json: str) -> None:
        with self._lock:
            if not self.active:
                log.warning("run store: backlog full; step records go to %s until it is "
                            "written", self.path)
            self.active = True
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps([run_id, step, record_json]) + "\n")
            self.records += 1

    def catch_up(self, commit: Callable[[Any, list], bool], db: Any,
                 make: Callable[[str, tuple], Any]) -> None:
        """Write the file's records with `commit(db, writes)` (writes built by `make(sql,
        args)`), then empty it. New records queue in memory meanwhile."""
        with self._lock:
            if not self.active:
                return
            taken = self.taken
            if not taken.exists():
                self.path.replace(taken)
            self.active = False
        lines = taken.read_text(encoding="utf-8", errors="replace").splitlines()
        rows = []
        for line in lines:
            try:
                run_id, step, record = json.loads(line)
            except (ValueError, TypeError):
                continue  # a line a crash cut short
            rows.append((run_id, step, record))
        for i in range(0, len(rows), CHUNK):
            writes = [make("INSERT OR IGNORE INTO steps (run_id, step, record) VALUES (?, ?, ?)",
                           row) for row in rows[i:i + CHUNK]]
            writes += [make("UPDATE runs SET step=MAX(step, ?) WHERE id=?", (step, run_id))
                       for run_id, step, _ in rows[i:i + CHUNK]]
            if not commit(db, writes):
                return  # closing: the file stays for the next start
        taken.unlink()
        log.info("run store: %d spilled step records written", len(rows))
        with self._lock:  # records spilled while an older file was written back
            self.active = self.active or (self.path.exists() and self.path.stat().st_size > 0)
