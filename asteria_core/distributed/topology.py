"""Who owns which preconditioner block, on which node: torchrun's layout of ranks.

torchrun numbers ranks node by node (rank = node_rank * LOCAL_WORLD_SIZE + LOCAL_RANK), so a
node is a contiguous range of ranks and its leader is the first of them. Owners are assigned by
cost-balanced greedy packing (a refresh costs about b^3 for a block of side b): the most
expensive block first, to the node with the least refresh work so far, and inside it to the
least loaded rank, so each node's share and each rank's share of refresh work are balanced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from asteria_core.optim.seam import BlockInfo, BlockKey
from asteria_core.torchrun import Ranks


@dataclass(frozen=True, slots=True)
class Topology:
    world: int
    rank: int
    local_world: int
    """Ranks per node (every node has the same number, as torchrun launches them)."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world or self.local_world < 1 or \
                self.world % self.local_world:
            raise ValueError(f"topology: rank {self.rank} of world {self.world} with "
                             f"{self.local_world} ranks per node is not a torchrun layout")

    @classmethod
    def from_env(cls, world: int, rank: int) -> Topology:
        """torchrun's LOCAL_WORLD_SIZE (the whole world on one node when it is unset)."""
        local = Ranks.from_env(group=(world, rank)).local_world
        return cls(world=world, rank=rank, local_world=local)

    @property
    def nodes(self) -> int:
        return self.world // self.local_world

    def node_of(self, rank: int) -> int:
        return rank // self.local_world

    @property
    def node(self) -> int:
        return self.node_of(self.rank)

    def ranks_of(self, node: int) -> list[int]:
        return list(range(node * self.local_world, (node + 1) * self.local_world))

    def leader(self, node: int) -> int:
        return node * self.local_world

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader(self.node)


def assign_owners(blocks: Iterable[BlockInfo], topology: Topology) -> dict[BlockKey, int]:
    """Owner rank of every block: the same answer on every rank (it depends on the blocks and
    the topology only). Ties go to the lower node and rank."""
    node_load = [0.0] * topology.nodes
    rank_load = [0.0] * topology.world
    owners: dict[BlockKey, int] = {}
    for block in sorted(blocks, key=lambda b: (-b.cost, b.key)):
        node = min(range(topology.nodes), key=lambda n: (node_load[n], n))
        rank = min(topology.ranks_of(node), key=lambda r: (rank_load[r], r))
        node_load[node] += block.cost
        rank_load[rank] += block.cost
        owners[block.key] = rank
    return owners
