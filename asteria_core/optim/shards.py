"""Data-parallel shards: under FSDP2 every rank preconditions its own shard of a parameter as a
tensor of its own (docs/architecture.md, "Data-parallel runs")."""

from __future__ import annotations

import torch


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) parameter or gradient, a view that shares its
    storage; any other tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t
