"""The built-in trainer as one rank of a data-parallel job launched by torchrun.

    torchrun --nproc-per-node 2 -m asteria_core.cli train --optim.name soap --train.steps 2000

`job_ranks()` reads torchrun's environment (`asteria_core.torchrun.Ranks`); with more than one
rank the trainer initializes the process group (gloo on CPU, NCCL on CUDA with the device
LOCAL_RANK), builds the same initial model on every rank,
draws each rank's own batches (seed + rank, so one step trains world x data.batch_size
sequences), wraps the model in DistributedDataParallel and lets the runtime go data-parallel by
itself, as the run config's `[runtime]` section says (replicated: owner ranks, bases sent in the
background; sharded: each rank steps its own parameters). `check()` refuses, before anything is
built, the combinations such a run can not train, naming the key.

Every rank stops at one step (`StopVote`), checkpoints at one step (its own file: owners hold
the factors of their blocks) and evaluates its share of the validation batches, all-reduced, so
every rank logs the same validation loss. Rank 0 alone writes the run's step records and draws
the progress bar.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from asteria_core.distributed import init_process_group
from asteria_core.distributed.process_group import release_group
from asteria_core.distributed.sharded import DistributedState
from asteria_core.optim.registry import spec_of
from asteria_core.policy import SwapMode
from asteria_core.runtime.section import DEFAULTS
from asteria_core.torchrun import Ranks
from asteria_core.train.checkpoint import CHECKPOINT_NAME
from asteria_core.train.config import DataParallelKind, RunConfig
from asteria_core.validation import ConfigError

T = TypeVar("T")


def job_ranks(environ: Mapping[str, str] | None = None) -> Ranks:
    """This process's place in the job: torchrun's environment, or the process group a script
    initialized itself (its world and rank stand for WORLD_SIZE and RANK)."""
    initialized = dist.is_available() and dist.is_initialized()
    group = (dist.get_world_size(), dist.get_rank()) if initialized else None
    return Ranks.from_env(environ, group)


def check(config: RunConfig, ranks: Ranks) -> None:
    """The combinations a data-parallel run can not train; ConfigError naming the key. Every
    rank reads the same command line, so every rank refuses alike, before any collective."""
    if not ranks.parallel:
        return
    if spec_of(config.optim.name).second_order and \
            config.policy.swap_mode != SwapMode.DETERMINISTIC:
        raise ConfigError(f"policy.swap_mode: got {config.policy.swap_mode!r}; allowed: "
                          "deterministic in a data-parallel run (every rank swaps a new basis "
                          "at one step)")
    if config.policy.disk_dir:
        raise ConfigError(f"policy.disk_dir: got {config.policy.disk_dir!r}; allowed: empty in "
                          "a data-parallel run (every rank keeps its disk tier in its own run "
                          "folder; one folder would be shared by the ranks)")
    for key in ("cpus", "worker_cpus"):
        value = getattr(config.train, key)
        if value and ranks.local_world > 1:
            raise ConfigError(f"train.{key}: got {value!r}; allowed: empty in a run of "
                              f"{ranks.local_world} ranks per node (every rank would be pinned "
                              "to the same CPUs; train.split_cpus gives each its own)")
    if config.train.data_parallel == DataParallelKind.FSDP2 and \
            config.runtime.distributed_state != DistributedState.REPLICATED:
        raise ConfigError(f"runtime.distributed_state: got {config.runtime.distributed_state!r} "
                          "with train.data_parallel fsdp2; allowed: replicated (FSDP2's "
                          "parameters are shards already, and so is their state)")


def rank_cpus(cpus: list[int], ranks: Ranks) -> set[int]:
    """This rank's equal share of a node's `cpus` (train.split_cpus): rank r of the node takes
    the r-th share; one CPU each, in turn, where there are fewer CPUs than ranks."""
    share = len(cpus) // ranks.local_world
    if share == 0:
        return {cpus[ranks.local_rank % len(cpus)]}
    return set(cpus[ranks.local_rank * share:(ranks.local_rank + 1) * share])


def wrap(model: torch.nn.Module, kind: DataParallelKind,
         device: torch.device) -> torch.nn.Module:
    """What a data-parallel step runs. DDP: a wrapper that broadcasts rank 0's parameters and
    all-reduces gradients. FSDP2: `model` itself, sharded in place (each transformer block a
    unit of its own, the rest, the tied embedding included, the root's), whose parameters
    become this rank's shards: build the optimizer after it."""
    if kind == DataParallelKind.FSDP2:
        from torch.distributed.fsdp import fully_shard

        for block in getattr(model, "blocks", ()):
            fully_shard(block)
        fully_shard(model)  # shards in place; the module keeps its type (and gains FSDPModule)
        return model
    return DistributedDataParallel(model, device_ids=[device.index]
                                   if device.type == "cuda" else None)


def eval_share(batches: list[T], ranks: Ranks, lockstep: bool) -> list[tuple[T, bool]]:
    """This rank's validation batches, every world-th, each with whether it counts. Under FSDP2
    every forward is a collective, so with `lockstep` each rank runs as many forwards as the
    rank with the most (an extra one repeats its first batch and is not counted)."""
    mine = [(b, True) for b in batches[ranks.rank::ranks.world]]
    if not lockstep or not batches:
        return mine
    most = -(-len(batches) // ranks.world)
    return mine + [(batches[0], False)] * (most - len(mine))


def refuse_disk_dir(policy) -> None:
    """A live-policy validator: the disk tier's folder stays per rank (see `check`)."""
    from asteria_core.policy import PolicyError

    if policy.disk_dir:
        raise PolicyError("disk_dir", f"got {policy.disk_dir!r}; allowed: empty in a "
                          "data-parallel run (every rank keeps its disk tier in its own folder)")


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """The device of this rank: on CUDA the one numbered LOCAL_RANK."""
    if not ranks.parallel or device.type != "cuda":
        return device
    count = torch.cuda.device_count()
    if ranks.local_rank >= count:
        raise ValueError(f"train.device: local rank {ranks.local_rank} needs CUDA device "
                         f"{ranks.local_rank}, but this node has {count}; allowed: at most "
                         f"{count} ranks per node (torchrun --nproc-per-node), or cpu")
    device = torch.device("cuda", ranks.local_rank)
    torch.cuda.set_device(device)
    return device


def init_group(device: torch.device, ranks: Ranks) -> bool:
    """Initialize the default process group for this device (gloo on CPU, NCCL on CUDA) unless
    a script did; True when this call created it (the trainer then destroys it)."""
    if not ranks.parallel:
        return False
    if dist.is_initialized():
        backend = str(dist.get_backend()).lower()
        if device.type != "cuda" and "nccl" in backend:
            raise ValueError(f"train.device: got {device.type!r}, but the process group's "
                             f"backend is {backend} (CUDA tensors only); allowed: cuda or auto")
        return False
    init_process_group("nccl" if device.type == "cuda" else "gloo")  # restartable in place
    return True


def share(value: T) -> T:
    """Rank 0's value on every rank (a collective: every rank calls it at one point)."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def rank_dir(run_dir: Path, ranks: Ranks) -> Path:
    """Rank 0 writes into the run folder; rank r > 0 into its `rank<r>` sub-folder (its
    checkpoint, its disk tier)."""
    return run_dir if ranks.rank == 0 else run_dir / f"rank{ranks.rank}"


def rank_checkpoint(path: Path, ranks: Ranks) -> Path:
    """This rank's checkpoint beside rank 0's `path`."""
    return path if ranks.rank == 0 else path.parent / f"rank{ranks.rank}" / path.name


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The newest run checkpoint (rank 0's) in a folder of runs, for `train.resume = auto`."""
    found = [p for p in Path(out_dir).expanduser().glob(f"*/{CHECKPOINT_NAME}") if p.is_file()]
    return max(found, key=lambda p: (p.stat().st_mtime_ns, str(p))) if found else None


def check_resume(state: dict, path: Path, ranks: Ranks, distributed_state: str) -> None:
    """A checkpoint resumes only the layout that wrote it: each rank's file holds that rank's
    part of the optimizer state (the blocks it owns, or in the sharded mode its parameters)
    and its data position. (Which step every rank resumes is `train.resume.choose`'s.)"""
    wrote = state.get("ranks", {"world": 1, "local_world": 1})
    world, local = int(wrote["world"]), int(wrote["local_world"])
    if (world, local) != (ranks.world, ranks.local_world):
        raise ValueError(f"train.resume: {path} was written by a run of {world} rank(s), "
                         f"{local} per node; this run has {ranks.world}, {ranks.local_world} per "
                         "node; allowed: a checkpoint of a run launched the same way (every "
                         "rank holds its own part of the optimizer state)")
    # A checkpoint from before the [runtime] section was written by the default mode.
    kept = state.get("config", {}).get("runtime", {}).get("distributed_state",
                                                           DEFAULTS.distributed_state)
    if ranks.parallel and kept != distributed_state:
        raise ValueError(f"runtime.distributed_state: got {distributed_state!r}, but {path} was "
                         f"written by a {kept} run; allowed: {kept} (every rank holds its own "
                         "part of the optimizer state, split as that mode splits it)")


class StopVote:
    """A stop asked on any rank (a signal, rank 0's control plane) ends the run at one step on
    every rank. Each boundary posts this rank's wish in an all-reduce (MAX) on a gloo group of
    its own and reads the previous boundary's outcome, so no step waits for the vote: the run
    stops at most one step after the request, everywhere at the same step."""

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo")
        self._pending: tuple[dist.Work, torch.Tensor] | None = None

    def agreed(self, wish: bool) -> bool:
        """Every rank calls this once per boundary; True when some rank wished to stop one
        boundary ago."""
        stop = False
        if self._pending is not None:
            work, flag = self._pending
            work.wait()
            stop = bool(flag.item())
        flag = torch.tensor([1 if wish else 0], dtype=torch.int32)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True)
        self._pending = (work, flag)
        return stop

    def close(self) -> None:
        """Complete the vote every rank posted last, then release the group."""
        if self._pending is not None:
            self._pending[0].wait()
            self._pending = None
        release_group(self.group)
        self.group = None


def all_reduce_mean(total: torch.Tensor, count: int, device: torch.device) -> float:
    """The mean over every rank of values whose sum here is `total` over `count` items."""
    both = torch.stack([total.detach().float().reshape(()),
                        torch.tensor(float(count), device=total.device)]).to(device)
    dist.all_reduce(both)
    return (both[0] / both[1]).item()
