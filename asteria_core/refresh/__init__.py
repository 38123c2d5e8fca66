"""Preconditioner refreshes off the critical path: workers, bounded staleness, swaps."""

from asteria_core.refresh.engine import RefreshEngine, RefreshFailed
from asteria_core.refresh.processes import ProcessWorkers
from asteria_core.refresh.workers import Job, ThreadWorkers

__all__ = ["Job", "ProcessWorkers", "RefreshEngine", "RefreshFailed", "ThreadWorkers"]
