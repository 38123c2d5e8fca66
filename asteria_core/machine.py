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

PROCESS_WORKER_BYTES = 512 << 20
"""What one refresh worker process costs at least (a Python with torch imported, ~250 MB
resident, and its share of the job's tensors)."""


def _cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _memory_bytes() -> int:
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in (Path("/sys/fs/cgroup/memory.max"),
                  Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            physical = min(physical, int(text))
    return physical


@dataclass(frozen=True, slots=True)
class Machine:
    cores: int
    memory_bytes: int

    @property
    def max_workers(self) -> int:
        """Refresh workers: one per core (more cannot run at once); 2 on the smallest box."""
        return max(2, self.cores)

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


MACHINE = Machine(_cores(), _memory_bytes())
