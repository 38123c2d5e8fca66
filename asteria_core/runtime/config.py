"""What a `Runtime` is built with besides the optimizer and the model: one object, so the
trainer, `asteria.optimizer()` and a user's script pass the same thing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from asteria_core.autopilot import AutopilotConfig
from asteria_core.distributed.sharded import DISTRIBUTED_STATES, UPDATE_DTYPES
from asteria_core.optim.seam import FactorSnapshot, RefreshConfig, RefreshResult
from asteria_core.optim.seam import refresh_fn as default_refresh_fn
from asteria_core.policy import LivePolicy, Policy
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
    distributed_state: str = "replicated"
    """Data-parallel runs: replicated (every rank keeps every basis and moment, owners' new
    bases travel once per refresh: few bytes) | sharded (each rank keeps and updates only its
    own parameters' state, the updates travel every step: about 1/W of the state).
    distributed/sharded.py; the README's table says which to pick."""
    update_dtype: str = "exact"
    """The sharded mode's updates travel as: exact (the parameters' own values) | bf16 (the
    change rounded to bfloat16, which every rank applies alike: half float32's bytes)."""
    rebalance_rounds: int = 0
    """Replicated data-parallel runs: every this many refresh rounds the ranks share their
    refresh speed and block ownership moves off a rank that refreshes slowly (a straggler), and
    back when it recovers (distributed/rebalance.py); 0: owners never move."""
    refresh_fn: RefreshFn = default_refresh_fn
    """The refresh math (the seam; a test may slow it down)."""
    coherence_threshold: float = 0.0
    """Skip (and in a data-parallel run, do not send) a refresh whose basis moved less than
    this (1 - the mean |cosine| between new and old basis vectors; 0 swaps every refresh)."""
    autopilot: AutopilotConfig | None = None
    """The autopilot's mode, objective and bounds (asteria_core/autopilot; default: off, which
    the control plane or `runtime.autopilot.set_mode` may turn on mid-run). Second-order
    optimizers only: AdamW has no refresh policy to tune."""
    worker_cpus: frozenset[int] | None = None
    """The CPUs the refresh workers run on (None: those of the thread that builds the runtime).
    """

    def __post_init__(self) -> None:
        if self.distributed_state not in DISTRIBUTED_STATES:
            raise ValueError(f"distributed_state: got {self.distributed_state!r}; allowed: "
                             f"{' | '.join(DISTRIBUTED_STATES)}")
        if self.update_dtype not in UPDATE_DTYPES:
            raise ValueError(f"update_dtype: got {self.update_dtype!r}; allowed: "
                             f"{' | '.join(UPDATE_DTYPES)}")
        rounds = self.rebalance_rounds
        if not isinstance(rounds, int) or isinstance(rounds, bool) or not 0 <= rounds <= 10**6:
            raise ValueError(f"rebalance_rounds: got {rounds!r}; allowed: an integer in "
                             "[0, 1000000] (0: owners never move)")
