"""The machine this process runs on, and the upper bounds it sets on what a run may ask for.

Every count and size a config or a policy change can set (workers, threads, model size, batch,
corpus) is bounded by what this machine can hold, so no request can fork hundreds of processes,
start ten thousand threads or allocate more memory than there is. The bounds are read once, at
import, from the CPUs this process may run on and the memory it may use (the cgroup's limit
where it is lower than the physical memory).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROCESS_WORKER_BYTES = 512 << 20
"""What one refresh worker process costs at least (a Python with torch imported, ~250 MB
resident, and its share of the job's tensors)."""


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _memory_bytes() -> int:
    """Physical memory, or this process's memory cgroup's limit where lower (its own cgroup
    and those above it: /proc/self/cgroup says which; not the root's, which has none)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = _cgroup_limit(Path("/proc/self/cgroup").read_text(), CGROUP_ROOT)
    except OSError:
        limit = None
    return physical if limit is None else min(physical, limit)


@dataclass(frozen=True, slots=True)
class Machine:
    cores: int
    memory_bytes: int

    @property
    def max_workers(self) -> int:
        """Refresh workers: one per core (more cannot run at once); 2 on the smallest box."""
        return max(2, self.cores)

    def rank_cores(self, local_ranks: int) -> int:
        """The cores one of `local_ranks` processes on this machine has (a node's data-parallel
        ranks share it), at least one."""
        return max(1, self.cores // max(1, local_ranks))

    @property
    def max_threads(self) -> int:
        """Intra-op threads of training or of one worker: the cores (more only contend)."""
        return self.cores

    @property
    def memory_budget(self) -> int:
        """Bytes one run may plan to use (model, optimizer state, activations, corpus): half of
        the memory, the other half is for the rest of the process and the machine."""
        return self.memory_bytes // 2

    @property
    def max_process_workers(self) -> int:
        """Worker processes that fit in the memory budget, at most `max_workers`."""
        return max(1, min(self.max_workers, self.memory_budget // PROCESS_WORKER_BYTES))

    def describe(self) -> str:
        return f"{self.cores} cores, {self.memory_bytes / 2**30:.1f} GiB memory"


# ------------------------------------------------------------------ the memory a run may fill


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """The memory this process may use, and where that figure comes from."""

    bytes: int
    source: str  # "cgroup" (its memory cgroup's limit) or "MemAvailable" (no limit set)


def _cgroup_limit(proc_cgroup: str, root: Path) -> int | None:
    """The lowest memory limit on the way from the process's own cgroup up to the root (a
    limit applies to everything under it): cgroup v1's memory.limit_in_bytes, v2's memory.max.
    None when none is set."""
    limits = []
    for line in proc_cgroup.splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base, name = root / "memory", "memory.limit_in_bytes"  # v1
        elif hierarchy == "0" and not controllers:
            base, name = root, "memory.max"  # v2 (unified)
        else:
            continue
        folder = base / path.lstrip("/")
        for where in (folder, *folder.parents):
            if base not in (where, *where.parents):
                break
            try:
                text = (where / name).read_text().strip()
            except OSError:
                continue
            if text.isdigit():
                limits.append(int(text))
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limits = [n for n in limits if n < physical]  # v1 writes "no limit" as a huge number
    return min(limits, default=None)


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def memory_limit() -> MemoryLimit:
    """Read now (a run may be started inside a cgroup after this module was imported)."""
    try:
        limit = _cgroup_limit(Path("/proc/self/cgroup").read_text(), CGROUP_ROOT)
    except OSError:
        limit = None
    if limit is not None:
        return MemoryLimit(limit, "cgroup")
    return MemoryLimit(_mem_available(), "MemAvailable")


MACHINE = Machine(_cores(), _memory_bytes())


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def memory_shortfall(state_bytes: int, params_bytes: int, limit: MemoryLimit,
                     in_flight_bytes: int = 0) -> str | None:
    """Why an optimizer whose state is planned for memory (`state_bytes`, of which
    `in_flight_bytes` refresh work in flight: snapshots and results waiting for their swap),
    next to the model's parameters and gradients (`params_bytes`), cannot fit the memory
    `limit`; None when it fits. Said before training, so a run is refused up front instead of
    killed at step 1."""
    short = state_bytes + params_bytes - limit.bytes
    if short <= 0:
        return None
    of_which = f" (of which {_size(in_flight_bytes)} refresh work in flight)" \
        if in_flight_bytes else ""
    return (f"optimizer state needs {_size(state_bytes)} in memory{of_which}, parameters and "
            f"gradients {_size(params_bytes)}, the memory limit is {_size(limit.bytes)} "
            f"({limit.source}): {_size(short)} short; set a host budget and a disk tier "
            "(--policy.offload_mode disk --policy.device_budget_bytes N --policy.host_budget_bytes "
            "N --policy.disk_dir DIR; on a CPU the device tier is host memory too)")
