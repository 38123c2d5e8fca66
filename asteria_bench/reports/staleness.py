"""The staleness suite's words: each bound S against native SOAP, the fastest bound, and the
bounds that were overrun or waited at."""

from __future__ import annotations

from typing import Any

from asteria_bench.results import Words


def _bound(r: dict[str, Any]) -> str:
    return r["label"].split()[-1]  # "S=5"


def render(data: dict[str, Any], words: Words) -> None:
    runs, steps = data["runs"], data["config"]["steps"]
    native, background = runs[0], runs[1:]
    table = words.table(
        f"Bound S against native SOAP ({native['params'] / 1e6:.1f}M parameters, {steps} steps)",
        ["configuration", "val loss", "train s", "train s / native", "refresh wait s",
         "spike", "p99 ms", "max staleness"])
    for r in runs:
        table.add(r["label"], f"{r['final_val_loss']:.4f}", f"{r['train_s']:.1f}",
                  f"{r['train_s'] / native['train_s']:.2f}",
                  f"{r['idle_s'].get('refresh_wait', 0.0):.2f}", f"{r['spike']:.2f}",
                  f"{r['p99_ms']:.0f}", r["staleness_max"])
    best = min(background, key=lambda r: r["train_s"])
    words.quote("staleness_best_wallclock", [_bound(best), best["train_s"] / native["train_s"],
                                             best["final_val_loss"] - native["final_val_loss"]],
                "staleness sweep: the fastest bound ({value[0]}) trains in {value[1]:.2f}x "
                "native SOAP's wall-clock, val loss {value[2]:+.4f} against native's")
    for r in background:
        if r["staleness_max"] > int(r["label"].split("=")[-1]):
            words.findings.append(f"{r['label']}: staleness reached {r['staleness_max']}, "
                                  "over its bound.")
    waited = [r for r in background if r["idle_s"].get("refresh_wait", 0.0) > 0.05 * r["train_s"]]
    if waited:
        words.findings.append(
            "Bounds where the step waited for the refresh more than 5% of the run: " +
            ", ".join(f"{_bound(r)} ({r['idle_s']['refresh_wait']:.1f} s)" for r in waited) +
            ": the bound is shorter than a round takes on the worker, so training waits at it.")
