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
"""

from __future__ import annotations

import gc
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from asteria_core.optim.base import BlockPreconditioner, Writes
from asteria_core.optim.seam import BlockInfo, RefreshResult
from asteria_core.policy import LivePolicy, Policy, PolicyError
from asteria_core.telemetry.labels import TIERS, IdleCause, Tier
from asteria_core.telemetry.records import TierFigures
from asteria_core.telemetry.reporter import NullReporter, Reporter
from asteria_core.tiers.copies import HostCopies, copies_for
from asteria_core.tiers.disk import (
    DiskTier,
    TierFileError,
    aligned_buffer,
    check_writable,
    copy_out,
    fix_mmap_threshold,
    release_loaded,
    trim_heap,
)
from asteria_core.tiers.lifecycle import (
    READ,
    WRITTEN,
    Entry,
    classify,
    copy_structure,
    get_leaf,
    leaves,
    padded,
    set_leaf,
)
from asteria_core.tiers.placement import Plan, plan
from asteria_core.tiers.results import ResultFiles, result_bytes

log = logging.getLogger(__name__)
TIER_FIELDS = ("device_budget_bytes", "host_budget_bytes", "disk_dir", "offload_mode")


class TierStore:
    def __init__(self, optimizer: BlockPreconditioner, policy: LivePolicy, run_dir: Path,
                 reporter: Reporter | None = None,
                 copies: Callable[[torch.device], HostCopies | None] = copies_for) -> None:
        """`copies` makes the host-state copies for a device (tiers/copies.py; a test passes a
        fake of the CUDA streams there)."""
        self.opt = optimizer
        self._make_copies = copies
        self.live = policy
        self.run_dir = Path(run_dir)
        self.reporter = reporter or NullReporter()
        self._transfer_bytes: dict[str, dict[str, int]] = {}
        self._moved_lock = threading.Lock()
        self.params = [p for g in optimizer.param_groups for p in g["params"]]
        self.entries: list[Entry] = []
        self.by_param: dict[int, list[int]] = {}
        for index in range(len(self.params)):
            spec = optimizer.state_spec(index)
            ids = self.by_param[index] = []
            for path, t in leaves(spec):
                ids.append(len(self.entries))
                self.entries.append(Entry(index, path, tuple(t.shape), t.dtype, classify(path)))
        self.device = self.params[0].device if self.params else torch.device("cpu")
        self._copies = copies(self.device)
        """Host-homed state to and from the device; None where the host tier is used in place
        (a CPU machine)."""
        self.hits = self.misses = 0
        self.disk: DiskTier | None = None
        self.results: ResultFiles | None = None
        """Refresh results of disk-homed blocks, waiting for their swap (tiers/results.py)."""
        self.plan: Plan = Plan((Tier.DEVICE,) * len(self.entries), 0, 0)
        self._policy: Policy | None = None
        self._slots: list[np.ndarray] = []
        self._free: queue.Queue[int] = queue.Queue()
        self._loads: dict[int, tuple[threading.Event, list]] = {}  # index -> (done, [slot, err])
        self._writing: dict[int, threading.Event] = {}
        self._held: dict[int, int] = {}  # index -> slot, while a use holds it
        self._order: list[int] = []
        self._position: dict[int, int] = {}  # index -> its place in _order
        self._adopted: set[int] = set()
        self._linger: tuple[int, dict, set[str]] | None = None
        self._homes: dict[tuple, torch.Tensor] = {}  # CUDA only: pinned host homes
        self._host_staged: dict[int, list[Entry]] = {}
        self._prefetched = 0
        self._errors: list[BaseException] = []
        self._reads: queue.Queue = queue.Queue()
        self._writes: queue.Queue = queue.Queue()
        self.validate(policy.current)  # a disk tier that cannot fit fails now, not at step 11
        self._threads = [threading.Thread(target=self._loop, args=(q,), daemon=True,
                                          name=f"tier-{n}")
                         for n, q in (("reader", self._reads), ("writer", self._writes))]
        for thread in self._threads:
            thread.start()
        self._configure(policy.current)
        policy.add_validator(self.validate)
        optimizer.residency = self
        self.adopt_all()

    # ------------------------------------------------------------------ policy
    def disk_folder(self, policy: Policy) -> Path:
        return Path(policy.disk_dir).expanduser() if policy.disk_dir else self.run_dir / "tiers"

    def validate(self, policy: Policy) -> None:
        """LivePolicy validator: the placement must be possible, and its disk dir usable."""
        proposed = plan(self.entries, policy)  # raises PolicyError naming the budget
        if proposed.slots:
            why = check_writable(self.disk_folder(policy), proposed.used(self.entries, Tier.DISK),
                                 proposed.slot_bytes)
            if why is not None:
                raise PolicyError("disk_dir", why)

    def on_boundary(self, step: int) -> TierFigures:
        """After the policy's pending changes were applied: migrate if tier fields changed.
        Returns this boundary's figures for the step record."""
        self._raise_errors()
        policy = self.live.current
        if any(getattr(policy, f) != getattr(self._policy, f) for f in TIER_FIELDS):
            self.migrate(policy)
        return self.figures()

    def migrate(self, policy: Policy) -> None:
        """Re-plan under `policy` and move every entry whose home changed (synchronous)."""
        self._drain()
        gathered = {i: self._gather(i) for i in self.by_param if self._has_state(i)}
        for groups in self._groups.values():
            for fname, *_ in groups:
                self._disk().remove(fname)
        self._configure(policy)
        for index, tensors in gathered.items():
            self._place(index, tensors)

    def _configure(self, policy: Policy) -> None:
        self.plan = plan(self.entries, policy)
        for e, tier in zip(self.entries, self.plan.tiers, strict=True):
            e.tier = tier
        # Bytes per home tier: the plan's, so counted once per plan, not at every step.
        self._tier_bytes = {t: self.plan.used(self.entries, t) for t in TIERS}
        self._policy = policy
        if self.plan.slots:
            if self.disk is not None:
                self.disk.close()
            self.disk = DiskTier(self.disk_folder(policy))
            fix_mmap_threshold()
            if self.results is None:  # (results staged earlier stay valid: they are mapped)
                self.results = ResultFiles(self.disk_folder(policy) / "results")
        self._slots = [aligned_buffer(self.plan.slot_bytes) for _ in range(self.plan.slots)]
        if self._copies is not None:
            self._copies.register(self._slots)  # pinned: asynchronous copies in and out
        self._free = queue.Queue()
        for i in range(len(self._slots)):
            self._free.put(i)
        self._offsets: dict[int, list[tuple[Entry, int]]] = {}
        self._groups: dict[int, list[tuple[str, str, int, list]]] = {}
        for index, ids in self.by_param.items():
            off, layout, groups = 0, [], []
            for lifecycle in (WRITTEN, READ):
                start, parts = off, []
                for e in (self.entries[i] for i in ids):
                    if e.tier == Tier.DISK and (e.lifecycle == READ) == (lifecycle == READ):
                        layout.append((e, off))
                        parts.append((e.name, off - start, e.nbytes))
                        off += padded(e.nbytes)
                if parts:
                    groups.append((f"p{index}.{lifecycle}", lifecycle, start, parts))
            self._offsets[index] = layout
            self._groups[index] = groups
            self._host_staged[index] = [self.entries[i] for i in ids if self._copies is not None
                                        and self.entries[i].tier == Tier.HOST]
        self._homes = {k: v for k, v in self._homes.items()
                       if self.entries[self._entry_id(*k)].tier == Tier.HOST}

    def set_device(self, device: torch.device) -> None:
        """The parameters train on `device` (they moved after the store was built): re-plan
        there, so device-homed state moves with them and host-homed state gets its pinned homes
        and copies (a CPU machine's host tier is used in place)."""
        if device == self.device:
            return
        self._drain()
        self.device = device
        self._copies = self._make_copies(device)
        self.migrate(self.live.current)

    # ------------------------------------------------------------------ residency protocol
    def begin_step(self, order: list[int]) -> None:
        self._raise_errors()
        self._order = order
        self._position = {index: pos for pos, index in enumerate(order)}
        self._prefetch_from(0)

    def announce(self) -> None:
        """A module hook: the next step is coming; start loading its first parameters."""
        if self._order:
            self._prefetch_from(0)

    def acquire(self, index: int, state: dict) -> None:
        if index not in self._adopted:
            return  # the first update creates the state; release places it
        for e in self._host_staged.get(index, ()):  # pinned host -> device, asynchronous
            key = (e.param, e.path)
            set_leaf(state, e.path, self._host_copies().to_device(key, self._homes[key]))
        if not self._offsets.get(index):
            self._prefetch_after(index)
            return
        if self._linger is not None and self._linger[0] == index:
            self.hits += 1  # still resident from its last use
            self._prefetch_after(index)
            return
        self._flush()
        load = self._loads.pop(index, None)
        if load is None:
            self.misses += 1
            load = self._start_load(index)
        else:
            self._prefetched -= 1
            if load[0].is_set():
                self.hits += 1
            else:
                self.misses += 1
        if not load[0].is_set():
            with self.reporter.wait(IdleCause.TRANSFER_WAIT):
                load[0].wait()
        slot, err = load[1]
        if err is not None:
            if slot is not None:
                self._free.put(slot)
            raise err
        self._held[index] = slot
        for e, off in self._offsets[index]:
            view = self._view(slot, e, off, staged=False)
            if self._copies is not None:  # pinned buffer -> device, asynchronous
                view = self._copies.to_device(("slot", slot), view)
            set_leaf(state, e.path, view)
        self._prefetch_after(index)

    def buffered(self, index: int) -> bool:
        """Whether parameter `index`'s state passes through the store's buffers (disk staging,
        CUDA host homes). State homed on the device (or, on a CPU machine, the host) stays the
        optimizer's own tensors, which the store only re-points at a migration."""
        return bool(self._offsets.get(index) or self._host_staged.get(index))

    def release(self, index: int, state: dict, writes: Writes) -> None:
        if index not in self._adopted:
            self._adopt(index, state)
            return
        for e in self._host_staged.get(index, ()):  # device -> pinned host, off the stream
            key = (e.param, e.path)
            home, t = self._homes[key], get_leaf(state, e.path)
            if t is not home and (writes == Writes.ALL or
                                  (writes == Writes.STEP and e.lifecycle != READ)):
                self._host_copies().to_host(key, home, t)
            set_leaf(state, e.path, home)
        if index not in self._held:
            return
        # The state stays resident ("lingers") until another parameter is needed, so the
        # snapshots and swaps of one parameter's blocks at a boundary cost one read and write.
        dirty = {WRITTEN, READ} if writes == Writes.ALL else \
            {WRITTEN} if writes == Writes.STEP else set()
        if self._linger is not None and self._linger[0] == index:
            dirty |= self._linger[2]
        self._linger = (index, state, dirty)

    def _flush(self) -> None:
        """Write back the lingering parameter's dirty files and free its staging buffer."""
        if self._linger is None:
            return
        index, state, dirty = self._linger
        self._linger = None
        slot = self._held.pop(index)
        for e, off in self._offsets[index]:
            if self._copies is not None:  # device -> pinned buffer, off the training stream
                self._copies.to_host(("slot", slot), self._view(slot, e, off, staged=False),
                                     get_leaf(state, e.path))
            set_leaf(state, e.path, torch.empty(e.shape, dtype=e.dtype, device="meta"))
        ready = self._copies.last_event() if self._copies is not None else None
        self._submit_write(index, slot, [g for g in self._groups[index] if g[1] in dirty],
                           ready)

    def adopt_all(self) -> None:
        """Place the state now in the optimizer (after its load_state_dict)."""
        self._drain()
        self._adopted.clear()
        self._held.clear()
        for index, p in enumerate(self.params):
            state = self.opt.state.get(p)
            if state:
                self._adopt(index, state)

    def materialized(self, packed: dict) -> dict:
        """torch's packed optimizer state with every disk-tier entry put back, as a view of its
        file (checked, mapped, not read: `DiskTier.map`), so a checkpoint streams the disk tier
        from file to file without a second copy of the state in memory. Other entries are the
        optimizer's own tensors, as torch's state_dict gives them."""
        self._drain()
        out = {}
        for index, state in packed.items():
            state = copy_structure(state)
            if isinstance(index, int) and self._offsets.get(index) and state:
                for path, t in self._mapped(index).items():
                    set_leaf(state, path, t)
            out[index] = state
        return out

    def _mapped(self, index: int) -> dict:
        """Parameter `index`'s disk-tier entries as views of their files (after `_drain`)."""
        by_name = {e.name: e for e, _ in self._offsets[index]}
        out = {}
        for fname, _, _, parts in self._groups[index]:
            for name, raw in self._disk().map(fname, parts).items():
                e = by_name[name]
                out[e.path] = raw.view(e.dtype).view(e.shape)
        return out

    # ------------------------------------------------------------------ loads and writes
    def _prefetch_from(self, pos: int) -> None:
        limit = max(len(self._slots) - 1, 0)  # one buffer stays free for an unplanned use
        if self._prefetched >= limit:
            return  # (every use calls this: it must not cost a walk over the parameters)
        for index in itertools.islice(self._order, pos, None):
            if self._prefetched >= limit:
                return
            if not self._offsets.get(index) or not self._has_state(index):
                continue
            if index in self._loads or index in self._held:
                continue
            self._loads[index] = self._start_load(index)
            self._prefetched += 1

    def _prefetch_after(self, index: int) -> None:
        pos = self._position.get(index)
        if pos is not None:
            self._prefetch_from(pos + 1)

    def _start_load(self, index: int):
        load = (threading.Event(), [None, None])
        self._reads.put((self._read, index, load))
        return load

    def _read(self, index: int, load) -> None:
        done, out = load
        try:
            pending = self._writing.get(index)
            if pending is not None:
                pending.wait()
            out[0] = slot = self._free.get()
            self._read_groups(index, self._slots[slot])
        except BaseException as err:  # handed to the training thread at acquire
            out[1] = err
        finally:
            done.set()

    def _submit_write(self, index: int, slot: int, dirty: list, ready=None) -> None:
        """Write the dirty groups of the buffer `slot` and free it, on the writer thread, once
        the device's copies out of and into it are done (`ready`, an event; None: no copies)."""
        if not dirty and ready is None:
            self._free.put(slot)
            return
        event = self._writing[index] = threading.Event()
        self._writes.put((self._write, index, slot, dirty, event, ready))

    def _write(self, index: int, slot: int, dirty: list, event: threading.Event,
               ready=None) -> None:
        try:
            if ready is not None:  # waits on the writer thread, never the training thread
                ready.synchronize()
            self._write_groups(self._slots[slot], dirty, Tier.HOST)
        except BaseException as err:
            self._errors.append(err)
        finally:
            self._free.put(slot)
            event.set()

    def _read_groups(self, index: int, buf: np.ndarray) -> None:
        for fname, _, start, parts in self._groups[index]:
            self._disk().read(fname, buf[start:], parts)
            self._moved(Tier.DISK, Tier.HOST, sum(n for _, _, n in parts))

    def _write_groups(self, buf: np.ndarray, groups: list, src: str) -> None:
        for fname, _, start, parts in groups:
            self._disk().write(fname, buf[start:], parts)
            self._moved(src, Tier.DISK, sum(n for _, _, n in parts))

    def _loop(self, q: queue.Queue) -> None:
        while True:
            task = q.get()
            if task is None:
                return
            task[0](*task[1:])

    def _drain(self) -> None:
        """Wait for every write (copies to host homes too: the host reads them next); drop
        prefetched loads (their buffers are clean)."""
        self._flush()
        if self._copies is not None:
            self._copies.settle()
        for done, out in list(self._loads.values()):
            done.wait()
            if out[0] is not None:
                self._free.put(out[0])
        self._loads.clear()
        self._prefetched = 0
        for event in list(self._writing.values()):
            event.wait()
        self._raise_errors()

    def _raise_errors(self) -> None:
        if self._errors:
            raise self._errors[0]

    # ------------------------------------------------------------------ placing state
    def _entry_id(self, index: int, path: tuple) -> int:
        return next(i for i in self.by_param[index] if self.entries[i].path == path)

    def _has_state(self, index: int) -> bool:
        return bool(self.opt.state.get(self.params[index]))

    def _view(self, slot: int, e: Entry, off: int, staged: bool = True) -> torch.Tensor:
        raw = torch.from_numpy(self._slots[slot][off:off + e.nbytes])
        t = raw.view(e.dtype).view(e.shape)
        return t if self.device.type == "cpu" or not staged else t.to(self.device)

    def _gather(self, index: int) -> dict:
        """Every entry of parameter `index` as a plain CPU tensor (disk entries read now)."""
        state = self.opt.state[self.params[index]]
        out = {}
        offsets = {e.path: off for e, off in self._offsets.get(index, ())}
        if offsets:
            scratch = aligned_buffer(self.plan.slot_bytes)
            self._pending_write_wait(index)
            self._read_groups(index, scratch)
        for e in (self.entries[i] for i in self.by_param[index]):
            if e.tier == Tier.DISK:
                off = offsets[e.path]
                out[e.path] = torch.from_numpy(scratch[off:off + e.nbytes]).view(
                    e.dtype).view(e.shape).clone()
            else:
                out[e.path] = get_leaf(state, e.path).detach().to("cpu", copy=True)
        return out

    def _pending_write_wait(self, index: int) -> None:
        event = self._writing.get(index)
        if event is not None:
            event.wait()
        self._raise_errors()

    def _adopt(self, index: int, state: dict) -> None:
        """Take freshly created or loaded state of `index` to its planned homes."""
        found = dict(leaves(state))
        spec = {self.entries[i].path: self.entries[i] for i in self.by_param[index]}
        assert set(found) == set(spec), f"state of parameter {index} is not as planned"
        self._place(index, found)
        if self._offsets.get(index):
            # The state now on disk leaves memory: the step's reference cycles still hold it,
            # and glibc its freed pages.
            del found
            gc.collect(1)
            trim_heap()

    def _place(self, index: int, tensors: dict) -> None:
        state = self.opt.state[self.params[index]]
        offsets = {e.path: off for e, off in self._offsets.get(index, ())}
        scratch = aligned_buffer(self.plan.slot_bytes) if offsets else None
        for e in (self.entries[i] for i in self.by_param[index]):
            t = tensors[e.path]
            match e.tier:
                case Tier.DEVICE:
                    set_leaf(state, e.path, copy_out(t, self.device))
                case Tier.HOST if self._copies is None:
                    set_leaf(state, e.path, copy_out(t))
                case Tier.HOST:
                    home = self._homes[e.param, e.path] = self._host_copies().pin(t)
                    release_loaded(t)
                    set_leaf(state, e.path, home)
                case Tier.DISK:
                    assert scratch is not None  # made for the disk-tier entries
                    off = offsets[e.path]
                    view = torch.from_numpy(scratch[off:off + e.nbytes]).view(e.dtype)
                    view.view(e.shape).copy_(t)
                    release_loaded(t)
                    set_leaf(state, e.path, torch.empty(e.shape, dtype=e.dtype, device="meta"))
                case _:
                    raise NotImplementedError(e.tier)
        if scratch is not None:  # there are disk-tier entries
            self._write_groups(scratch, self._groups[index], Tier.DEVICE)
        self._adopted.add(index)

    def _disk(self) -> DiskTier:
        """The disk tier, where the plan homes entries on disk (made by `_configure`)."""
        assert self.disk is not None
        return self.disk

    def _host_copies(self) -> HostCopies:
        """The pinned host homes of a CUDA device (host-tier entries are staged only there)."""
        assert self._copies is not None
        return self._copies

    # ------------------------------------------------------------------ refresh results
    def stage_result(self, result: RefreshResult) -> RefreshResult:
        """A refresh result that waits for its swap: of a block whose state lives on disk, to
        a file of the disk tier (the same result, its tensors mapped from there); else as is."""
        if not self.stages_results(result.key.param):
            return result
        self._moved(Tier.HOST, Tier.DISK, result_bytes(result))
        assert self.results is not None  # made with the disk tier that stages results
        staged = self.results.stage(result)
        trim_heap()  # the previous refresh's snapshot and intermediates leave memory
        return staged

    def stages_results(self, index: int) -> bool:
        """Whether refresh results of parameter `index`'s blocks wait in a file: its state
        lives on disk."""
        return self.results is not None and bool(self._offsets.get(index))

    def refresh_bytes(self) -> int:
        """Memory the refresh work in flight may hold at once, besides the state: a block's
        snapshot and result while computed, and results waiting in memory for their swap.

        Inline (workers = 0) blocks are refreshed one at a time at the boundary, and a result of
        a disk-homed block goes to a file at once (`stage_result`): one block's work, plus the
        results of memory-homed blocks that wait d steps. With workers a round of snapshots and
        results may be held before the boundary that stages them: all of them count."""
        policy = self.live.current
        one = held = 0
        for info in self.opt.refresh_blocks():
            snapshot, result = self._refresh_work(info)
            if policy.workers > 0:
                held += snapshot + result
                continue
            one = max(one, snapshot + result)
            if policy.delay > 0 and not self._offsets.get(info.key.param):
                held += result
        return held + one

    def _refresh_work(self, info: BlockInfo) -> tuple[int, int]:
        """Upper bounds of one block's snapshot (factor, and basis when the refresh reads it)
        and result (basis, rotation when the swap rotates, transport at its first swap)."""
        config = self.opt.refresh_config(info.key)
        square = info.size ** 2 * self._factor_itemsize(info.key.param)
        return square * (1 + config.needs_basis), square * (2 + config.rotate)

    def _factor_itemsize(self, index: int) -> int:
        return max((e.dtype.itemsize for e in (self.entries[i] for i in self.by_param[index])
                    if e.path[0] == "factors"), default=4)

    # ------------------------------------------------------------------ figures, shutdown
    def tier_bytes(self) -> dict[str, int]:
        """Bytes of state per home tier."""
        return dict(self._tier_bytes)

    def memory_bytes(self) -> int:
        """Bytes of state the plan keeps in this process's memory: the host tier and its
        staging buffers, and the device tier when the device is the CPU."""
        held = self.plan.used(self.entries, Tier.HOST) + self.plan.slots * self.plan.slot_bytes
        if self.device.type == "cpu":
            held += self.plan.used(self.entries, Tier.DEVICE)
        return held

    def hit_ratio(self) -> float | None:
        total = self.hits + self.misses
        return self.hits / total if total else None

    def figures(self) -> TierFigures:
        """Bytes and budget per tier (the host tier counts the disk tier's staging buffers)."""
        used = self.tier_bytes()
        policy = self._policy
        assert policy is not None  # configured at construction
        total = sum(used.values())
        staging = self.plan.slots * self.plan.slot_bytes
        held: dict[str, int] = {Tier.DEVICE: used[Tier.DEVICE],
                                Tier.HOST: used[Tier.HOST] + staging}
        capacity: dict[str, int] = {Tier.DEVICE: policy.device_budget_bytes or total,
                    Tier.HOST: policy.host_budget_bytes or total + staging}
        if self.plan.slots:
            held[Tier.DISK], capacity[Tier.DISK] = used[Tier.DISK], total
        with self._moved_lock:
            moved = {src: dict(by_dst) for src, by_dst in self._transfer_bytes.items()}
        return TierFigures(bytes=held, capacity_bytes=capacity,
                           prefetch_hit_ratio=self.hit_ratio(), transfer_bytes=moved)

    def _moved(self, src: str, dst: str, nbytes: int) -> None:
        """Count bytes moved between tiers (from the I/O threads too); the record carries the
        totals, from which the exporter derives its counter."""
        with self._moved_lock:
            by_dst = self._transfer_bytes.setdefault(str(src), {})
            by_dst[str(dst)] = by_dst.get(str(dst), 0) + nbytes

    def close(self) -> None:
        """Finish pending writes and stop the I/O threads (idempotent)."""
        if not self._threads:
            return
        try:
            self._drain()
        finally:
            for q in (self._reads, self._writes):
                q.put(None)
            for t in self._threads:
                t.join(timeout=30)
            self._threads = []
            if self.disk is not None:
                self.disk.close()
            if self.results is not None:
                self.results.close()
            if self._copies is not None:
                self._copies.unregister()


__all__ = ["TierFileError", "TierStore"]
