"""What the tier store reports: bytes per tier and what they may reach, bytes moved between
tiers, and the memory its plan and the refresh work in flight hold (the trainer's memory check).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from asteria_core.optim.seam import BlockInfo
from asteria_core.policy import Policy
from asteria_core.telemetry.labels import TIERS, Tier
from asteria_core.telemetry.records import TierFigures
from asteria_core.tiers.catalogue import StateCatalogue
from asteria_core.tiers.lifecycle import Entry
from asteria_core.tiers.placement import Plan


class TierAccounts:
    """Bytes per home tier under the current plan, and bytes moved between tiers since start."""

    def __init__(self) -> None:
        self._plan = Plan((), 0, 0)
        self._tier_bytes: dict[str, int] = {}
        self._transfer_bytes: dict[str, dict[str, int]] = {}
        self._moved_lock = threading.Lock()

    def configure(self, plan: Plan, entries: list[Entry]) -> None:
        self._plan = plan
        # Bytes per home tier: the plan's, so counted once per plan, not at every step.
        self._tier_bytes = {t: plan.used(entries, t) for t in TIERS}

    def moved(self, src: str, dst: str, nbytes: int) -> None:
        """Count bytes moved between tiers (from the I/O threads too); the record carries the
        totals, from which the exporter derives its counter."""
        with self._moved_lock:
            by_dst = self._transfer_bytes.setdefault(str(src), {})
            by_dst[str(dst)] = by_dst.get(str(dst), 0) + nbytes

    def tier_bytes(self) -> dict[str, int]:
        """Bytes of state per home tier."""
        return dict(self._tier_bytes)

    def staging_bytes(self) -> int:
        """The disk tier's staging buffers, held in host memory."""
        return self._plan.slots * self._plan.slot_bytes

    def memory_bytes(self, device: torch.device) -> int:
        """Bytes of state the plan keeps in this process's memory: the host tier and its
        staging buffers, and the device tier when the device is the CPU."""
        held = self._tier_bytes[Tier.HOST] + self.staging_bytes()
        if device.type == "cpu":
            held += self._tier_bytes[Tier.DEVICE]
        return held

    def figures(self, policy: Policy, hit_ratio: float | None) -> TierFigures:
        """Bytes and budget per tier (the host tier counts the disk tier's staging buffers)."""
        used = self.tier_bytes()
        total = sum(used.values())
        staging = self.staging_bytes()
        held: dict[str, int] = {Tier.DEVICE: used[Tier.DEVICE],
                                Tier.HOST: used[Tier.HOST] + staging}
        capacity: dict[str, int] = {Tier.DEVICE: policy.device_budget_bytes or total,
                                    Tier.HOST: policy.host_budget_bytes or total + staging}
        if self._plan.slots:
            held[Tier.DISK], capacity[Tier.DISK] = used[Tier.DISK], total
        with self._moved_lock:
            moved = {src: dict(by_dst) for src, by_dst in self._transfer_bytes.items()}
        return TierFigures(bytes=held, capacity_bytes=capacity, prefetch_hit_ratio=hit_ratio,
                           transfer_bytes=moved)


def refresh_bytes(catalogue: StateCatalogue, policy: Policy,
                  on_disk: Callable[[int], bool]) -> int:
    """Memory the refresh work in flight may hold at once, besides the state: a block's
    snapshot and result while computed, and results waiting in memory for their swap.

    Inline (workers = 0) blocks are refreshed one at a time at the boundary, and a result of
    a disk-homed block (`on_disk` of its parameter) goes to a file at once
    (`TierStore.stage_result`): one block's work, plus the results of memory-homed blocks that
    wait d steps. With workers a round of snapshots and results may be held before the
    boundary that stages them: all of them count."""
    one = held = 0
    for info in catalogue.opt.refresh_blocks():
        snapshot, result = _refresh_work(catalogue, info)
        if policy.workers > 0:
            held += snapshot + result
            continue
        one = max(one, snapshot + result)
        if policy.delay > 0 and not on_disk(info.key.param):
            held += result
    return held + one


def _refresh_work(catalogue: StateCatalogue, info: BlockInfo) -> tuple[int, int]:
    """Upper bounds of one block's snapshot (factor, and basis when the refresh reads it)
    and result (basis, rotation when the swap rotates, transport at its first swap)."""
    config = catalogue.opt.refresh_config(info.key)
    square = info.size ** 2 * catalogue.factor_itemsize(info.key.param)
    return square * (1 + config.needs_basis), square * (2 + config.rotate)
