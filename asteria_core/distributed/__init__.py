"""Data-parallel Asteria on torch.distributed: owner ranks and versioned bases that travel in
the background (docs/architecture.md, "Data-parallel runs").

Gradients go through DistributedDataParallel as usual. Every preconditioner block has one owner
rank (`assign_owners`); only the owner snapshots and refreshes it, on its own host workers, and
`VersionExchange` brings the result to every rank, which swaps it in at the same step;
`PolicySync` brings rank 0's policy changes to every rank at one step.
"""

from asteria_core.distributed.exchange import Transfer, VersionExchange
from asteria_core.distributed.metrics import serve_rank_metrics
from asteria_core.distributed.policy_sync import PolicySync
from asteria_core.distributed.process_group import init_process_group
from asteria_core.distributed.topology import Topology, assign_owners

__all__ = ["PolicySync", "Topology", "Transfer", "VersionExchange", "assign_owners",
           "init_process_group", "serve_rank_metrics"]
