"""The autopilot as a runtime part: it reads every completed step record (the one telemetry
channel, as any listener does), asks `decide` for a change, and either proposes it to the
operator or applies it as an ordinary policy change (`LivePolicy.propose`, client
"autopilot", with its reason), which takes effect at the next step boundary like any PATCH.

It runs as the boundary's autopilot stage, after the refresh stage, on the records completed so
far (fed by the runtime's record listener), and returns the record's `autopilot` section. In a
data-parallel run only rank 0 decides; the policy sync carries its changes to every rank.
Thread-safe: the training thread feeds it, the control plane reads it, answers its proposals
and sets its mode.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asteria_core.autopilot.config import AutopilotConfig, AutopilotError, Mode
from asteria_core.autopilot.decide import AUTOPILOT, Decision, decide, direction, window_size
from asteria_core.autopilot.reading import reading
from asteria_core.policy import LivePolicy, PolicyBusy, PolicyChange, PolicyError, PolicyMoved
from asteria_core.telemetry.records import AutopilotFigures, StepRecord

log = logging.getLogger(__name__)

MAX_RECORDS = 4096
"""Records kept: two rounds at a refresh interval of up to about 2000 steps."""
MAX_KEPT = 200
"""Proposals and decisions kept for the API (the audit keeps every applied change)."""


class NoProposal(AutopilotError):
    pass


class ProposalNotOpen(AutopilotError):
    pass


class Outcome:
    PROPOSED = "proposed"
    APPLIED = "applied"  # queued as a policy change (in force from the next boundary)
    ACCEPTED = "accepted"  # a proposal the operator accepted: applied
    DISMISSED = "dismissed"
    SUPERSEDED = "superseded"  # an open proposal the policy moved past (the operator's change)
    REJECTED = "rejected"  # the policy refused it (a validator): nothing changed


COUNTED = (Outcome.PROPOSED, Outcome.APPLIED, Outcome.ACCEPTED, Outcome.DISMISSED,
           Outcome.REJECTED)
"""The outcomes the decision counters have (superseded proposals are not counted)."""


@dataclass
class Proposal:
    id: int
    step: int
    changes: dict[str, Any]
    reason: str
    undo: bool
    status: str = Outcome.PROPOSED
    version: int | None = None
    """The policy version it became, once applied."""


def _change_dict(change: PolicyChange) -> dict[str, Any]:
    return {"version": change.version, "effective_step": change.effective_step,
            "diff": change.diff, "client": change.client, "reason": change.reason}


def _same_way(open_changes: dict[str, Any], changes: dict[str, Any],
              policy: dict[str, Any]) -> bool:
    """A new decision that moves the same fields the same way as the open proposal leaves it
    open: an operator reading a proposal should not see it replaced because a figure moved."""
    return open_changes.keys() == changes.keys() and all(
        direction(policy[k], open_changes[k]) == direction(policy[k], v)
        for k, v in changes.items())


class Autopilot:
    def __init__(self, live: LivePolicy, config: AutopilotConfig, *, decides: bool = True,
                 cores: int | None = None) -> None:
        """`decides`: False on a data-parallel rank other than 0 (it follows rank 0). `cores`:
        the CPU cores this rank's training and refresh workers share (see `decide`)."""
        self.live = live
        self._config = config
        self.decides = decides
        self.cores = cores
        self._lock = threading.Lock()
        self._records: deque[list] = deque(maxlen=MAX_RECORDS)
        """[record, its JSON form or None]: converted when a decision first reads it, so a run
        whose autopilot is off pays an append per step, not a to_dict (~80 us)."""
        self._holds: dict[str, int] = {}
        self._proposals: deque[Proposal] = deque(maxlen=MAX_KEPT)
        self._next_id = 1
        self._reading: dict[str, Any] | None = None
        """What the latest decision read, against its thresholds (None before the first)."""
        self.counts: Counter[tuple[str, str]] = Counter()
        """Decisions by (field, outcome), since the start."""

    @property
    def config(self) -> AutopilotConfig:
        return self._config

    @property
    def mode(self) -> str:
        return self._config.mode

    def set_mode(self, mode: str) -> None:
        """off is the kill switch (see `configure`); raises AutopilotError on a bad mode."""
        self.configure(dataclasses.replace(self._config, mode=mode))

    def configure(self, config: AutopilotConfig) -> None:
        """New settings from the next boundary on. Mode off is the kill switch: nothing is
        decided from then on, and open proposals are withdrawn (dismissed)."""
        with self._lock:
            self._config = config
            if config.mode == Mode.OFF:
                for p in self._proposals:
                    if p.status == Outcome.PROPOSED:
                        p.status = Outcome.DISMISSED

    # ----------------------------------------------------------------- the runtime's calls
    def observe(self, record: StepRecord) -> None:
        """A completed step record (the runtime's listener)."""
        with self._lock:
            self._records.append([record, None])

    def at_boundary(self, step: int) -> AutopilotFigures:
        """The boundary's autopilot stage: decide on the records so far, then propose or apply
        (a change applied here is queued: in force from the next boundary, like a PATCH)."""
        with self._lock:
            if self._config.mode != Mode.OFF and self.decides and not self.live.pending():
                self._decide()
            return self._figures()

    def _decide(self) -> None:
        self._supersede()
        policy, config = self.live.current.to_dict(), self._config
        # what a decision can read (decide() takes any longer tail to the same answer)
        tail = max(window_size(policy, config) + config.settle + config.spacing,
                   2 * config.guard_steps)
        records = []
        for item in itertools.islice(self._records, max(0, len(self._records) - tail), None):
            if item[1] is None:
                item[1] = item[0].to_dict()
            records.append(item[1])
        history = [_change_dict(c) for c in self.live.history()]
        self._reading = reading(records, policy, history, config)
        decision = decide(records, policy, history, config, self._holds, self.cores)
        if decision is None:
            return
        if self._config.mode == Mode.APPLY:
            self._apply(self._new_proposal(decision), Outcome.APPLIED)
        elif not any(p.status == Outcome.PROPOSED and _same_way(p.changes, decision.changes,
                                                                policy)
                     for p in self._proposals):
            self._new_proposal(decision)
            self._count(decision.changes, Outcome.PROPOSED)

    def _figures(self) -> AutopilotFigures:
        # every bounded field and outcome from the start, at 0: a counter that exists before
        # its first increase gives rate() and increase() their baseline
        names = sorted({*self._config.bounds, *(name for name, _ in self.counts)})
        decisions = {name: {outcome: self.counts[(name, outcome)] for outcome in COUNTED}
                     for name in names}
        return AutopilotFigures(
            mode=self._config.mode, decisions=decisions,
            open_proposals=sum(p.status == Outcome.PROPOSED for p in self._proposals))

    def _new_proposal(self, decision: Decision) -> Proposal:
        for p in self._proposals:  # one open proposal: the newest decision replaces it
            if p.status == Outcome.PROPOSED:
                p.status = Outcome.SUPERSEDED
        proposal = Proposal(self._next_id, decision.step, dict(decision.changes),
                            decision.reason, decision.undo)
        self._next_id += 1
        self._proposals.append(proposal)
        return proposal

    def _apply(self, proposal: Proposal, outcome: str,
               within: Callable[[PolicyChange], None] | None = None,
               wait: float = 0.0) -> None:
        """Stage the proposal's change, let `within(change)` store it (the control plane),
        queue it. Superseded when an operator's change was queued or is being stored since the
        decision (it wins); rejected (and held) when the policy refuses it."""
        try:
            change = self.live.stage(proposal.changes, client=AUTOPILOT, reason=proposal.reason,
                                     if_newest=self.live.version, wait=wait)
        except (PolicyMoved, PolicyBusy):
            proposal.status = Outcome.SUPERSEDED
            return
        except PolicyError as err:
            proposal.status = Outcome.REJECTED
            proposal.reason += f" (refused: {err})"
            self._count(proposal.changes, Outcome.REJECTED)
            self._hold(proposal.changes)  # not asked again at every boundary
            log.warning("autopilot: %s refused: %s", proposal.changes, err)
            return
        if within is not None:
            try:
                within(change)
            except BaseException:
                self.live.drop(change)
                raise
        change = self.live.queue(change)
        proposal.status, proposal.version = outcome, change.version
        self._count(proposal.changes, outcome)
        log.info("autopilot v%d: %s", change.version, proposal.reason)

    def _supersede(self) -> None:
        """An open proposal is moot once someone else changed one of its fields after it."""
        others = [c for c in self.live.history() if c.client != AUTOPILOT]
        for p in self._proposals:
            if p.status == Outcome.PROPOSED and any(
                    c.effective_step > p.step and set(c.diff) & set(p.changes) for c in others):
                p.status = Outcome.SUPERSEDED

    def _count(self, changes: dict[str, Any], outcome: str) -> None:
        for name in changes:
            self.counts[(name, outcome)] += 1

    # ----------------------------------------------------------------- the operator's answers
    def accept(self, proposal_id: int,
               within: Callable[[PolicyChange], None] | None = None,
               wait: float = 0.0) -> Proposal:
        """Apply an open proposal now (as the autopilot's change); raises AutopilotError when it
        is not open, PolicyError when the policy refuses it. `within(change)` runs before the
        change is queued, with no lock held that the training thread takes (the control plane
        stores the change there); if it raises, nothing is queued and the proposal stays open.
        `wait`: seconds to wait for another change being stored (`LivePolicy.stage`)."""
        with self._lock:
            proposal = dataclasses.replace(self._open(proposal_id))
        self._apply(proposal, Outcome.ACCEPTED, within, wait)  # on a copy: no lock held
        with self._lock:
            kept = self._find(proposal_id)
            if kept is not None and proposal.status != Outcome.PROPOSED:
                kept.status, kept.version, kept.reason = (proposal.status, proposal.version,
                                                          proposal.reason)
        if proposal.status == Outcome.REJECTED:
            raise PolicyError(next(iter(proposal.changes)), proposal.reason)
        if proposal.status == Outcome.SUPERSEDED:
            raise ProposalNotOpen("proposal", f"{proposal_id}: a change queued since "
                                              "comes first; the next window decides again")
        return proposal

    def dismiss(self, proposal_id: int) -> Proposal:
        """Drop an open proposal; its fields are held from the autopilot for `hold` steps from
        the newest record (as are those of a change the policy refused)."""
        with self._lock:
            proposal = self._open(proposal_id)
            proposal.status = Outcome.DISMISSED
            self._hold(proposal.changes)
            self._count(proposal.changes, Outcome.DISMISSED)
            return dataclasses.replace(proposal)

    def _hold(self, changes: dict[str, Any]) -> None:
        """Leave these fields alone for `hold` steps from the newest record."""
        now = self._records[-1][0].step if self._records else 0
        for name in changes:
            self._holds[name] = max(self._holds.get(name, 0), now + self._config.hold)

    def _find(self, proposal_id: int) -> Proposal | None:
        return next((p for p in self._proposals if p.id == proposal_id), None)

    def _open(self, proposal_id: int) -> Proposal:
        for p in self._proposals:
            if p.id == proposal_id:
                if p.status != Outcome.PROPOSED:
                    raise ProposalNotOpen("proposal", f"{proposal_id} is {p.status}, not open")
                return p
        raise NoProposal("proposal", f"no proposal {proposal_id} (the newest {MAX_KEPT} are "
                                     "kept)")

    # ----------------------------------------------------------------- what the API shows
    def proposals(self) -> list[Proposal]:
        with self._lock:
            return [dataclasses.replace(p) for p in self._proposals]

    def snapshot(self) -> dict[str, Any]:
        """Mode, settings, proposals (newest last) and decision counts, as plain data."""
        with self._lock:
            return {"config": self._config.to_dict(), "decides": self.decides,
                    "cores": self.cores,
                    "proposals": [dataclasses.asdict(p) for p in self._proposals],
                    "reading": self._reading,
                    "counts": [{"field": f, "outcome": o, "count": n}
                               for (f, o), n in sorted(self.counts.items())]}
