"""Attach a runtime to a data-parallel job: the distributed package's own step.

`data_parallel` decides whether this process is one rank of a job (torch.distributed
initialized with more than one rank). If so, the runtime takes rank 0's run id first
(`shared_run_id`: the run's folder and telemetry are named by it), then `attach` builds what the
rank adds, in the same order on every rank (each builds process groups): the policy sync, and
either the version exchange (replicated parameters: each block has an owner rank, whose bases
travel) or, under FSDP2 or with a first-order optimizer, this rank's own figures (no basis
travels; the policy sync's bytes are still counted).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from asteria_core.distributed.exchange import VersionExchange
from asteria_core.distributed.policy_sync import PolicySync
from asteria_core.distributed.rebalance import Rebalancer
from asteria_core.distributed.sharded import DistributedState, ShardedState, UpdateDtype
from asteria_core.distributed.topology import Topology, assign_owners
from asteria_core.optim.base import BlockPreconditioner, local_shard
from asteria_core.policy import LivePolicy, Policy, PolicyError, SwapMode
from asteria_core.telemetry.records import DistributedFigures
from asteria_core.telemetry.reporter import Reporter


@dataclass
class DataParallel:
    """What one rank adds to its runtime."""

    world: int
    policy_sync: PolicySync
    exchange: VersionExchange | None
    """The version exchange of a replicated second-order optimizer (None: AdamW, or FSDP2)."""
    own: DistributedFigures | None
    """This rank's figures when no basis travels: FSDP2 (it refreshes its own shards' blocks),
    the sharded mode (its own parameters' blocks) or a first-order optimizer (no blocks). None
    with a version exchange."""
    sharded_state: ShardedState | None = None
    """The sharded mode (distributed/sharded.py): parameters have owners, updates travel."""
    rebalancer: Rebalancer | None = None
    """Replicated mode with rebalancing on: owners move off a straggler (rebalance.py)."""

    def at_boundary(self, step: int) -> DistributedFigures:
        """The distributed stage of the boundary: ownership moves (when on), then figures."""
        if self.rebalancer is not None:
            self.rebalancer.at_boundary(step)
        return self.figures()

    def before_step(self) -> None:
        if self.sharded_state is not None:
            self.sharded_state.before_step()

    def after_step(self) -> None:
        if self.sharded_state is not None:
            self.sharded_state.after_step()

    def figures(self) -> DistributedFigures:
        """The record's `distributed` section at a boundary: every byte the runtime's
        collectives moved (bases and headers, the policy sync)."""
        figures = self.exchange.figures() if self.exchange is not None else self.own
        assert figures is not None  # `own` counts them where there is no exchange
        movers = [m for m in (self.policy_sync, self.sharded_state, self.rebalancer)
                  if m is not None]
        return dataclasses.replace(
            figures, bytes_sent=figures.bytes_sent + sum(m.bytes_sent for m in movers),
            bytes_received=figures.bytes_received + sum(m.bytes_received for m in movers))

    def close(self) -> None:
        """Complete what every rank posted and release each part's groups: the exchange's
        thread first (it may still be moving a basis), the policy sync last."""
        try:
            if self.exchange is not None:
                self.exchange.close()
            if self.rebalancer is not None:
                self.rebalancer.close()
            if self.sharded_state is not None:
                self.sharded_state.close()
        finally:
            self.policy_sync.close()


def data_parallel(distributed: bool | None) -> bool:
    """Whether this process is one rank of a data-parallel job (`distributed`: True demands
    it, False refuses it, None decides by torch.distributed)."""
    running = dist.is_available() and dist.is_initialized()
    if distributed and not running:
        raise ValueError("distributed: got True, but torch.distributed is not initialized; "
                         "launch with torchrun and call init_process_group first")
    return distributed is not False and running and dist.get_world_size() > 1


def attach(optimizer: torch.optim.Optimizer, policy: LivePolicy, reporter: Reporter,
           state: DistributedState = DistributedState.REPLICATED,
           update_dtype: UpdateDtype = UpdateDtype.EXACT) -> DataParallel:
    """This rank's part of the job (call on every rank, in the same order: it makes groups).
    `state` replicated: a second-order optimizer keeps factors only for the blocks this rank
    owns, bases travel; sharded: the state of the parameters this rank owns, updates travel in
    `update_dtype` (distributed/sharded.py). Both values come checked from RuntimeConfig."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    sharded = any(local_shard(p) is not p for p in params)
    if sharded and state == DistributedState.SHARDED:
        raise ValueError("distributed_state: got 'sharded', but the parameters are FSDP2 "
                         "shards, whose state is sharded already; allowed: replicated")
    rank, world = dist.get_rank(), dist.get_world_size()
    policy_sync = PolicySync(policy, rank, world, reporter)
    if state == DistributedState.SHARDED:
        sharded_state = ShardedState(optimizer, rank, world, update_dtype)
        owned = set(sharded_state.owned_indices())
        return DataParallel(world, policy_sync, None, _own_figures(optimizer, owned),
                            sharded_state)
    if isinstance(optimizer, BlockPreconditioner) and not sharded:
        exchange = _exchange_for(optimizer, policy)
        optimizer.keeps_factor = exchange.owns  # only owners keep factors
        return DataParallel(dist.get_world_size(), policy_sync, exchange, None)
    return DataParallel(dist.get_world_size(), policy_sync, None, _own_figures(optimizer))


def _own_figures(optimizer: torch.optim.Optimizer,
                 params: set[int] | None = None) -> DistributedFigures:
    """No basis travels: under FSDP2 this rank refreshes the blocks of its own shards (or of
    `params`, the sharded mode's); a first-order optimizer has none."""
    topology = Topology.from_env(dist.get_world_size(), dist.get_rank())
    blocks = len([b for b in optimizer.refresh_blocks()
                  if params is None or b.key.param in params]) \
        if isinstance(optimizer, BlockPreconditioner) else 0
    return DistributedFigures(rank=topology.rank, world=topology.world, node=topology.node,
                              owned_blocks=blocks, bytes_sent=0, bytes_received=0)


def shared_run_id(run_id: str) -> str:
    """Rank 0's run id on every rank: one run, whatever each rank made up alone."""
    shared = [run_id]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def _exchange_for(optimizer: BlockPreconditioner, policy: LivePolicy) -> VersionExchange:
    """This rank's version exchange: owners from the blocks and torchrun's topology."""
    _deterministic(policy.current)
    policy.add_validator(_deterministic)
    topology = Topology.from_env(dist.get_world_size(), dist.get_rank())
    return VersionExchange(topology, assign_owners(optimizer.refresh_blocks(), topology))


def _deterministic(policy: Policy) -> None:
    if policy.swap_mode != SwapMode.DETERMINISTIC:
        raise PolicyError("swap_mode", f"got {policy.swap_mode!r}; allowed: deterministic in a "
                          "data-parallel run (every rank swaps a new basis at one step)")
