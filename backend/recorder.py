"""What the control plane keeps of one run while it trains: the store's rows, the live view that
polling clients read, and the events live clients follow. `RunManager` (backend/runs.py)
decides which run is active; a `RunRecorder` writes down what that run does, whether the
control plane launched it or a script attached it.

Everything reaches it on the record path: each step record, and with it the policy changes
applied since the last one (read from the run's `LivePolicy`, so nothing in the core calls back
into the control plane when a change takes effect).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from asteria_core.policy import LivePolicy
from asteria_core.telemetry.records import StepRecord
from backend import public
from backend.events import Broadcaster, Event
from backend.live import LiveView
from backend.run_states import RunStatus
from backend.store import RunStore


class RunRecorder:
    """Store, live view and events of one run (its methods run on the training thread, except
    `created`, called while the run is set up)."""

    def __init__(self, run_id: str, policy: LivePolicy, store: RunStore, events: Broadcaster,
                 window: int) -> None:
        self.run_id = run_id
        self.policy = policy
        self.store = store
        self.events = events
        self.window = window
        self.live: LiveView | None = None
        """The run's row and newest steps, served to polling clients from memory."""
        self._audited = policy.version
        """The newest policy version whose change is in the audit as applied."""

    def created(self, **fields: Any) -> None:
        """The run's row exists in the store: the live view starts from it (`fields` update it:
        status, step, policy_version)."""
        row = self.store.get_run(self.run_id)
        assert row is not None  # created before its recorder
        self.live = LiveView(row, window=self.window)
        self.live.update(**fields)

    def _live(self) -> LiveView:
        """The live view, once `created` made it (every other method runs after)."""
        assert self.live is not None
        return self.live

    def record(self, record: StepRecord) -> None:
        text = json.dumps(record.to_dict())  # once, for the store, the live view and SSE
        self.store.add_step(self.run_id, record.step, text)
        self._live().add_step(record.step, text)
        self.events.publish(Event("step", self.run_id, text=text))
        self.audit()

    def audit(self) -> None:
        """The changes that took effect since the last look (at a step boundary, before this
        record completed): into the audit as applied, and to live clients."""
        applied = self.policy.applied_after(self._audited)
        if not applied:
            return
        for change in applied:
            self.store.add_policy_change(self.run_id, change)
            event = dataclasses.asdict(public.change(change))  # SSE is public
            self.events.publish(Event("policy", self.run_id, event))
        self._audited = applied[-1].version
        self.store.set_policy(self.run_id, self.policy.current.to_dict(), self.policy.version)
        self._live().update(policy_version=self.policy.version)

    def checkpointed(self, step: int) -> None:
        self.store.set_checkpoint(self.run_id, step)
        self._live().update(checkpoint_step=step)

    def status(self, status: RunStatus) -> None:
        """Paused or running again, while the run stays active."""
        self.store.set_status(self.run_id, status)
        self._live().update(status=status)
        self.events.publish(Event("status", self.run_id, {"status": status}))

    def ended(self, status: RunStatus, error: str | None = None) -> None:
        """The run is no longer active (the manager forgets it after this); a change applied
        at its last boundary is audited here, as no record follows it."""
        self.audit()
        self.store.set_status(self.run_id, status, error=error)
        # Training is over: a reader told the run ended finds all its records in the store
        # (bounded; while the store cannot be written, reads show the status from memory).
        self.store.flush()

    def announce_end(self, status: RunStatus, error: str | None = None) -> None:
        """Tell live clients the run ended (SSE is public: an error's kind only)."""
        self.events.publish(Event("status", self.run_id, {
            "status": status, "error": error.split(":", 1)[0] if error else None}))

    def rewind(self, step: int, steps_file: Path) -> None:
        """A resumed run goes on from its checkpoint's step: the records after it go (they are
        trained and recorded again) and the run's step is the checkpoint's until then. Records
        up to it that the store had not written when the server died (a crash between the
        checkpoint file and the store's next batch) come from the run's steps.jsonl, written
        and flushed record by record before the checkpoint: the sequence has no gap."""
        stored = self.store.last_step(self.run_id)
        if stored < step:
            self.store.restore_steps(self.run_id,
                                     records_between(steps_file, after=stored, until=step))
        self.store.drop_steps_after(self.run_id, step)
        self.store.set_checkpoint(self.run_id, step)
        self._live().update(step=step, checkpoint_step=step)


def records_between(path: Path, *, after: int, until: int) -> list[tuple[int, str]]:
    """(step, record JSON) of the steps in (after, until] from a run's steps.jsonl."""
    found: list[tuple[int, str]] = []
    if not path.is_file():
        return found
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                continue  # a line a crash cut short
            if isinstance(step, int) and after < step <= until:
                found.append((step, line.strip()))
    return found
