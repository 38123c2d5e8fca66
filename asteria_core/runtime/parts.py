"""The runtime's parts: which ones an optimizer and a config call for, built and wired together.

A data-parallel run first attaches this rank (distributed/attach.py). A second-order optimizer
(`BlockPreconditioner`) then gets its refresh engine, which runs refreshes off the critical path
under the policy (trading bases through the rank's version exchange), the tier store, which
gives its state a home tier, the rebalancer, when configured, which moves block owners off a
straggler, and the autopilot, which tunes the policy from the records. A first-order optimizer
gets none of these.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import torch

from asteria_core.autopilot import Autopilot, AutopilotConfig
from asteria_core.distributed.attach import DataParallel, attach
from asteria_core.distributed.rebalance import Rebalancer
from asteria_core.distributed.topology import Topology
from asteria_core.machine import MACHINE
from asteria_core.optim.base import BlockPreconditioner
from asteria_core.policy import LivePolicy
from asteria_core.refresh import RefreshEngine
from asteria_core.runtime.config import RuntimeConfig
from asteria_core.telemetry.reporter import RunReporter
from asteria_core.tiers import TierStore


class Parts(NamedTuple):
    data_parallel: DataParallel | None
    """This rank's part of a data-parallel job, None alone."""
    refresh: RefreshEngine | None
    tiers: TierStore | None
    autopilot: Autopilot | None


def build_parts(optimizer: torch.optim.Optimizer, config: RuntimeConfig, policy: LivePolicy,
                reporter: RunReporter, run_dir: Path, *, parallel: bool) -> Parts:
    """The parts, in the order they need each other (`parallel`: this process is one rank of a
    data-parallel job)."""
    data_parallel = attach(optimizer, policy, reporter, config.distributed_state,
                           config.update_dtype) if parallel else None
    if not isinstance(optimizer, BlockPreconditioner):
        return Parts(data_parallel, None, None, None)
    exchange = data_parallel.exchange if data_parallel is not None else None
    engine = RefreshEngine(optimizer, policy, reporter, fn=config.refresh_fn, exchange=exchange,
                           skip_below=config.coherence_threshold,
                           worker_cpus=config.worker_cpus)
    tiers = TierStore(optimizer, policy, run_dir, reporter)
    if config.rebalance_rounds > 0 and exchange is not None:
        assert data_parallel is not None  # it holds the exchange
        rounds = config.rebalance_rounds
        data_parallel.rebalancer = Rebalancer(
            optimizer, exchange, lambda: (engine.computed_seconds, engine.computed_cost),
            reporter, lambda: rounds * policy.current.refresh_interval,
            can_move=engine.reads_done)
    autopilot = Autopilot(
        policy, config.autopilot or AutopilotConfig(),
        decides=data_parallel is None or data_parallel.policy_sync.rank == 0,
        cores=MACHINE.rank_cores(local_ranks(data_parallel)))
    return Parts(data_parallel, engine, tiers, autopilot)


def local_ranks(data_parallel: DataParallel | None) -> int:
    """Data-parallel ranks on this machine (torchrun's layout; 1 for a single process)."""
    if data_parallel is None:
        return 1
    return Topology.from_env(data_parallel.world, data_parallel.policy_sync.rank).local_world
