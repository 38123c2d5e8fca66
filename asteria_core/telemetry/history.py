"""Step records in process: a bounded ring buffer and live listeners.

The control plane reads a run's recent history with `records_since` and follows it live with
`subscribe`. Records are the trainer's `StepRecord` objects after telemetry has added its
figures; readers must treat them as read-only.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from asteria_core.train.records import StepRecord

log = logging.getLogger(__name__)

Listener = Callable[[StepRecord], None]


class StepHistory:
    """The last `capacity` step records, oldest first, safe to read from any thread."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity: got {capacity!r}; allowed: an integer > 0")
        self._records: deque[StepRecord] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def __len__(self) -> int:
        return len(self._records)

    def append(self, record: StepRecord) -> None:
        """Store a record and hand it to every listener (on the caller's thread)."""
        with self._lock:
            self._records.append(record)
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(record)
            except Exception:
                # A broken consumer (say, a closed SSE stream) must never stop training.
                log.exception("step listener %r failed; unsubscribed", listener)
                self.unsubscribe(listener)

    def records_since(self, step: int = 0, limit: int | None = None) -> list[StepRecord]:
        """Records with `record.step > step`, oldest first, at most `limit` of them."""
        with self._lock:
            records = list(self._records)
        out = [r for r in records if r.step > step]
        return out if limit is None else out[:limit]

    def latest(self) -> StepRecord | None:
        with self._lock:
            return self._records[-1] if self._records else None

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(record)` for every new record; returns the unsubscribe function."""
        with self._lock:
            self._listeners.append(listener)
        return lambda: self.unsubscribe(listener)

    def unsubscribe(self, listener: Listener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
