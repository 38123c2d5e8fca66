"""Versioned bases that travel in the background: the owner's refresh result reaches every rank.

Every rank posts the same transfers in the same order: at the boundary of step t, one per block
whose refresh fell due at t, in the order of `due_blocks()` (the same on every rank, since every
rank runs the same steps). A background thread per rank works through them in that order on
process groups of its own (gloo), never on the training stream and never in a step's critical
path; the training thread waits for a transfer only at its swap step, and only if it has not
arrived (`sync_wait`). Because every group sees its collectives in one global order, the
hierarchical broadcast cannot deadlock:

1. inside the owner's node: owner -> the node's ranks (its leader among them);
2. between nodes: the owner's node leader -> the other node leaders;
3. inside every other node: its leader -> its ranks.

A transfer is a header (ok, stats step, base version, which parts follow, dtype) and, when the
refresh succeeded, the new basis and the permutation or transport that the moment swap needs;
when the owner found the basis barely moved (selective coherence), the header alone.
A failed refresh travels as a header with ok = 0, so every rank keeps its basis and counts the
failure at the same step. Bytes are counted as sent by the source of each broadcast (payload x
receivers) and received by each receiver: logical bytes, whatever gloo's algorithm does on the
wire.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from asteria_core.distributed.process_group import release_group
from asteria_core.distributed.topology import Topology
from asteria_core.optim.seam import BlockKey, RefreshResult
from asteria_core.telemetry.records import DistributedFigures

log = logging.getLogger(__name__)

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
Outcome = tuple[RefreshResult | None, str | None, bool]
"""(result, error, unchanged) of the owner's refresh: unchanged when its basis barely moved
(selective coherence: then only the header travels, and every rank keeps its basis)."""
POLL_SECONDS = 0.005
SENT, UNCHANGED = 1, 2  # header[0]; 0: the refresh failed


@dataclass(eq=False)
class Transfer:
    key: BlockKey
    stats_step: int
    owner: int
    size: int
    """b: the block's basis is (b, b)."""
    outcome: Callable[[], Outcome | None] | None = None
    """On the owner: the refresh's outcome once it is known (polled), None until then."""
    result: RefreshResult | None = None
    error: str | None = None
    unchanged: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    arrived_at: float | None = None


