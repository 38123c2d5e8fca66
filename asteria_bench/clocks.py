"""What the suites read off a process besides wall-clock time: the training thread's CPU inside
an optimizer's basis swaps and the process's peak RSS. The optimizer state's bytes by kind are
the product's own figure (asteria_core/telemetry/state_bytes.py)."""

from __future__ import annotations

import contextlib
import resource
import time
from pathlib import Path


class SwapClock:
    """The training thread's CPU inside the optimizer's basis swaps (`apply_refresh`: installing
    a new basis and re-expressing the moments in it); zero for an optimizer without them."""

    def __init__(self, optimizer) -> None:
        self.seconds = 0.0
        apply = getattr(optimizer, "apply_refresh", None)
        if apply is None:
            return

        def timed(key, result):
            t0 = time.thread_time()
            try:
                return apply(key, result)
            finally:
                self.seconds += time.thread_time() - t0
        optimizer.apply_refresh = timed


def peak_rss_bytes() -> int:
    """This process's peak RSS: VmHWM (since its exec, or since `reset_peak_rss`). Not
    ru_maxrss: Linux keeps it across execve, so a worker started by a large parent would report
    the parent's peak; it is the fallback only where /proc is missing."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> None:
    """VmHWM := VmRSS now (Linux 4.0+), so the next peak is what comes after (where it cannot
    be reset, the peak is the process's so far, as VmHWM says)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")

