"""The live-tunable policy: one validated, versioned object.

`Policy` is an immutable value; `LivePolicy` holds the one in force and the changes waiting for
the next step boundary. A change is a partial dict: it is merged into the newest policy,
validated whole (unknown fields, types, ranges, cross-field rules, and any validators the runtime
registers, such as "the disk directory is writable"), and either queued with a new version and the
step at which it takes effect, or rejected whole with a `PolicyError` naming the field. Queued
changes are applied together at one step boundary and recorded in the history.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

SWAP_MODES = ("deterministic", "opportunistic")
PRIORITIES = ("stale_then_cost", "fifo")
WORKER_KINDS = ("thread", "process")
OFFLOAD_MODES = ("none", "host", "disk", "auto")


class PolicyError(ValueError):
    """A policy change is invalid; `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    """What an operator may change while a run trains."""

    refresh_interval: int = 10
    """Steps between refreshes of a preconditioner block."""
    staleness_bound: int = 10
    """S: the most steps a basis in use may lag the statistics it was computed from."""
    swap_delay: int | str = "auto"
    """d <= S: in deterministic mode a basis from step-t statistics is swapped in at t + d.
    "auto" follows the staleness bound (d = S, read at each boundary), which gives pacing the
    most steps to spread a round over; see `delay`."""
    swap_mode: str = "deterministic"
    """deterministic | opportunistic (swap as soon as ready, wait only at the bound)."""
    workers: int = 1
    """Host refresh workers; 0 computes refreshes inline (the native reference)."""
    worker_threads: int = 1
    """torch intra-op threads per refresh worker."""
    worker_kind: str = "thread"
    """thread | process: where refreshes run (processes can be killed when one hangs)."""
    worker_nice: int = 0
    """Scheduling niceness of refresh workers (0-19): above 0 they yield the cores to training
    and fill its idle gaps instead of competing with it."""
    refresh_timeout_ms: int = 30_000
    """How long a step waits at the bound for a late refresh before computing it inline."""
    priority: str = "stale_then_cost"
    """Refresh queue order: stale_then_cost (most stale, then most expensive) | fifo."""
    pace: bool = True
    """Spread each refresh round's jobs over the steps before its swap (min(d, S, refresh
    interval) steps, by cost), so the workers load every step evenly instead of a burst at each
    refresh point. Timing only: the results and the steps they are swapped in at do not change."""
    failure_limit: int = 3
    """Consecutive failed refreshes of one block before the run stops with a checkpoint."""
    device_budget_bytes: int = 0
    """Bytes of optimizer state allowed on the device tier; 0 means no limit."""
    host_budget_bytes: int = 0
    """Bytes of optimizer state allowed on the host tier; 0 means no limit."""
    disk_dir: str = ""
    """Folder of the disk tier; empty means a folder inside the run directory."""
    offload_mode: str = "none"
    """none | host | disk | auto (placement by budgets)."""

    def __post_init__(self) -> None:
        _int_range("refresh_interval", self.refresh_interval, 1, 1_000_000)
        _int_range("staleness_bound", self.staleness_bound, 0, 1_000_000)
        if self.swap_delay != "auto":
            _int_range("swap_delay", self.swap_delay, 0, 1_000_000, also='"auto" or ')
        _choice("swap_mode", self.swap_mode, SWAP_MODES)
        _int_range("workers", self.workers, 0, 256)
        _int_range("worker_threads", self.worker_threads, 1, 256)
        _choice("priority", self.priority, PRIORITIES)
        _choice("worker_kind", self.worker_kind, WORKER_KINDS)
        _int_range("worker_nice", self.worker_nice, 0, 19)
        _int_range("refresh_timeout_ms", self.refresh_timeout_ms, 1, 86_400_000)
        if not isinstance(self.pace, bool):
            raise PolicyError("pace", f"got {self.pace!r}; allowed: true | false")
        _int_range("failure_limit", self.failure_limit, 1, 1_000_000)
        _int_range("device_budget_bytes", self.device_budget_bytes, 0, 2**53)
        _int_range("host_budget_bytes", self.host_budget_bytes, 0, 2**53)
        if not isinstance(self.disk_dir, str):
            raise PolicyError("disk_dir", f"got {self.disk_dir!r}; allowed: a path (string)")
        _choice("offload_mode", self.offload_mode, OFFLOAD_MODES)
        if self.swap_delay != "auto" and self.swap_delay > self.staleness_bound:
            raise PolicyError("swap_delay", f"got {self.swap_delay}; allowed: at most "
                                            f"staleness_bound ({self.staleness_bound})")
        if self.swap_mode == "opportunistic" and self.workers == 0:
            raise PolicyError("workers", "got 0; allowed: at least 1 in opportunistic mode "
                                         "(0 workers computes inline, which is deterministic)")

    @property
    def delay(self) -> int:
        """d in force: `swap_delay`, or the staleness bound when it is "auto"."""
        return self.staleness_bound if self.swap_delay == "auto" else self.swap_delay

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _int_range(field: str, value: Any, lo: int, hi: int, also: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise PolicyError(field, f"got {value!r}; allowed: {also}an integer in [{lo}, {hi}]")


def _choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise PolicyError(field, f"got {value!r}; allowed: {' | '.join(choices)}")


FIELDS = tuple(f.name for f in dataclasses.fields(Policy))


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """One accepted change: its version, its diff, who asked, and when it takes effect."""

    version: int
    effective_step: int
    diff: dict[str, tuple[Any, Any]]
    client: str
    requested_at: float
    applied_at: float | None = None


Validator = Callable[[Policy], None]


class LivePolicy:
    """The policy in force, plus changes queued for the next step boundary (thread-safe)."""

    def __init__(self, initial: Policy | None = None, *, version: int = 1,
                 start_step: int = 0) -> None:
        self._lock = threading.Lock()
        self._current = initial or Policy()
        self._version = version
        self._newest = self._current
        self._newest_version = version
        self._pending: list[PolicyChange] = []
        self._history: list[PolicyChange] = []
        self._last_boundary = start_step
        self._validators: list[Validator] = []
        self._listeners: list[Callable[[PolicyChange], None]] = []

    @property
    def current(self) -> Policy:
        return self._current

    @property
    def version(self) -> int:
        return self._version

    def add_validator(self, validator: Validator) -> None:
        """A runtime part's extra check (raises PolicyError), run on every proposed policy."""
        self._validators.append(validator)

    def add_listener(self, listener: Callable[[PolicyChange], None]) -> None:
        """Called with each change when it is applied (at a step boundary)."""
        self._listeners.append(listener)

    def propose(self, changes: Mapping[str, Any], *, client: str = "local") -> PolicyChange:
        """Validate `changes` over the newest policy and queue them; raises PolicyError."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise PolicyError(unknown[0], f"unknown field; allowed: {', '.join(FIELDS)}")
        with self._lock:
            base = self._newest
            try:
                proposed = dataclasses.replace(base, **changes)
            except TypeError as err:  # pragma: no cover - unknown fields are caught above
                raise PolicyError("policy", str(err)) from err
            for validator in self._validators:
                validator(proposed)
            diff = {k: (getattr(base, k), v) for k, v in changes.items() if getattr(base, k) != v}
            change = PolicyChange(version=self._newest_version + 1,
                                  effective_step=self._last_boundary + 2, diff=diff,
                                  client=client, requested_at=time.time())
            self._newest, self._newest_version = proposed, change.version
            self._pending.append(change)
            return change

    def apply_pending(self, step: int) -> list[PolicyChange]:
        """At the boundary after `step`: make queued changes current, from step + 1 on."""
        with self._lock:
            self._last_boundary = step
            if not self._pending:
                return []
            applied = [dataclasses.replace(c, effective_step=step + 1, applied_at=time.time())
                       for c in self._pending]
            self._pending = []
            self._current, self._version = self._newest, self._newest_version
            self._history.extend(applied)
        for change in applied:
            for listener in self._listeners:
                listener(change)
        return applied

    def history(self) -> list[PolicyChange]:
        with self._lock:
            return list(self._history)

    def pending(self) -> list[PolicyChange]:
        with self._lock:
            return list(self._pending)
