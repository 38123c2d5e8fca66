"""Optimizer-state bytes by kind (moments, factors, bases, other: `labels.StateKind`): what an
optimizer holds besides the parameters. The step record's `state` section and the gauge
`asteria_optimizer_state_bytes` carry it; the benchmarks report it.

Every tensor of the state counts once, however often it is referenced, at its full size wherever
its tier keeps it (between uses a disk-homed entry is a meta tensor of its shape); a DTensor
counts this rank's shard, a placeholder of no elements nothing. States may nest: lists, tuples,
dicts and dataclasses (Distributed Shampoo keeps its factors so); an entry's kind is its key in
the parameter's state.

Counting walks the whole state, a few microseconds per tensor: the runtime counts only where
the state's size can have changed (`StateCount`), not at every step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from asteria_core.optim.base import BASES, EXP_AVG, FACTORS, BlockPreconditioner, local_shard
from asteria_core.optim.soap import EXP_AVG_E, EXP_AVG_SQ
from asteria_core.policy import LivePolicy
from asteria_core.telemetry.labels import STATE_KINDS, StateKind
from asteria_core.telemetry.records import StateFigures

MOMENTS = (EXP_AVG, EXP_AVG_SQ, EXP_AVG_E)
"""The state keys of Adam's moments: torch's AdamW's, and SOAP's in its eigenbasis."""
_KINDS: dict[Any, StateKind] = {BASES: StateKind.BASES, FACTORS: StateKind.FACTORS,
                                **dict.fromkeys(MOMENTS, StateKind.MOMENTS)}


def kind_of(key: Any) -> StateKind:
    """The kind of the state entry under `key` in a parameter's state."""
    return _KINDS.get(key, StateKind.OTHER)


def tensor_bytes(value: Any, seen: set | None = None) -> int:
    """Bytes of every tensor in `value` (nested as above) that is not in `seen` yet; each one
    counted goes into `seen`, so a walk over several values counts a shared tensor once."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        t = local_shard(value)
        # Where its elements start, how many, of what: the same tensor however it is reached.
        # A meta tensor has no storage to tell two apart: the object itself is its identity.
        key = (id(value),) if t.is_meta else (t.data_ptr(), t.numel(), t.dtype)
        if t.numel() == 0 or key in seen:
            return 0
        seen.add(key)
        return t.numel() * t.element_size()
    if isinstance(value, list | tuple):
        return sum(tensor_bytes(v, seen) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v, seen) for v in value.values())
    if isinstance(value, int | float | str | None):  # most leaves that are no tensor: counts
        return 0
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return sum(tensor_bytes(getattr(value, f.name), seen) for f in dataclasses.fields(value))
    return 0


def state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """The optimizer's state bytes by kind, every kind present (0 where it holds none)."""
    kinds = dict.fromkeys(STATE_KINDS, 0)
    seen: set = set()
    for state in optimizer.state.values():
        entries = state.items() if isinstance(state, dict) else [(None, state)]
        for key, value in entries:
            kinds[kind_of(key)] += tensor_bytes(value, seen)
    return kinds


class StateCount:
    """The boundary stage that fills the record's `state` section. It counts where the state's
    size can have changed: at the first boundary, where the state gained or lost entries (a
    parameter's first step, a moment built lazily), where block ownership moved between ranks
    (a rebalance hands factors over) and where the policy changed (the tier store re-plans).
    The state's tensors keep their sizes otherwise (a tier moves them, and counts them at full
    size wherever they live), so the records in between carry the last count: a walk over the
    state each step would cost a measurable share of a small model's step."""

    def __init__(self, optimizer: torch.optim.Optimizer, policy: LivePolicy) -> None:
        self.optimizer, self.policy = optimizer, policy
        self.figures: StateFigures | None = None
        """The last count."""
        self._counted_at: tuple[int, int, int] | None = None

    def _shape(self) -> tuple[int, int, int]:
        """What changes when the state's size can: the policy's version, the blocks handed
        between ranks, the state's entries (one `len` per parameter: cheap)."""
        handed = self.optimizer.factors.handed \
            if isinstance(self.optimizer, BlockPreconditioner) else 0
        entries = sum(len(s) if isinstance(s, dict) else 1 for s in self.optimizer.state.values())
        return self.policy.version, handed, entries

    def __call__(self, step: int) -> StateFigures:
        shape = self._shape()
        if self.figures is None or shape != self._counted_at:
            self._counted_at = shape
            self.figures = StateFigures(bytes=state_bytes(self.optimizer), counted_step=step)
        return self.figures
