"""Sharded optimizer state: each rank keeps, updates and sends only the parameters it owns.

The replicated mode (exchange.py) splits only the factor statistics: every rank keeps every
basis and every moment and applies every update itself, and a refresh's new basis travels once
per round (few bytes, state about one process's). The sharded mode
(`RuntimeConfig(distributed_state="sharded")`) trades the other way, as Distributed Shampoo's
DDP distributor and ZeRO-1 do: a parameter has one owner rank (`assign_param_owners`, the same
answer on every rank). Before the optimizer's step the other ranks drop its gradient (an
optimizer skips a parameter without one, so they never make state for it); after the step the
owner broadcasts it, on a group of its own over the parameters' device's backend (NCCL for CUDA
tensors, which gloo would stage through host memory every step; gloo for host tensors), made at
the first step, once the parameters are where they train, and every rank takes it:

- `update_dtype="exact"`: the new values, in the parameter's own dtype;
- `update_dtype="bf16"`: the step's change rounded to bfloat16 (half the bytes of float32),
  which every rank, the owner included, adds to the value before the step, so replicas stay
  identical bit for bit.

Each rank refreshes its own parameters' blocks on its own workers: no basis travels. Per rank and
step it sends its parameters to the W - 1 others and receives theirs, about the model's bytes x
2 (W - 1) / W in all, Distributed Shampoo's all-gather; its state is about 1/W of one process's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from asteria_core.compat import Choice
from asteria_core.distributed.process_group import release_group
from asteria_core.optim.base import BlockPreconditioner


class DistributedState(Choice):
    """How a data-parallel run's ranks keep the optimizer state."""

    REPLICATED = "replicated"
    SHARDED = "sharded"


class UpdateDtype(Choice):
    """What the sharded mode's updates travel as."""

    EXACT = "exact"
    BF16 = "bf16"


UPDATE_DTYPES = {UpdateDtype.EXACT: None, UpdateDtype.BF16: torch.bfloat16}


def device_backend(device: torch.device) -> str:
    """The collective backend for tensors on `device`: torch's own map (cuda: nccl, cpu:
    gloo)."""
    backends = dist.Backend.default_device_backend_map
    if device.type not in backends:
        raise ValueError(f"device: got {device}; the sharded mode's collectives run on "
                         f"{' | '.join(backends)}")
    return backends[device.type]


def state_cost(optimizer: torch.optim.Optimizer, index: int, p: torch.Tensor) -> int:
    """Bytes of state parameter `index` will hold: the optimizer's own dry run where it has one
    (a block preconditioner: moments, factors, bases), else two moments (Adam's)."""
    if isinstance(optimizer, BlockPreconditioner):
        return sum(t.numel() * t.element_size() for t in _tensors(optimizer.state_spec(index)))
    return 2 * p.numel() * p.element_size()


def _tensors(state):
    """Every tensor in a state dict (tiers.lifecycle.leaves does this a layer above us)."""
    if isinstance(state, torch.Tensor):
        yield state
    elif isinstance(state, dict | list | tuple):
        for v in state.values() if isinstance(state, dict) else state:
            yield from _tensors(v)


def assign_param_owners(costs: Sequence[int], world: int) -> list[int]:
    """Owner rank of every parameter: the largest state first, to the rank holding the least so
    far (ties to the lower rank and the earlier parameter). The same on every rank."""
    load = [0] * world
    owners = [0] * len(costs)
    for index in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        load[rank] += costs[index]
        owners[index] = rank
    return owners


class ShardedState:
    """One rank's part of the sharded mode (create it on every rank, in the same order)."""

    def __init__(self, optimizer: torch.optim.Optimizer, rank: int, world: int,
                 update_dtype: UpdateDtype = UpdateDtype.EXACT) -> None:
        if update_dtype not in UPDATE_DTYPES:
            raise ValueError(f"update_dtype: got {update_dtype!r}; allowed: "
                             f"{' | '.join(UPDATE_DTYPES)}")
        self.rank, self.world = rank, world
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.owners = assign_param_owners(
            [state_cost(optimizer, i, p) for i, p in enumerate(self.params)], world)
        self.update_dtype = UPDATE_DTYPES[update_dtype]
        self._by_owner = [[p for p, o in zip(self.params, self.owners, strict=True) if o == r]
                          for r in range(world)]
        """Each rank's parameters, in order: what its broadcast carries, one buffer each."""
        if self.update_dtype is None and any(
                len({p.dtype for p in mine}) > 1 for mine in self._by_owner):
            raise TypeError("the sharded mode sends one owner's parameters in one buffer: "
                            "with update_dtype exact they must share a dtype")
        self.bytes_sent = 0
        self.bytes_received = 0
        self._group: dist.ProcessGroup | None = None
        """Made at the first step, over the device's backend (`step_group`)."""
        self.backend: str | None = None
        self._before: list[torch.Tensor] = []

    def owns(self, index: int) -> bool:
        return self.owners[index] == self.rank

    def owned_indices(self) -> list[int]:
        return [i for i in range(len(self.params)) if self.owns(i)]

    @torch.no_grad()
    def before_step(self) -> None:
        """Drop the gradients of parameters other ranks own; keep the values before the step of
        this rank's own (bf16: the change is what travels)."""
        for i, p in enumerate(self.params):
            if not self.owns(i):
                p.grad = None
        if self.update_dtype is not None:
            self._before = [self.params[i].detach().clone() for i in self.owned_indices()]

    def step_group(self) -> dist.ProcessGroup:
        """The group of the per-step broadcasts, made on first use (collective: every rank
        reaches its first step's end, in the same order with respect to other groups)."""
        if self._group is None:
            device = self.params[0].device if self.params else torch.device("cpu")
            self.backend = device_backend(device)
            self._group = dist.new_group(backend=self.backend)
        return self._group

    def close(self) -> None:
        """Release the step group (its broadcasts are synchronous: none is in flight)."""
        release_group(self._group)
        self._group = None

    @torch.no_grad()
    def after_step(self) -> None:
        """Every owner's parameters to every rank: one broadcast per owner, in rank order."""
        group = self.step_group()
        for owner, mine in enumerate(self._by_owner):
            if not mine:
                continue
            dtype = self.update_dtype or mine[0].dtype
            numel = sum(p.numel() for p in mine)
            if owner == self.rank:
                flat = self._outgoing(mine, dtype)
            else:
                flat = torch.empty(numel, dtype=dtype, device=mine[0].device)
            dist.broadcast(flat, src=owner, group=group)
            nbytes = numel * flat.element_size()
            if owner == self.rank:
                self.bytes_sent += nbytes * (self.world - 1)
            else:
                self.bytes_received += nbytes
            self._take(mine, flat, owner)
        self._before = []

    def _outgoing(self, mine: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        if self.update_dtype is None:
            return torch.cat([p.detach().reshape(-1) for p in mine]).to(dtype)
        return torch.cat([(p.detach() - before).reshape(-1)
                          for p, before in zip(mine, self._before, strict=True)]).to(dtype)

    def _take(self, mine: list[torch.Tensor], flat: torch.Tensor, owner: int) -> None:
        """Set the parameters from what the owner sent: the values (the owner has them), or the
        value before the step plus the rounded change (the owner too, so every replica holds
        the same bits)."""
        if self.update_dtype is None and owner == self.rank:
            return
        befores = self._before if owner == self.rank else [p.detach() for p in mine]
        offset = 0
        for p, before in zip(mine, befores, strict=True):
            part = flat[offset:offset + p.numel()].view(p.shape)
            offset += p.numel()
            p.copy_(part if self.update_dtype is None else before + part.to(p.dtype))
