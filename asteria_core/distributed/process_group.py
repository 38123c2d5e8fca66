"""The default process group of a torchrun worker, made so that torchrun can restart it in place.

torchrun's rendezvous keeps one TCPStore across attempts (its agent's, on MASTER_PORT), and a
gloo group finds each rank's address under keys named after the group only: the same keys in
every attempt. A restarted rank that got to a group before its peer read the dead attempt's
address there and failed in connectFullMesh (connection refused), or waited for a connection
that never came. Under a prefix of the attempt every key is new, for the default group and for
every group `new_group` makes from its store (the runtime's side groups). NCCL's unique id
travels through the same store, so the prefix serves it too.

The attempt is counted in the store itself: each rank counts its own starts there, and every
attempt starts every rank once, so the count agrees across ranks and nodes. torchrun's
TORCHELASTIC_RESTART_COUNT (and the `/worker/attempt_<n>` prefix env:// puts on the store) is a
node's own count: the node whose rank failed counts a restart, a node whose healthy ranks were
restarted because a peer node rejoined does not, and the ranks would wait under different
prefixes for peers that never come.

The runtime's side groups are released by their owners when the runtime closes
(`release_group`), before the default group goes.
"""

from __future__ import annotations

import torch.distributed as dist


def init_process_group(backend: str) -> None:
    """`dist.init_process_group(backend)` on torchrun's store under the prefix of this attempt:
    the number of times this rank has started on that store, the same on every rank."""
    store, rank, world = next(dist.rendezvous("env://"))  # torchrun's store, as env:// makes it
    while isinstance(store, dist.PrefixStore):  # env:// prefixes the node's own restart count
        store = store.underlying_store
    attempt = store.add(f"asteria/starts/rank{rank}", 1)
    dist.init_process_group(backend, store=dist.PrefixStore(f"asteria/attempt{attempt}/", store),
                            rank=rank, world_size=world)


def release_group(group: dist.ProcessGroup | None) -> None:
    """Tear down a side group now, while the interpreter still runs (its collectives complete:
    the caller waited for them). A group left to the interpreter's exit is destroyed during
    finalization, where a gloo thread still unwinding frees its work's tensors and the process
    aborts ("terminate called without an active exception"). Nothing to do once the default
    group is gone: destroying it shut every group down."""
    if group is None or group == dist.GroupMember.NON_GROUP_MEMBER or not dist.is_initialized():
        return
    dist.destroy_process_group(group)
