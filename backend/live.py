"""The active run's live view: its row and newest step records, kept as JSON built once.

Dashboards and scripts poll a run's status and newest steps several times a second, and the
control plane shares a process (and a GIL) with training. Answering those polls from memory,
with bytes serialized once per change instead of a store read and a model validation per
request, keeps serving cheap for the training thread. Steps older than the window, and runs that
are not active, are read from the store.
"""

from __future__ import annotations

import bisect
import json
import threading
import time
from typing import Any

from backend import public
from backend.schemas import RunPublic

RUN_FIELDS = tuple(RunPublic.model_fields)


class LiveView:
    def __init__(self, row: dict[str, Any], *, window: int = 10_000) -> None:
        self.run_id: str = row["id"]
        self._row = RunPublic.model_validate(row).model_dump()  # the shape, checked once
        self._row_json: dict[bool, bytes] = {}
        self._steps: list[int] = []
        self._records: list[str] = []
        self._window = window
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ the run's row
    def update(self, **fields: Any) -> None:
        unknown = set(fields) - set(RUN_FIELDS)
        if unknown:
            raise KeyError(f"not run fields: {sorted(unknown)}")
        with self._lock:
            self._row.update(fields, updated_at=time.time())
            self._row_json = {}

    def row(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._row)

    def row_json(self, anonymous: bool = False) -> bytes:
        """The row as JSON, in full or as an anonymous reader sees it (backend/public.py)."""
        with self._lock:
            if anonymous not in self._row_json:
                row = public.run(self._row) if anonymous else self._row
                self._row_json[anonymous] = json.dumps(row).encode()
            return self._row_json[anonymous]

    # ------------------------------------------------------------------ step records
    def add_step(self, step: int, record_json: str) -> None:
        """Append one record (serialized by the caller); steps arrive in increasing order."""
        with self._lock:
            self._steps.append(step)
            self._records.append(record_json)
            if len(self._steps) > 2 * self._window:  # trim in chunks: amortized O(1)
                del self._steps[:-self._window], self._records[:-self._window]
            self._row.update(step=step, updated_at=time.time())
            self._row_json = {}

    def steps_json(self, since: int, limit: int) -> bytes | None:
        """A `StepPage` of the records after `since`, or None when the window does not reach
        back that far (the caller reads the store)."""
        with self._lock:
            if not self._steps or since < self._steps[0] - 1:
                return None
            first = bisect.bisect_right(self._steps, since)
            records = self._records[first:first + limit]
            next_since = self._steps[first + len(records) - 1] if records else since
        return (f'{{"run_id":{json.dumps(self.run_id)},"steps":[{",".join(records)}],'
                f'"next_since":{next_since}}}').encode()
