"""The tier store: optimizer state at home in device, host or disk, resident just in time.

The store plugs into a `BlockPreconditioner` as its `residency`. Between uses, an entry homed
on the device or the host stays in the optimizer's state dict (on a CPU-only machine both are
CPU memory, so a host-homed tensor is used in place; on CUDA it lives in pinned memory and is
copied in); an entry homed on disk is replaced by a meta tensor of its shape, so any use that
bypassed the store fails loudly instead of computing with stale values. Around each use:

    acquire(i):  wait for parameter i's disk entries (prefetched by the reader thread into a
                 staging buffer; a late or missing prefetch is waited for as transfer_wait) and
                 point the state dict at them; then prefetch the next parameters of the step.
    release(i):  point the dict back at meta tensors and queue the dirty entries (per lifecycle:
                 written-every-step after an update, everything after a basis swap) for the
                 writer thread, which frees the buffer when the files are written.

A parameter's state is in at most one staging buffer at a time, and a read of it waits for its
pending write, so every use sees the newest values: placement never changes numerics. At a step
boundary after a policy change the store re-plans and migrates entries between tiers.

The store owns the plan (tiers/placement.py) and runs these parts, one job each: the state's
entries (catalogue.py), the disk tier's layout and files (files.py), the staging buffers
(buffers.py), the reader and writer threads (traffic.py), loads ahead of use (prefetch.py), the
state in use (resident.py), pinned host homes and their copies (homes.py), placing state in its
homes (placer.py) and the figures it reports (figures.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch

from asteria_core.optim.base import BlockPreconditioner, Writes
from asteria_core.optim.seam import RefreshResult
from asteria_core.policy import LivePolicy, Policy, PolicyError
from asteria_core.telemetry.labels import Tier
from asteria_core.telemetry.records import TierFigures
from asteria_core.telemetry.reporter import NullReporter, Reporter
from asteria_core.tiers.buffers import StagingBuffers
from asteria_core.tiers.catalogue import StateCatalogue
from asteria_core.tiers.copies import HostCopies, copies_for
from asteria_core.tiers.disk import DiskTier, TierFileError, check_writable, trim_heap
from asteria_core.tiers.figures import TierAccounts, refresh_bytes
from asteria_core.tiers.files import ParamFiles, disk_folder
from asteria_core.tiers.homes import HostHomes
from asteria_core.tiers.placement import Plan, plan
from asteria_core.tiers.placer import StatePlacer
from asteria_core.tiers.prefetch import Prefetcher
from asteria_core.tiers.resident import ResidentState
from asteria_core.tiers.results import ResultFiles, result_bytes
from asteria_core.tiers.traffic import DiskTraffic

log = logging.getLogger(__name__)
TIER_FIELDS = ("device_budget_bytes", "host_budget_bytes", "disk_dir", "offload_mode")


class TierStore:
    def __init__(self, optimizer: BlockPreconditioner, policy: LivePolicy, run_dir: Path,
                 reporter: Reporter | None = None,
                 copies: Callable[[torch.device], HostCopies | None] = copies_for) -> None:
        """`copies` makes the host-state copies for a device (tiers/copies.py; a test passes a
        fake of the CUDA streams there)."""
        self.opt = optimizer
        self.live = policy
        self.run_dir = Path(run_dir)
        self.reporter = reporter or NullReporter()
        self.catalogue = StateCatalogue(optimizer)
        self.params, self.entries = self.catalogue.params, self.catalogue.entries
        """The catalogue's, under the names the store's readers use."""
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self.homes = HostHomes(copies, self.device)
        self.accounts = TierAccounts()
        self.files = ParamFiles(self.accounts)
        self.buffers = StagingBuffers()
        self.results: ResultFiles | None = None
        """Refresh results of disk-homed blocks, waiting for their swap (tiers/results.py)."""
        self.plan: Plan = Plan((Tier.DEVICE,) * len(self.entries), 0, 0)
        self.validate(policy.current)  # a disk tier that cannot fit fails now, not at step 11
        self.traffic = DiskTraffic(self.files, self.buffers)  # starts the I/O threads
        self.resident = ResidentState(self.files, self.buffers, self.homes, self.traffic)
        self.prefetch = Prefetcher(self.catalogue, self.files, self.buffers, self.traffic,
                                   self.resident, self.reporter)
        self.placer = StatePlacer(self.catalogue, self.files, self.buffers, self.homes,
                                  self.traffic)
        self._configure(policy.current)
        policy.add_validator(self.validate)
        optimizer.residency = self
        self.adopt_all()

    @property
    def disk(self) -> DiskTier | None:
        """The disk tier, where the plan homes entries on disk."""
        return self.files.disk

    # ------------------------------------------------------------------ policy
    def validate(self, policy: Policy) -> None:
        """LivePolicy validator: the placement must be possible, and its disk dir usable."""
        proposed = plan(self.entries, policy)  # raises PolicyError naming the budget
        if proposed.slots:
            why = check_writable(disk_folder(policy, self.run_dir),
                                 proposed.used(self.entries, Tier.DISK), proposed.slot_bytes)
            if why is not None:
                raise PolicyError("disk_dir", why)

    def on_boundary(self, step: int) -> TierFigures:
        """After the policy's pending changes were applied: migrate if tier fields changed.
        Returns this boundary's figures for the step record."""
        self.traffic.raise_errors()
        policy = self.live.current
        if any(getattr(policy, f) != getattr(self._policy, f) for f in TIER_FIELDS):
            self.migrate(policy)
        return self.accounts.figures(self._policy, self.hit_ratio())

    def migrate(self, policy: Policy) -> None:
        """Re-plan under `policy` and move every entry whose home changed (synchronous)."""
        self._drain()
        gathered = {i: self.placer.gather(i) for i in self.catalogue.by_param
                    if self.catalogue.has_state(i)}
        self.files.remove_all()
        self._configure(policy)
        for index, tensors in gathered.items():
            self.placer.place(index, tensors, self.device)

    def _configure(self, policy: Policy) -> None:
        self.plan = plan(self.entries, policy)
        for e, tier in zip(self.entries, self.plan.tiers, strict=True):
            e.tier = tier
        self.accounts.configure(self.plan, self.entries)
        self._policy = policy
        folder = disk_folder(policy, self.run_dir) if self.plan.slots else None
        self.files.configure(self.catalogue, folder)
        if folder is not None and self.results is None:
            # (results staged earlier stay valid: they are mapped)
            self.results = ResultFiles(folder / "results")
        self.buffers.configure(self.plan.slots, self.plan.slot_bytes, self.homes.copies)
        self.homes.configure(self.catalogue)

    def set_device(self, device: torch.device) -> None:
        """The parameters train on `device` (they moved after the store was built): re-plan
        there, so device-homed state moves with them and host-homed state gets its pinned homes
        and copies (a CPU machine's host tier is used in place)."""
        if device == self.device:
            return
        self._drain()
        self.device = device
        self.homes.set_device(device)
        self.migrate(self.live.current)

    # ------------------------------------------------------------------ residency protocol
    def begin_step(self, order: list[int]) -> None:
        self.traffic.raise_errors()
        self.prefetch.begin_step(order)

    def announce(self) -> None:
        """A module hook: the next step is coming; start loading its first parameters."""
        self.prefetch.announce()

    def acquire(self, index: int, state: dict) -> None:
        if index not in self.placer.adopted:
            return  # the first update creates the state; release places it
        self.homes.to_device(index, state)  # pinned host -> device, asynchronous
        if self.files.on_disk(index):
            if self.resident.lingers(index):
                self.prefetch.count_hit()  # still resident from its last use
            else:
                self.resident.flush()
                self.resident.hold(index, state, self.prefetch.take(index))
        self.prefetch.after(index)

    def buffered(self, index: int) -> bool:
        """Whether parameter `index`'s state passes through the store's buffers (disk staging,
        CUDA host homes). State homed on the device (or, on a CPU machine, the host) stays the
        optimizer's own tensors, which the store only re-points at a migration."""
        return self.files.on_disk(index) or self.homes.staged(index)

    def release(self, index: int, state: dict, writes: Writes) -> None:
        if index not in self.placer.adopted:
            self.placer.adopt(index, state, self.device)
            return
        self.homes.to_host(index, state, writes)  # device -> pinned host, off the stream
        self.resident.release(index, state, writes)

    def adopt_all(self) -> None:
        """Place the state now in the optimizer (after its load_state_dict)."""
        self._drain()
        self.resident.forget()
        self.placer.adopt_all(self.device)

    def materialized(self, packed: dict) -> dict:
        """torch's packed optimizer state with every disk-tier entry put back, as a view of its
        file (checked, mapped, not read: `DiskTier.map`), so a checkpoint streams the disk tier
        from file to file without a second copy of the state in memory. Other entries are the
        optimizer's own tensors, as torch's state_dict gives them."""
        self._drain()
        return self.files.materialized(packed)

    def _drain(self) -> None:
        """Wait for every write (copies to host homes too: the host reads them next); drop
        prefetched loads (their buffers are clean)."""
        self.resident.flush()
        self.homes.settle()
        self.prefetch.drop()
        self.traffic.wait_writes()
        self.traffic.raise_errors()

    # ------------------------------------------------------------------ refresh results
    def stage_result(self, result: RefreshResult) -> RefreshResult:
        """A refresh result that waits for its swap: of a block whose state lives on disk, to
        a file of the disk tier (the same result, its tensors mapped from there); else as is."""
        if not self.stages_results(result.key.param):
            return result
        self.accounts.moved(Tier.HOST, Tier.DISK, result_bytes(result))
        assert self.results is not None  # made with the disk tier that stages results
        staged = self.results.stage(result)
        trim_heap()  # the previous refresh's snapshot and intermediates leave memory
        return staged

    def stages_results(self, index: int) -> bool:
        """Whether refresh results of parameter `index`'s blocks wait in a file: its state
        lives on disk."""
        return self.results is not None and self.files.on_disk(index)

    def refresh_bytes(self) -> int:
        """Memory the refresh work in flight may hold at once, besides the state
        (`figures.refresh_bytes` says what counts)."""
        return refresh_bytes(self.catalogue, self.live.current, self.files.on_disk)

    # ------------------------------------------------------------------ figures, shutdown
    def tier_bytes(self) -> dict[str, int]:
        """Bytes of state per home tier."""
        return self.accounts.tier_bytes()

    def memory_bytes(self) -> int:
        """Bytes of state the plan keeps in this process's memory: the host tier and its
        staging buffers, and the device tier when the device is the CPU."""
        return self.accounts.memory_bytes(self.device)

    def hit_ratio(self) -> float | None:
        return self.prefetch.hit_ratio()

    def close(self) -> None:
        """Finish pending writes and stop the I/O threads (idempotent)."""
        if not self.traffic.running():
            return
        try:
            self._drain()
        finally:
            self.traffic.stop()
            self.files.close()
            if self.results is not None:
                self.results.close()
            self.homes.close()


__all__ = ["TierFileError", "TierStore"]
