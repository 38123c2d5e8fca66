"""torchrun's environment, read in one place: this process's rank of how many, and inside its
node. The trainer, the data-parallel topology and the command line's logging set-up (only
rank 0 logs routine lines) all read this one `Ranks`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Ranks:
    """Where this process is in the job: rank and world, and inside its node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1

    @property
    def parallel(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes the run's outputs."""
        return self.rank == 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 group: tuple[int, int] | None = None) -> Ranks:
        """torchrun's layout (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE); one rank when
        WORLD_SIZE is unset or 1. `group` is (world, rank) of a process group already
        initialized (a script may start one itself): it stands for WORLD_SIZE and RANK, and the
        node's layout defaults to the whole world on one node. ValueError naming the variable
        when the environment is not a torchrun layout."""
        env = os.environ if environ is None else environ
        if group is not None:
            world, rank = group
        else:
            world = _int_env(env, "WORLD_SIZE", 1)
            if world <= 1:
                return cls()
            rank = _int_env(env, "RANK", -1)
        local_rank = _int_env(env, "LOCAL_RANK", rank)
        local_world = _int_env(env, "LOCAL_WORLD_SIZE", world)
        if not (0 <= rank < world and 0 <= local_rank < local_world <= world):
            raise ValueError(f"torchrun environment: got RANK {rank}, WORLD_SIZE {world}, "
                             f"LOCAL_RANK {local_rank}, LOCAL_WORLD_SIZE {local_world}; "
                             "allowed: 0 <= RANK < WORLD_SIZE and 0 <= LOCAL_RANK < "
                             "LOCAL_WORLD_SIZE <= WORLD_SIZE (launch with torchrun)")
        return cls(rank, world, local_rank, local_world)

    def describe(self) -> str:
        return f"rank {self.rank} of {self.world} ({self.local_world} per node)"


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name, "")
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"torchrun environment: {name} is {text!r}; allowed: an integer") \
            from None
