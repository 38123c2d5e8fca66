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
    at the steps' own time (the record's refresh.background_load); above 1 the workers cannot
    keep up. None inline or before a refresh."""
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
    latency: int | None = None
    """The newest record's refresh latency: a job's release to its result, in steps of their
    own length (90th percentile of the last refreshes). None inline or before a refresh."""
    lead: int | None = None
    """The newest record's swap lead L = d - V + 1 (None outside the swap schedule)."""

    @property
    def latency_at_lead(self) -> bool:
        """Refreshes take as long as their lead or longer (p90): where the workers keep up and
        steps wait, they wait for latency, not for capacity (at the lead, for the tenth of the
        refreshes above it)."""
        return self.latency is not None and self.lead is not None and self.latency >= self.lead

    def describe(self) -> str:
        """The figures as a reason cites them: "refresh duty 1.60, refresh_wait 12% of step
        time over 30 steps"."""
        figures = [] if self.duty is None else [f"refresh duty {self.duty:.2f}"]
        if self.latency_at_lead:
            figures.append(f"refresh latency (p90) {self.latency} steps against a lead of "
                           f"{self.lead}")
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
    newest = refresh[-1] if refresh else {}
    return Signals(
        latency=newest.get("refresh_latency_steps"), lead=newest.get("swap_lead"),
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
