"""Placement: which tier is each state entry's home, under the policy's budgets and mode.

offload_mode:
- none: every entry on the device; budgets have no effect (a warning is logged once).
- host: the device budget is filled by value per byte; the rest lives on the host.
- disk: the device budget is filled by value per byte; the rest lives on disk. The host holds
  only the staging buffers that disk reads and writes go through.
- auto: device budget, then host budget, then disk.
A budget of 0 means no limit. Background-only entries are pinned to the host in every mode.

Staging: disk traffic goes through `slots` buffers of W bytes each, W = the largest single
parameter's state (aligned), the minimum working set. They are charged to the host budget.
A parameter's whole state is resident while it updates, so a device budget below W with any
state off the device cannot work and is rejected.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from asteria_core.policy import OffloadMode, Policy, PolicyError
from asteria_core.telemetry.labels import Tier
from asteria_core.tiers.lifecycle import BACKGROUND, VALUE_PER_BYTE, Entry, padded

log = logging.getLogger(__name__)

MAX_SLOTS = 4
"""Staging buffers at most: one updating, one written back, two prefetched."""


@dataclass(frozen=True, slots=True)
class Plan:
    """Home tier per entry (in entry order) plus the staging the plan needs."""

    tiers: tuple[str, ...]
    slots: int
    """Staging buffers of `slot_bytes` each; 0 when nothing lives on disk."""
    slot_bytes: int

    def used(self, entries: list[Entry], tier: str) -> int:
        return sum(e.nbytes for e, t in zip(entries, self.tiers, strict=True) if t == tier)


def working_set(entries: list[Entry]) -> int:
    """W: the largest single parameter's state, each entry aligned as staged."""
    per_param: dict[int, int] = {}
    for e in entries:
        per_param[e.param] = per_param.get(e.param, 0) + padded(e.nbytes)
    return max(per_param.values(), default=0)


def _fill(order: list[int], entries: list[Entry], tiers: list[str | None], tier: str,
          capacity: int | None) -> None:
    """Give `tier` to unplaced entries in `order` while they fit (first fit)."""
    left = capacity
    for i in order:
        if tiers[i] is not None:
            continue
        size = entries[i].nbytes
        if left is None or size <= left:
            tiers[i] = tier
            if left is not None:
                left -= size


def _slots(host: int | None, w: int) -> int:
    slots = MAX_SLOTS if host is None else min(MAX_SLOTS, host // w)
    if slots < 1:
        raise PolicyError("host_budget_bytes", f"got {host}; allowed: 0 (no limit) or at least "
                          f"{w}, one staging buffer for the minimum working set (the largest "
                          "parameter's state)")
    return slots


_warned_none = False


def plan(entries: list[Entry], policy: Policy) -> Plan:
    """The placement of `entries` under `policy`; raises PolicyError when it cannot be met."""
    global _warned_none
    w = working_set(entries)
    mode = policy.offload_mode
    device = policy.device_budget_bytes or None
    host = policy.host_budget_bytes or None
    tiers: list[str | None] = [None] * len(entries)
    for i, e in enumerate(entries):
        if e.lifecycle == BACKGROUND:
            tiers[i] = Tier.HOST
    if mode == OffloadMode.NONE:
        if (device or host) and not _warned_none:
            _warned_none = True
            log.warning("tier budgets have no effect with offload_mode=none")
        device = None
    # Most valuable per byte first; then the parameter order (prefetch order) for ties.
    order = sorted(range(len(entries)),
                   key=lambda i: (-VALUE_PER_BYTE[entries[i].lifecycle], entries[i].param, i))
    _fill(order, entries, tiers, Tier.DEVICE, device)
    off_device = any(t != Tier.DEVICE for t in tiers)
    if off_device and device is not None and device < w:
        raise PolicyError("device_budget_bytes", f"got {device}; allowed: 0 (no limit) or at "
                          f"least {w}, the minimum working set (the largest parameter's state, "
                          "which is resident while it updates)")
    slots = 0
    match mode:
        case OffloadMode.NONE:
            pass
        case OffloadMode.HOST:
            _fill(order, entries, tiers, Tier.HOST, None)
        case OffloadMode.DISK | OffloadMode.AUTO:
            if mode == OffloadMode.AUTO:
                trial = list(tiers)
                _fill(order, entries, trial, Tier.HOST, host)
                placed = [t for t in trial if t is not None]
                if len(placed) == len(trial):  # every entry fits on the device or the host
                    return Plan(tuple(placed), 0, w)
            slots = _slots(host, w) if any(t is None for t in tiers) else 0
            if mode == OffloadMode.AUTO:
                _fill(order, entries, tiers, Tier.HOST, None if host is None else host - slots * w)
            _fill(order, entries, tiers, Tier.DISK, None)
        case _:
            raise NotImplementedError(mode)
    return Plan(tuple(t or Tier.DEVICE.value for t in tiers), slots, w)
