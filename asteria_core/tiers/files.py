"""The disk tier of a plan: where each parameter's disk-homed entries sit in a staging buffer,
and the files they are read from and written to.

A parameter's disk-homed entries are laid out in one buffer, those written every step first;
each lifecycle class is a file of its own, so a step rewrites the written-every-step file and
leaves the bases' file alone (tiers/disk.py writes and checks the files).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asteria_core.policy import Policy
from asteria_core.telemetry.labels import Tier
from asteria_core.tiers.catalogue import StateCatalogue
from asteria_core.tiers.disk import DiskTier, fix_mmap_threshold
from asteria_core.tiers.figures import TierAccounts
from asteria_core.tiers.lifecycle import READ, WRITTEN, Entry, copy_structure, padded, set_leaf

Group = tuple[str, str, int, list[tuple[str, int, int]]]
"""One file of a parameter: (file name, lifecycle class, its start in the staging buffer,
parts: (entry name, offset from the start, bytes))."""


def disk_folder(policy: Policy, run_dir: Path) -> Path:
    """Where the disk tier keeps its files: the policy's disk_dir, else the run's own folder."""
    return Path(policy.disk_dir).expanduser() if policy.disk_dir else run_dir / "tiers"


class ParamFiles:
    """Each parameter's disk-homed state: its layout in a staging buffer and its files."""

    def __init__(self, accounts: TierAccounts) -> None:
        self.accounts = accounts
        self.disk: DiskTier | None = None
        """The disk tier, where the plan homes entries on disk."""
        self.offsets: dict[int, list[tuple[Entry, int]]] = {}
        """Parameter index -> its disk-homed entries and their offsets in a staging buffer."""
        self.groups: dict[int, list[Group]] = {}

    def configure(self, catalogue: StateCatalogue, folder: Path | None) -> None:
        """Lay out the entries the plan homes on disk (their `tier`), in files in `folder`
        (None: the plan homes nothing on disk, and the files in use stay open)."""
        if folder is not None:
            if self.disk is not None:
                self.disk.close()
            self.disk = DiskTier(folder)
            fix_mmap_threshold()
        self.offsets, self.groups = {}, {}
        for index in catalogue.by_param:
            off, layout, groups = 0, [], []
            for lifecycle in (WRITTEN, READ):
                start, parts = off, []
                for e in catalogue.of(index):
                    if e.tier == Tier.DISK and (e.lifecycle == READ) == (lifecycle == READ):
                        layout.append((e, off))
                        parts.append((e.name, off - start, e.nbytes))
                        off += padded(e.nbytes)
                if parts:
                    groups.append((f"p{index}.{lifecycle}", lifecycle, start, parts))
            self.offsets[index] = layout
            self.groups[index] = groups

    def on_disk(self, index: int) -> bool:
        """Whether parameter `index` has entries homed on disk."""
        return bool(self.offsets.get(index))

    def offsets_by_path(self, index: int) -> dict[tuple, int]:
        return {e.path: off for e, off in self.offsets.get(index, ())}

    def dirty(self, index: int, lifecycles: set[str]) -> list[Group]:
        """Parameter `index`'s files of the given lifecycle classes."""
        return [g for g in self.groups[index] if g[1] in lifecycles]

    def read(self, index: int, buf: np.ndarray) -> None:
        """Read parameter `index`'s files into `buf`, laid out as in a staging buffer."""
        for fname, _, start, parts in self.groups[index]:
            self._disk().read(fname, buf[start:], parts)
            self.accounts.moved(Tier.DISK, Tier.HOST, sum(n for _, _, n in parts))

    def write(self, buf: np.ndarray, groups: list[Group], src: str) -> None:
        """Write the files `groups` from `buf`; the bytes count as moved from tier `src`."""
        for fname, _, start, parts in groups:
            self._disk().write(fname, buf[start:], parts)
            self.accounts.moved(src, Tier.DISK, sum(n for _, _, n in parts))

    def remove_all(self) -> None:
        for groups in self.groups.values():
            for fname, *_ in groups:
                self._disk().remove(fname)

    def materialized(self, packed: dict) -> dict:
        """torch's packed optimizer state with every disk-tier entry put back, as a view of its
        file (after every write is done)."""
        out = {}
        for index, state in packed.items():
            state = copy_structure(state)
            if isinstance(index, int) and self.on_disk(index) and state:
                for path, t in self._mapped(index).items():
                    set_leaf(state, path, t)
            out[index] = state
        return out

    def _mapped(self, index: int) -> dict:
        """Parameter `index`'s disk-tier entries as views of their files."""
        by_name = {e.name: e for e, _ in self.offsets[index]}
        out = {}
        for fname, _, _, parts in self.groups[index]:
            for name, raw in self._disk().map(fname, parts).items():
                e = by_name[name]
                out[e.path] = raw.view(e.dtype).view(e.shape)
        return out

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()

    def _disk(self) -> DiskTier:
        """The disk tier, where the plan homes entries on disk (opened by `configure`)."""
        assert self.disk is not None
        return self.disk
