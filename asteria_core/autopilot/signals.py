"""What the autopilot reads: a window of step records (their JSON form, as the JSONL file, the
run store and `/runs/{id}/steps` hold them) boiled down to the figures its rules compare.
Pure: the same records give the same figures."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Record = Mapping[str, Any]


@dataclass(frozen=True)
class Signals:
    steps: int
    """Records read."""
    duty: float | None
    """Median refresh duty: a round's refresh work over the workers' capacity in one interval
    (the record's refresh.background_load); above 1 the workers cannot keep up. None inline or
    before a refresh."""
    refresh_wait: float
    """Share of the window's wall time the training thread waited for a refresh."""
    transfer_wait: float
    """Share waited for optimizer state to arrive from a slower tier."""
    sync_wait: float
    """Share waited for another rank (data-parallel runs)."""
    at_bound: float
    """Share of steps whose staleness reached the bound S."""
    disk_bytes: int = 0
    """Optimizer-state bytes on the disk tier after the newest step."""

    @property
    def demand(self) -> float | None:
        """The duty without the waits: a step that waits for a refresh stretches the interval
        the duty is measured over (it reads about 1 however far behind the workers are), so
        the work against the training time alone is duty / (1 - refresh_wait share)."""
        if self.duty is None:
            return None
        return self.duty / max(1.0 - self.refresh_wait, 0.05)

    def describe(self) -> str:
        """The figures as a reason cites them: "refresh duty 1.60, refresh_wait 12% of step
        time over 30 steps"."""
        figures = [] if self.duty is None else [f"refresh duty {self.duty:.2f}"]
        for name in ("refresh_wait", "transfer_wait", "sync_wait"):
            share = getattr(self, name)
            if share >= 0.005:
                figures.append(f"{name} {share:.0%} of step time")
        return f"{', '.join(figures) or 'nothing amiss'} over {self.steps} steps"


def _idle(record: Record, cause: str) -> float:
    timing = record.get("timing") or {}
    return float((timing.get("idle_seconds") or {}).get(cause, 0.0))


def read(records: Sequence[Record]) -> Signals:
    """The figures of `records` (at least one)."""
    wall = sum(float(r["step_seconds"]) for r in records) or math.inf
    refresh = [r["refresh"] for r in records if r.get("refresh")]
    duties = [f["background_load"] for f in refresh if f.get("background_load") is not None]
    at_bound = sum(1 for f in refresh if f["staleness_bound"] > 0
                   and f["staleness_max"] >= f["staleness_bound"])
    tiers = [r["tiers"] for r in records if r.get("tiers")]
    return Signals(
        steps=len(records),
        disk_bytes=int(tiers[-1]["bytes"].get("disk", 0)) if tiers else 0,
        duty=statistics.median(duties) if duties else None,
        refresh_wait=sum(_idle(r, "refresh_wait") for r in records) / wall,
        transfer_wait=sum(_idle(r, "transfer_wait") for r in records) / wall,
        sync_wait=sum(_idle(r, "sync_wait") for r in records) / wall,
        at_bound=at_bound / len(refresh) if refresh else 0.0)


@dataclass(frozen=True)
class LossShift:
    """The loss after a change against before it, with the noise of the difference."""

    before: float
    after: float
    noise: float
    """Two standard errors of after - before."""
    source: str
    """train | eval."""

    def regressed(self, tolerance: float) -> bool:
        return self.after - self.before > self.noise + tolerance

    def describe(self) -> str:
        return (f"{self.source} loss {self.after:.4f} after against {self.before:.4f} before "
                f"(noise {self.noise:.4f})")


def loss_shift(before: Sequence[Record], after: Sequence[Record]) -> LossShift | None:
    """Eval loss when both sides have one (the last before, the first after), else the mean
    train loss of each side; None without enough losses (fewer than five a side)."""
    evals_before = [r["eval_loss"] for r in before if r.get("eval_loss") is not None]
    evals_after = [r["eval_loss"] for r in after if r.get("eval_loss") is not None]
    if evals_before and evals_after:
        return LossShift(evals_before[-1], evals_after[0], 0.0, "eval")
    a = [float(r["loss"]) for r in before if r.get("loss") is not None]
    b = [float(r["loss"]) for r in after if r.get("loss") is not None]
    if len(a) < 5 or len(b) < 5:
        return None
    noise = 2 * math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return LossShift(statistics.fmean(a), statistics.fmean(b), noise, "train")
