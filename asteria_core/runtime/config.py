"""What a `Runtime` is built with besides the optimizer and the model: one object, so the
trainer, `asteria.optimizer()` and a user's script pass the same thing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asteria_core.autopilot import AutopilotConfig
from asteria_core.distributed.sharded import DistributedState, UpdateDtype
from asteria_core.optim.seam import FactorSnapshot, RefreshConfig, RefreshResult
from asteria_core.optim.seam import refresh_fn as default_refresh_fn
from asteria_core.policy import LivePolicy, Policy
from asteria_core.runtime.section import DEFAULTS, check_options
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.reporter import RunReporter

RefreshFn = Callable[[FactorSnapshot, RefreshConfig], RefreshResult]


@dataclass(frozen=True)
class RuntimeConfig:
    policy: Policy | LivePolicy | None = None
    """The live policy (a `LivePolicy` to share one with a control plane); default Policy()."""
    telemetry: TelemetryConfig | None = None
    """Telemetry's config (default: metrics on, no energy estimate)."""
    reporter: RunReporter | None = None
    """Replaces telemetry altogether (`NullReporter()` turns it off)."""
    run_id: str | None = None
    """Default: a new one (time and random suffix); rank 0's on every rank of a data-parallel
    run."""
    run_dir: str | Path | None = None
    """Where the disk tier lives unless the policy names a folder (default runs/<run_id>)."""
    records: str | Path | None = None
    """A JSONL file that gets every step record."""
    optimizer_name: str | None = None
    """The optimizer's name in records and metrics (default: its class name, lowercase)."""
    start_step: int = 0
    """Steps already trained (a resumed run)."""
    distributed: bool | None = None
    """Refresh as one rank of a data-parallel job (owner ranks, bases sent to every rank);
    None decides by whether torch.distributed is initialized with more than one rank."""
    # The runtime's options a run config sets too (its [runtime] section): each one's allowed
    # values, bounds, default and meaning are RuntimeSection's (runtime/section.py).
    distributed_state: DistributedState = DEFAULTS.distributed_state
    """How a data-parallel run's ranks keep the optimizer state (replicated by default)."""
    update_dtype: UpdateDtype = DEFAULTS.update_dtype
    """What the sharded mode's updates travel as (the parameters' exact values by default)."""
    rebalance_rounds: int = DEFAULTS.rebalance_rounds
    """Replicated data-parallel runs: block owners move off a slow rank every this many refresh
    rounds; 0: never."""
    refresh_fn: RefreshFn = default_refresh_fn
    """The refresh math (the seam; a test may slow it down)."""
    coherence_threshold: float = DEFAULTS.coherence_threshold
    """Skip (and in a data-parallel run, do not send) a refresh whose basis moved less than
    this."""
    autopilot: AutopilotConfig | None = None
    """The autopilot's mode, objective and bounds (asteria_core/autopilot; default: off, which
    the control plane or `runtime.autopilot.set_mode` may turn on mid-run). Second-order
    optimizers only: AdamW has no refresh policy to tune."""
    worker_cpus: frozenset[int] | None = None
    """The CPUs the refresh workers run on (None: those of the thread that builds the runtime).
    """

    def __post_init__(self) -> None:
        check_options(self)