class VersionExchange:
    """The background thread and process groups of one rank (create it on every rank)."""

    def __init__(self, topology: Topology, owners: dict[BlockKey, int]) -> None:
        self.topology = topology
        self.owners = owners
        self.bytes_sent = 0
        self.bytes_received = 0
        # new_group is collective: every rank creates every group, in the same order.
        self._groups: list[dist.ProcessGroup] = []
        """Every group made, those of one rank included: each is released at `close`."""
        self._local = [self._group(topology.ranks_of(n)) for n in range(topology.nodes)]
        self._leaders = self._group([topology.leader(n) for n in range(topology.nodes)])
        self._queue: queue.Queue[Transfer | None] = queue.Queue()
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name="asteria-exchange", daemon=True)
        self._thread.start()

    def _group(self, ranks: list[int]) -> dist.ProcessGroup | None:
        group = dist.new_group(ranks, backend="gloo")
        self._groups.append(group)
        return group if len(ranks) > 1 else None  # a group of one sends nothing

    # ------------------------------------------------------------------ refresh.BlockExchange
    def owns(self, key: BlockKey) -> bool:
        return self.owners[key] == self.topology.rank

    def offer(self, key: BlockKey, stats_step: int, size: int,
              outcome: Callable[[], Outcome | None]) -> None:
        self._post(Transfer(key, stats_step, self.topology.rank, size, outcome=outcome))

    def expect(self, key: BlockKey, stats_step: int, size: int) -> Transfer:
        return self._post(Transfer(key, stats_step, self.owners[key], size))

    def _post(self, transfer: Transfer) -> Transfer:
        if self._failed is not None:
            raise RuntimeError(f"the version exchange failed: {self._failed}") from self._failed
        self._queue.put(transfer)
        return transfer

    def figures(self) -> DistributedFigures:
        topo = self.topology
        return DistributedFigures(rank=topo.rank, world=topo.world, node=topo.node,
                                  owned_blocks=sum(o == topo.rank for o in self.owners.values()),
                                  bytes_sent=self.bytes_sent,
                                  bytes_received=self.bytes_received)

    def close(self, timeout: float = 30.0) -> None:
        """End the thread, then release the groups (left alone if the thread is still inside
        a collective after `timeout`: a peer is gone, and the process exits with it)."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("the version exchange did not end within %.0f s; its groups are left "
                        "to the process's exit", timeout)
            return
        self._local, self._leaders = [], None
        while self._groups:
            release_group(self._groups.pop())

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            try:
                self._move(item)
            except BaseException as err:  # a broken group: every later wait must see it
                self._failed = err
                item.error = f"version exchange failed: {type(err).__name__}: {err}"
                item.done.set()
                log.exception("version exchange failed at block %s", item.key)
                while (rest := self._queue.get()) is not None:
                    rest.error = item.error
                    rest.done.set()
                return

    def _move(self, item: Transfer) -> None:
        header = torch.zeros(6, dtype=torch.int64)
        mine = item.owner == self.topology.rank
        if mine:
            result, error, unchanged = self._wait_outcome(item)
            if unchanged:
                header[0] = UNCHANGED
            elif result is not None:
                header[:] = torch.tensor([SENT, result.stats_step, result.base_version,
                                          result.perm is not None, result.transport is not None,
                                          DTYPES.index(result.basis.dtype)])
            item.error = error
        self._broadcast(header, item.owner)
        ok, stats_step, base_version, has_perm, has_transport, dtype = header.tolist()
        if ok == UNCHANGED:
            item.unchanged = True
        elif not ok:
            item.error = item.error or f"refresh of block {tuple(item.key)} failed on its " \
                                       f"owner, rank {item.owner}"
        elif mine:
            assert result is not None  # sent (the header's ok)
            for t in (result.basis, result.perm, result.transport):
                if t is not None:
                    self._broadcast(t.contiguous(), item.owner)
            item.result = result
        else:
            b, dt = item.size, DTYPES[dtype]
            basis = self._broadcast(torch.empty(b, b, dtype=dt), item.owner)
            perm = self._broadcast(torch.empty(b, dtype=torch.int64), item.owner) \
                if has_perm else None
            transport = self._broadcast(torch.empty(b, b, dtype=dt), item.owner) \
                if has_transport else None
            item.result = RefreshResult(key=item.key, stats_step=stats_step,
                                        base_version=base_version, basis=basis, perm=perm,
                                        transport=transport)
        item.arrived_at = time.perf_counter()
        item.done.set()

    def _wait_outcome(self, item: Transfer) -> Outcome:
        poll = item.outcome
        assert poll is not None  # the owner's transfer, which carries its outcome
        while (outcome := poll()) is None:
            time.sleep(POLL_SECONDS)
        return outcome

    def _broadcast(self, tensor: torch.Tensor, owner: int) -> torch.Tensor:
        """Owner -> its node, its leader -> the other leaders, each leader -> its node."""
        topo = self.topology
        src_node = topo.node_of(owner)
        if topo.node == src_node:
            self._step(tensor, owner, self._local[src_node], topo.local_world)
        if topo.is_leader:
            self._step(tensor, topo.leader(src_node), self._leaders, topo.nodes)
        if topo.node != src_node:
            self._step(tensor, topo.leader(topo.node), self._local[topo.node], topo.local_world)
        return tensor

    def _step(self, tensor: torch.Tensor, src: int, group, size: int) -> None:
        if group is None:
            return
        dist.broadcast(tensor, src=src, group=group)
        nbytes = tensor.numel() * tensor.element_size()
        if src == self.topology.rank:
            self.bytes_sent += nbytes * (size - 1)
        else:
            self.bytes_received += nbytes
