"""Which runs of the optimizers suite count: where a validation curve reaches a target, each
family's tuned and quickest configuration, the target itself, and the figures' medians and
ratios. The suite (asteria_bench/suites/optimizers.py) chooses what to train next with these,
and its report (asteria_bench/optimizers_report.py) reads the same, so a resumed run follows
the choices it made.

A run is a dict as the suite saves it: family, lr, seed, interval (None: the runtime's
default), arrangement, final_val_loss and curve ({"step", "val_loss", "wall_s", "energy_j"} at
each evaluation, in step order).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

SHARED, DEVICE_HOST = "shared", "device-host"
RACE = ("adamw", "muon", "soap", "asteria_soap")
"""The race to tuned AdamW's loss: what a practitioner picks from, and Asteria's own SOAP."""

def reach(curve: list[dict[str, float]], target: float) -> dict[str, float] | None:
    """Where a validation curve first reaches `target` (loss <= target).

    `curve`: evaluations in step order, each {"step", "val_loss", "wall_s", "energy_j"}. Between
    the last evaluation above the target and the first at or below it, the step, seconds and
    joules are interpolated linearly in the loss. None when no evaluation reaches the target.
    """
    for i, point in enumerate(curve):
        if point["val_loss"] <= target:
            prev = curve[i - 1] if i else point  # above the target, so above this point
            frac = 1.0 if i == 0 else \
                (prev["val_loss"] - target) / (prev["val_loss"] - point["val_loss"])
            out = {}
            for key in ("step", "wall_s", "energy_j"):
                a, b = prev.get(key), point.get(key)
                out[key] = None if a is None or b is None else a + frac * (b - a)
            return out
    return None


def ratio(value: float | None, reference: float | None) -> float | None:
    """value / reference, None when either is missing or the reference is not positive."""
    if value is None or reference is None or not reference > 0:
        return None
    return value / reference


def widen(lrs: list[float], best: float, limit: float = 10.0) -> float | None:
    """The next lr when the best of `lrs` sits at an edge of them: one step past that edge (the
    ratio of the two lrs there); None when it is inside, the grid has one lr, or the next would
    pass `limit` (the trainer's largest lr)."""
    lrs = sorted(lrs)
    if len(lrs) < 2 or lrs[0] < best < lrs[-1]:
        return None
    nxt = lrs[0] ** 2 / lrs[1] if best == lrs[0] else lrs[-1] ** 2 / lrs[-2]
    return float(f"{nxt:.3g}") if 0 < nxt <= limit else None


def bracketed(lrs: list[float], best: float) -> bool:
    """The tuned lr lies strictly inside what ran."""
    lrs = sorted(lrs)
    return len(lrs) >= 3 and lrs[0] < best < lrs[-1]


def spread(values: list[float | None]) -> dict[str, Any]:
    """Median, min and max of the values that exist, with how many there are and how many
    are missing (a run that never reached the target)."""
    got = [v for v in values if v is not None and math.isfinite(v)]
    if not got:
        return {"n": 0, "missing": len(values), "median": None, "min": None, "max": None}
    return {"n": len(got), "missing": len(values) - len(got),
            "median": statistics.median(got), "min": min(got), "max": max(got)}


def efficiency(l_init: float, l_final: float, energy: float | None,
               adamw_energy: float | None) -> float | None:
    """The paper's energy-normalised loss reduction: (L_init - L_final) / (E / E_AdamW)."""
    r = ratio(energy, adamw_energy)
    return None if r is None or not r > 0 else (l_init - l_final) / r


def lr_text(value: float) -> str:
    """An lr as the grids write it: 3e-3, 1.5e-2."""
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def arrangement_of(run: dict[str, Any]) -> str:
    """Where a run trained (runs saved before arrangements were named trained shared)."""
    return run.get("arrangement", SHARED)


def other_arrangement(arrangement: str) -> str:
    return SHARED if arrangement == DEVICE_HOST else DEVICE_HOST


def tuning(run: dict[str, Any]) -> bool:
    """A run of the tuning itself: the first seed, at the runtime's refresh interval."""
    return not run.get("seed") and run.get("interval") is None


def best_of(runs: list[dict[str, Any]], family: str,
            arrangement: str = SHARED) -> dict[str, Any] | None:
    """The tuned run of a family in an arrangement: the lowest final validation loss over its lr
    grid, on the first seed."""
    found = [r for r in runs if r["family"] == family and arrangement_of(r) == arrangement
             and tuning(r) and math.isfinite(r["final_val_loss"])]
    return min(found, key=lambda r: r["final_val_loss"]) if found else None


def target_of(runs: list[dict[str, Any]], arrangement: str) -> float | None:
    """Tuned AdamW's final validation loss, the median over its seeds (None before it ran)."""
    adamw = best_of(runs, "adamw", arrangement)
    if adamw is None:
        return None
    return statistics.median(r["final_val_loss"] for r in seeds_of(runs, adamw))


def quickest(runs: list[dict[str, Any]], family: str, target: float | None,
             arrangement: str) -> dict[str, Any] | None:
    """A family's quickest configuration in an arrangement: of its first-seed runs at the tuned
    lr (one per refresh interval it trained; the lr a run of the other arrangement was given
    where none was tuned here), the least training wall-clock to the target; the tuned run where
    none reaches it."""
    tuned = best_of(runs, family, arrangement)
    found = [r for r in runs if r["family"] == family and arrangement_of(r) == arrangement
             and not r.get("seed") and (tuned is None or r["lr"] == tuned["lr"])]
    timed = [(got["wall_s"], i) for i, r in enumerate(found)
             if target is not None and (got := reach(r["curve"], target))
             and got["wall_s"] is not None]
    if timed:
        return found[min(timed)[1]]
    return tuned or (found[0] if found else None)


def seeds_of(runs: list[dict[str, Any]], tuned: dict[str, Any]) -> list[dict[str, Any]]:
    """Every seed of a tuned configuration: its family, arrangement, lr and interval."""
    return [r for r in runs if r["family"] == tuned["family"] and r["lr"] == tuned["lr"]
            and arrangement_of(r) == arrangement_of(tuned)
            and r.get("interval") == tuned.get("interval")]
