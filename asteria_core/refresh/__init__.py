"""Preconditioner refreshes off the critical path: workers, bounded staleness, swaps."""

from asteria_core.refresh.engine import RefreshEngine, RefreshFailed
from asteria_core.refresh.workers import Job, ProcessWorkers, ThreadWorkers

__all__ = ["Job", "ProcessWorkers", "RefreshEngine", "RefreshFailed", "ThreadWorkers"]
