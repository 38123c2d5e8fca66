"""The step record: every figure of one step, in one typed section per component.

The runtime builds a record at each step boundary: the loop's figures (loss, lr, tokens, phase
spans) at the top level, and one section per part of the runtime that has figures of its own:
`timing` (telemetry's idle attribution), `refresh` (the refresh engine), `tiers` (the tier
store), `state` (the optimizer's state bytes) and `energy` (the meters). A section is None when
its part is absent (an AdamW run has no `refresh`, a run without telemetry no `timing`), so "not
reported" is never written as zeros.
Each figure has one name, used by the JSON, the dashboard and docs/metrics.md alike.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class TimingFigures:
    """Telemetry's split of the step's wall time: compute per phase plus idle per cause."""

    compute_seconds: dict[str, float]
    """Seconds of compute per phase: the phase's span minus the waits inside it."""
    idle_seconds: dict[str, float]
    """Seconds waited per cause (refresh_wait, transfer_wait, sync_wait, data_wait, other)."""
    device_busy_ratio: float
    """Compute share of the step's wall time."""


@dataclass(slots=True)
class RefreshFigures:
    """The refresh engine's figures after this step's boundary: the state the next step sees
    (a policy change that took effect at this boundary is in them already)."""

    staleness_max: int
    """Largest staleness over preconditioner blocks, as the next step sees them (steps)."""
    staleness_bound: int
    """S in force from the next step on (steps); staleness_max never exceeds it."""
    queue_depth: int
    """Refreshes queued or running on the workers."""
    background_load: float | None
    """Refresh work per interval over worker capacity, at the steps' own time (their refresh
    waits left out): above 1 the workers cannot keep up. None inline or before any refresh."""
    workers_busy_ratio: float | None
    """Share of worker time spent refreshing (None when refreshes run inline)."""
    failures: int
    """Refreshes that failed so far (the previous basis was kept)."""
    inline_fallbacks: int
    """Refreshes meant for a worker that ran on the training thread so far."""
    worker_deaths: int = 0
    """Worker processes that died unasked so far (each replaced at once, its job requeued)."""
    swap_lead: int | None = None
    """L = d - V + 1: steps from a block's read to its swap, its basis's age when swapped in
    (deterministic mode; None in opportunistic mode or inline with d = 0)."""
    refresh_latency_steps: int | None = None
    """90th percentile, over this rank's last 64 refreshes on workers, of the time from a
    job's release until its result was ready, in steps of their own length (refresh waits
    left out; 1: ready for the next boundary). Above swap_lead the step waits for it
    (refresh_wait). None before any."""


@dataclass(slots=True)
class TierFigures:
    """The tier store's figures after this step's boundary."""

    bytes: dict[str, int]
    """Optimizer-state bytes held per tier (device, host, disk)."""
    capacity_bytes: dict[str, int]
    """Byte budget per tier."""
    prefetch_hit_ratio: float | None
    """Share of off-device state uses whose prefetch was done in time (None: no such use)."""
    transfer_bytes: dict[str, dict[str, int]] = field(default_factory=dict)
    """Bytes moved between tiers since the start, {source tier: {destination tier: bytes}}."""


@dataclass(slots=True)
class StateFigures:
    """The optimizer's state bytes by kind (telemetry/state_bytes.py), counted where its size
    can have changed: the records between two counts carry the last one."""

    bytes: dict[str, int]
    """Bytes per kind (moments, factors, bases, other), wherever the tiers keep them."""
    counted_step: int
    """The step at whose boundary they were counted."""


@dataclass(slots=True)
class EnergyFigures:
    """Energy since telemetry started: per source (nvml, rapl measured; model an estimate), and
    split into the run's device part and its host part, whose sum `total_joules` is the figure
    to compare runs by (it names what it sums in `parts`)."""

    joules: dict[str, float]
    """Per source."""
    to_target_joules: dict[str, float] | None = None
    """Per source; set on the step whose eval loss first reached the configured target."""
    device_joules: float | None = None
    """The run's own GPU (nvml); None when not metered (a CPU run, or no NVML)."""
    host_joules: float | None = None
    """The host side: RAPL where readable, else the model estimate (host_source says which),
    counting every process the run started."""
    host_source: str | None = None
    total_joules: float | None = None
    """device_joules + host_joules, of the parts present."""
    parts: str = ""
    """The sources total_joules sums, '+'-joined: nvml+rapl, nvml+model, rapl, model, ..."""
    to_target_total_joules: float | None = None
    """total_joules at the target (its parts: `parts`), on the step that reached it."""


@dataclass(slots=True)
class AutopilotFigures:
    """The autopilot after this step's boundary (asteria_core/autopilot)."""

    mode: str
    """off | propose | apply."""
    decisions: dict[str, dict[str, int]]
    """Decisions since the start, {policy field: {outcome: count}}; outcomes: proposed,
    applied, accepted, dismissed, rejected."""
    open_proposals: int
    """Proposals waiting for the operator."""


@dataclass(slots=True)
class DistributedFigures:
    """This rank's place in a data-parallel run and what its version exchange moved so far."""

    rank: int
    world: int
    node: int
    owned_blocks: int
    """Preconditioner blocks this rank refreshes (and keeps the factor statistics of)."""
    bytes_sent: int
    """Logical bytes this rank's optimizer collectives sent since the start (payload x
    receivers): new bases with their headers, and the policy sync's (asteria_core/distributed).
    DDP's own gradient all-reduce is not counted: every data-parallel optimizer pays it."""
    bytes_received: int


@dataclass(slots=True)
class StepRecord:
    step: int
    """1-based index of the optimizer step this record describes."""
    time: float
    """Unix time at the end of the step."""
    loss: float | None
    """Training loss of this step's batch (None when the loop did not report one)."""
    lr: float
    """Learning rate used by this step (of the first parameter group)."""
    tokens: int
    """Tokens processed by this step."""
    step_seconds: float
    """Wall time of the step, host side."""
    phase_seconds: dict[str, float]
    """Seconds per phase span (data, forward, backward, optimizer, boundary)."""
    policy_version: int = 1
    """Version of the live policy this step trained under."""
    eval_loss: float | None = None
    """Validation loss, on steps where one was computed."""
    grad_norm: float | None = None
    """Global gradient norm before clipping, when the loop reported one."""
    timing: TimingFigures | None = None
    refresh: RefreshFigures | None = None
    tiers: TierFigures | None = None
    state: StateFigures | None = None
    energy: EnergyFigures | None = None
    distributed: DistributedFigures | None = None
    autopilot: AutopilotFigures | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Figures a user's loop logged itself (`runtime.log(name=value)`), by its own names."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class JsonlWriter:
    """Appends step records to a file, one JSON object per line, flushed per write."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def __call__(self, record: StepRecord) -> None:
        self._file.write(json.dumps(record.to_dict()) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
