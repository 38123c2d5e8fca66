"""The default process group of a torchrun worker, made so that torchrun can restart it in place.

torchrun's rendezvous keeps one TCPStore across attempts (its agent's, on MASTER_PORT), and a
gloo group finds each rank's address under keys named after the group only: the same keys in
every attempt. A restarted rank that got to a group before its peer read the dead attempt's
address there and failed in connectFullMesh (connection refused), or waited for a connection
that never came. Under a prefix of the attempt every key is new, for the default group and for
every group `new_group` makes from its store (the runtime's side groups). NCCL's unique id
travels through the same store, so the prefix serves it too.
"""

from __future__ import annotations

import os

import torch.distributed as dist


def init_process_group(backend: str) -> None:
    """`dist.init_process_group(backend)` on torchrun's store under the prefix of this attempt
    (TORCHELASTIC_RESTART_COUNT: the restarts of a node's worker group, the same on every rank
    of a node, and across nodes as long as every node's workers restart together)."""
    store, rank, world = next(dist.rendezvous("env://"))  # torchrun's store, as env:// makes it
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"attempt{attempt}/", store),
                            rank=rank, world_size=world)
