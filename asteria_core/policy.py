"""The live-tunable policy: one validated, versioned object.

`Policy` is an immutable value; `LivePolicy` holds the one in force and the changes waiting for
the next step boundary. A change is a partial dict: it is merged into the newest policy,
validated whole (unknown fields, types, ranges, cross-field rules, and any validators the runtime
registers, such as "the disk directory is writable"), and either queued with a new version and the
step at which it takes effect, or rejected whole with a `PolicyError` naming the field. Queued
changes are applied together at one step boundary and recorded in the history.

Each field's kind, range or choices, label and help text are written once, in `Policy`'s field
metadata (a `Setting`, asteria_core/fields.py, as every config section's): `Policy` validates
with them, and `policy_fields()` hands them to the control plane, which builds its request
schema (and so the dashboard's form) from them.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from asteria_core.compat import Choice, StrEnum
from asteria_core.fields import (
    AUTO,
    Kind,
    Setting,
    as_members,
    choice,
    plain_dict,
    problems,
    setting,
    settings_of,
)
from asteria_core.machine import MACHINE

PLANNED_DUTY = 0.8
"""The duty refresh workers are planned for: `asteria plan` recommends the count that stays
under it, the autopilot aims its changes at it, and "auto" fits the swap window to workers at
it (refresh/schedule.py)."""


# The policy's choices. A Policy holds each as its enum's member (given as the member or its
# value); `to_dict` gives the plain strings that JSON, checkpoints and HTTP carry.
class SwapMode(Choice):
    DETERMINISTIC = "deterministic"  # swap a basis from step-t statistics at a fixed step <= t + d
    OPPORTUNISTIC = "opportunistic"  # swap as soon as ready, wait only at the bound


class Priority(Choice):
    STALE_THEN_COST = "stale_then_cost"
    FIFO = "fifo"


class WorkerKind(Choice):
    THREAD = "thread"
    PROCESS = "process"


class OffloadMode(Choice):
    NONE = "none"
    HOST = "host"
    DISK = "disk"
    AUTO = "auto"  # placement by the budgets


class PolicyError(ValueError):
    """A policy change is invalid; `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _int(default: int, lo: int, hi: int, title: str, doc: str) -> Any:
    return setting(default, Kind.INT, doc, title=title, minimum=lo, maximum=hi)


def _auto_or_int(default: int | str, lo: int, hi: int, title: str, doc: str) -> Any:
    return setting(default, Kind.AUTO_OR_INT, doc, title=title, minimum=lo, maximum=hi)


def _choice(default: StrEnum, title: str, doc: str) -> Any:
    return choice(default, doc, title=title)


def _bool(default: bool, title: str, doc: str) -> Any:
    return setting(default, Kind.BOOL, doc, title=title)


def _str(default: str, max_length: int, title: str, doc: str) -> Any:
    return setting(default, Kind.STR, doc, title=title, max_length=max_length)


MAX_STEPS = 1_000_000


MAX_BYTES = 2**53


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """What an operator may change while a run trains.

    Each field's type, range or choices, label and help text are written once, here; see
    `policy_fields` for the description the control plane and its dashboard are built from.
    """

    refresh_interval: int = _int(
        10, 1, MAX_STEPS, "Refresh interval (steps)",
        "Steps between refreshes of a preconditioner block.")
    staleness_bound: int = _int(
        10, 0, MAX_STEPS, "Staleness bound S (steps)",
        "S: the most steps a basis in use may lag the statistics it was computed from.")
    swap_delay: int | str = _auto_or_int(
        AUTO, 0, MAX_STEPS, 'Swap delay d (steps, at most S; "auto" = min(S, interval))',
        "d <= S: in deterministic mode a round that falls due at step t is swapped in by t + d "
        "(over t + d - swap window + 1 .. t + d, see swap_window); a block's first basis at "
        "once, as the references do. "
        '"auto" is the refresh interval, at most S (read at each boundary): a round is in by '
        "the time the next one falls due, so one round is in flight and a shorter interval "
        "gives fresher bases; a longer d would only make every basis older, since the workers "
        "have one interval per round whatever d is.")
    swap_window: int | str = _auto_or_int(
        AUTO, 1, MAX_STEPS, 'Swap window V (steps; "auto" fits the blocks)',
        "Deterministic mode: a round due at t is placed on V = min(this, d) boundaries by "
        "refresh cost; a block in slot k is read and handed to the workers at t + k (with "
        "pace on) and swapped in at t + d - V + 1 + k, so every basis is d - V + 1 steps old "
        "when swapped in and no single step rotates every block's moments. 1 swaps the whole "
        "round at t + d, as the optimizer's own delayed mode does. \"auto\": the widest "
        "V <= min(d, refresh interval) whose lead d - V + 1 covers its busiest slot's work "
        f"on workers loaded as planned, a round in {PLANNED_DUTY:g} x min(d, interval) steps "
        "(many like blocks: a lead of 1 step).")
    swap_mode: SwapMode = _choice(
        SwapMode.DETERMINISTIC, "Swap mode",
        "deterministic (swap at a step fixed when the refresh falls due, by t + d) | "
        "opportunistic (swap as soon as ready, wait only at the bound).")
    workers: int = _int(
        1, 0, MACHINE.max_workers, "Refresh workers (0 = inline)",
        "Host refresh workers; 0 computes refreshes inline (the native reference). At most "
        f"one per core of this machine ({MACHINE.max_workers}); as processes, at most "
        f"{MACHINE.max_process_workers} (each takes about 512 MiB of the memory budget).")
    worker_threads: int = _int(
        1, 1, MACHINE.max_threads, "Threads per worker",
        f"torch intra-op threads per refresh worker; at most the cores ({MACHINE.max_threads}).")
    worker_kind: WorkerKind = _choice(
        WorkerKind.THREAD, "Worker kind",
        "thread | process: where refreshes run (processes can be killed when one hangs).")
    worker_nice: int = _int(
        0, 0, 19, "Worker niceness (0-19)",
        "Scheduling niceness of refresh workers: above 0 they yield the cores to training and "
        "fill its idle gaps instead of competing with it.")
    refresh_timeout_ms: int = _int(
        30_000, 1, 86_400_000, "Refresh timeout (ms)",
        "How long a step waits at the bound for its late refreshes, all together, before "
        "computing them inline (a stopped or stuck worker process is killed and replaced). A "
        "refresh a worker is still computing gets 4 x max(this, its expected time from the "
        "recent refresh rate), so a wide factor still computing is not taken for hung.")
    priority: Priority = _choice(
        Priority.STALE_THEN_COST, "Refresh queue order",
        "stale_then_cost (most stale, then most expensive) | fifo.")
    pace: bool = _bool(
        True, "Pace refreshes",
        "Spread each refresh round's jobs over the swap window's V boundaries by cost "
        "(opportunistic mode: min(S, refresh interval)), reading each block's statistics when "
        "its job goes out, so the workers load every step evenly instead of a burst at each "
        "refresh point and every basis is d - V + 1 steps old at its swap. Off, a round is "
        "read and handed out at once when it falls due (older bases); the swap steps are the "
        "same either way.")
    failure_limit: int = _int(
        3, 1, MAX_STEPS, "Failure limit",
        "Consecutive failed refreshes of one block before the run stops; nothing is saved on "
        "the way out, its last good checkpoint stays the one to resume.")
    device_budget_bytes: int = _int(
        0, 0, MAX_BYTES, "Device tier budget (bytes, 0 = no limit)",
        "Bytes of optimizer state allowed on the device tier; 0 means no limit.")
    host_budget_bytes: int = _int(
        0, 0, MAX_BYTES, "Host tier budget (bytes, 0 = no limit)",
        "Bytes of optimizer state allowed on the host tier; 0 means no limit.")
    disk_dir: str = _str(
        "", 4096, "Disk tier folder",
        "Folder of the disk tier; empty means a folder inside the run directory.")
    offload_mode: OffloadMode = _choice(
        OffloadMode.NONE, "Offload mode", "none | host | disk | auto (placement by budgets).")

    def __post_init__(self) -> None:
        for name, problem in problems(self):  # types, ranges and choices, from each setting
            raise PolicyError(name, problem)
        as_members(self)
        # Valid now (above): "auto" or an integer.
        if isinstance(self.swap_delay, int) and self.swap_delay > self.staleness_bound:
            raise PolicyError("swap_delay", f"got {self.swap_delay}; allowed: at most "
                                            f"staleness_bound ({self.staleness_bound})")
        if self.worker_kind == WorkerKind.PROCESS and self.workers > MACHINE.max_process_workers:
            raise PolicyError("workers", f"got {self.workers} process workers; allowed: at most "
                                         f"{MACHINE.max_process_workers} on this machine "
                                         f"({MACHINE.describe()}, about 512 MiB each)")
        if self.swap_mode == SwapMode.OPPORTUNISTIC and self.workers == 0:
            raise PolicyError("workers", "got 0; allowed: at least 1 in opportunistic mode "
                                         "(0 workers computes inline, which is deterministic)")

    @property
    def delay(self) -> int:
        """d in force: `swap_delay`, or min(S, refresh interval) when it is "auto"."""
        if self.swap_delay == AUTO:
            return min(self.staleness_bound, self.refresh_interval)
        assert isinstance(self.swap_delay, int)  # "auto" or an integer
        return self.swap_delay

    def to_dict(self) -> dict[str, Any]:
        return plain_dict(self)


def policy_fields(policy_cls: type[Policy] = Policy) -> tuple[Setting, ...]:
    """Every field of `policy_cls` (Policy or a subclass) described: name, default, kind,
    bounds or choices, label and help. Plain data, so other layers can build on it."""
    return settings_of(policy_cls)


FIELDS = tuple(f.name for f in dataclasses.fields(Policy))


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """One accepted change: its version, its diff, who asked (and why, where the asker says:
    the autopilot always does), and when it takes effect."""

    version: int
    effective_step: int
    diff: dict[str, tuple[Any, Any]]
    client: str
    requested_at: float
    applied_at: float | None = None
    reason: str = ""


Validator = Callable[[Policy], None]


class PolicyBusy(RuntimeError):
    """Another change is being validated and stored; this one was not taken (try again)."""


class PolicyMoved(RuntimeError):
    """A change was queued since the caller read the policy (`stage`'s `if_newest`)."""


class LivePolicy:
    """The policy in force, plus changes queued for the next step boundary (thread-safe).

    A change is proposed in two steps, so that whoever stores it durably does so with no lock
    held that the training thread takes: `stage` validates it and gives it a version of its
    own (never given to another change, even if this one is dropped), then the caller stores
    it and `queue`s it for the step boundary, or `drop`s it. One change is staged at a time;
    `propose` does all of it at once for callers that store nothing.

    A change is in force from the step it was promised (`effective_step`), never earlier: one
    queued again after a restart keeps the step its PATCH answered, so the resumed run trains
    the steps before it as the first run did. Queued changes apply in version order; a change
    queued behind one that waits for a later step waits with it.
    """

    def __init__(self, initial: Policy | None = None, *, version: int = 1,
                 start_step: int = 0, issued: int = 0) -> None:
        self._lock = threading.Lock()
        self._slot_free = threading.Condition(self._lock)
        self._current = initial or Policy()
        self._version = version
        self._newest = self._current
        self._newest_version = version
        self._issued = max(version, issued)
        """The highest version ever given to a change (`issued`: one a store has seen)."""
        self._staged: tuple[PolicyChange, Policy, int] | None = None
        self._claimed = False
        self._pending: list[tuple[PolicyChange, Policy]] = []
        """Queued changes, each with the policy it makes, their effective steps ascending."""
        self._history: list[PolicyChange] = []
        self._last_boundary = start_step
        self._validators: list[Validator] = []
        self._taken: list[PolicyChange] = []
        """Rank 0, data-parallel: the changes taken at the last boundary, applied at this one."""
        self.apply_after = 1
        """Boundaries from the next one to the one that applies a queued change: 1 in one
        process; 2 in a data-parallel run (rank 0 takes it at the next boundary, and every rank
        applies it at the one after: `take_pending`, `apply`)."""

    @property
    def current(self) -> Policy:
        return self._current

    @property
    def version(self) -> int:
        return self._version

    @property
    def issued(self) -> int:
        """The highest version given to any change so far (queued, applied or dropped)."""
        return self._issued

    def add_validator(self, validator: Validator) -> None:
        """A runtime part's extra check (raises PolicyError), run on every proposed policy."""
        self._validators.append(validator)

    def propose(self, changes: Mapping[str, Any], *, client: str = "local",
                requested_at: float | None = None, reason: str = "",
                version: int | None = None, not_before: int = 0) -> PolicyChange:
        """Validate `changes` over the newest policy and queue them; raises PolicyError, or
        PolicyBusy while another change is staged. `requested_at`, `version`, `not_before`:
        those a stored change was given (queued again when its run resumes), see `stage`."""
        return self.queue(self.stage(changes, client=client, requested_at=requested_at,
                                     reason=reason, version=version, not_before=not_before))

    def stage(self, changes: Mapping[str, Any], *, client: str = "local",
              requested_at: float | None = None, reason: str = "", wait: float = 0.0,
              if_newest: int | None = None, version: int | None = None,
              not_before: int = 0) -> PolicyChange:
        """Validate `changes` over the newest policy and give the change a new version; it
        is queued by `queue` (or given up by `drop`). Raises PolicyError (invalid), PolicyBusy
        (another change stays staged for more than `wait` seconds), PolicyMoved (`if_newest`
        given and the newest version is another: a change was queued since). `version` and
        `not_before`: the version and effective step a stored change was given (queued again
        when its run resumes): the version is above the newest, and the change takes effect
        from `not_before` or the first step after it that a boundary can still reach.

        The validators run with no lock held (one may touch the disk), so a step boundary
        never waits on them; the staged slot keeps other proposals out meanwhile."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise PolicyError(unknown[0], f"unknown field; allowed: {', '.join(FIELDS)}")
        with self._lock:
            if not self._slot_free.wait_for(lambda: not self._claimed, timeout=wait):
                raise PolicyBusy("another policy change is being stored; try again")
            if if_newest is not None and if_newest != self._newest_version:
                raise PolicyMoved(f"version {self._newest_version} was queued since")
            self._claimed = True
            base = self._newest
        try:
            try:
                proposed = dataclasses.replace(base, **changes)
            except TypeError as err:  # pragma: no cover - unknown fields are caught above
                raise PolicyError("policy", str(err)) from err
            for validator in self._validators:
                validator(proposed)
        except BaseException:
            self._release()
            raise
        diff = {k: (getattr(base, k), v) for k, v in changes.items() if getattr(base, k) != v}
        with self._lock:
            if version is not None and version <= self._newest_version:
                self._claimed = False
                self._slot_free.notify()
                raise ValueError(f"version {version} is not above {self._newest_version}")
            self._issued = self._issued + 1 if version is None else max(self._issued, version)
            change = PolicyChange(version=self._issued if version is None else version,
                                  effective_step=self._first_free_step(not_before),
                                  diff=diff, client=client,
                                  requested_at=time.time() if requested_at is None
                                  else requested_at, reason=reason)
            self._staged = (change, proposed, not_before)
        return change

    def _first_free_step(self, not_before: int) -> int:
        """The step a change queued now takes effect from (lock held): the first a boundary
        can still reach, not before `not_before` nor before the changes queued ahead of it."""
        ahead = self._pending[-1][0].effective_step if self._pending else 0
        return max(self._last_boundary + 1 + self.apply_after, ahead, not_before)

    def queue(self, change: PolicyChange) -> PolicyChange:
        """Queue the staged `change` for the next step boundary; returns it with the step it
        takes effect from (boundaries may have passed while it was stored)."""
        with self._lock:
            if self._staged is None or self._staged[0] is not change:
                raise RuntimeError(f"policy version {change.version} is not the staged change")
            _, policy, not_before = self._staged
            self._newest, self._newest_version = policy, change.version
            change = dataclasses.replace(change,
                                         effective_step=self._first_free_step(not_before))
            self._pending.append((change, policy))
            self._staged, self._claimed = None, False
            self._slot_free.notify()
        return change

    def drop(self, change: PolicyChange) -> None:
        """Give up the staged `change` (it could not be stored); its version is not reused."""
        with self._lock:
            if self._staged is not None and self._staged[0] is change:
                self._staged, self._claimed = None, False
                self._slot_free.notify()

    def _release(self) -> None:
        with self._lock:
            self._claimed = False
            self._slot_free.notify()

    @contextmanager
    def proposing(self, changes: Mapping[str, Any], *, client: str = "local",
                  requested_at: float | None = None, reason: str = "",
                  wait: float = 0.0) -> Iterator[PolicyChange]:
        """`stage`, then the caller's block, then `queue`: not queued at all if the block
        raises. No lock is held while the block runs (the staged slot keeps other proposals
        out), so a block that stores the change makes no step boundary wait:

            with live.proposing({"staleness_bound": 3}, client=who) as change:
                store.add_policy_change(run_id, change)"""
        change = self.stage(changes, client=client, requested_at=requested_at, reason=reason,
                            wait=wait)
        try:
            yield change
        except BaseException:
            self.drop(change)
            raise
        self.queue(change)

    def _due(self, effective_step: int) -> list[tuple[PolicyChange, Policy]]:
        """Out of the queue (lock held): the changes that take effect by `effective_step`."""
        due = list(itertools.takewhile(lambda queued: queued[0].effective_step <= effective_step,
                                       self._pending))
        self._pending = self._pending[len(due):]
        return due

    def apply_pending(self, step: int) -> list[PolicyChange]:
        """At the boundary after `step`: make the queued changes due by step + 1 current."""
        with self._lock:
            self._last_boundary = step
            due = self._due(step + 1)
            if not due:
                return []
            applied = [dataclasses.replace(c, effective_step=step + 1, applied_at=time.time())
                       for c, _ in due]
            self._current, self._version = due[-1][1], due[-1][0].version
            self._history.extend(applied)
        return applied

    def take_pending(self, step: int) -> tuple[Policy, int, list[PolicyChange]]:
        """Data-parallel, on rank 0 at the boundary after `step`: the changes due by step + 2,
        out of the queue, with the policy and version they make, for every rank to `apply` at
        the next boundary (they stay `pending()` until then)."""
        with self._lock:
            self._last_boundary = step
            due = self._due(step + 2)
            self._taken = [change for change, _ in due]
            if not due:
                return self._current, self._version, []
            return due[-1][1], due[-1][0].version, list(self._taken)

    def apply(self, policy: Policy, version: int, changes: list[PolicyChange],
              step: int) -> list[PolicyChange]:
        """Data-parallel, on every rank at the boundary after `step`: make `policy` (`version`)
        current from step + 1 on, with `changes` recorded as applied there. It leaves the
        boundary that promises an effective step alone: rank 0 takes this boundary's changes
        after it (`take_pending`), so a change queued in between is taken now, not next time."""
        with self._lock:
            applied = [dataclasses.replace(c, effective_step=step + 1, applied_at=time.time())
                       for c in changes]
            self._current, self._version = policy, version
            if version > self._newest_version:  # a rank that proposes nothing follows rank 0
                self._newest, self._newest_version = policy, version
            self._issued = max(self._issued, version)
            self._taken = []
            self._history.extend(applied)
        return applied

    def history(self) -> list[PolicyChange]:
        with self._lock:
            return list(self._history)

    def applied_after(self, version: int) -> list[PolicyChange]:
        """The changes applied so far whose version is above `version`, oldest first."""
        with self._lock:
            newer = []
            for change in reversed(self._history):
                if change.version <= version:
                    break
                newer.append(change)
            return newer[::-1]

    def pending(self) -> list[PolicyChange]:
        with self._lock:
            return [*self._taken, *(change for change, _ in self._pending)]
