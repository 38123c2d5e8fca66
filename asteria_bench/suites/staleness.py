"""Staleness: what the bound S costs and buys (the paper's Fig. 9 question).

Asteria-SOAP with d = S in {1, 2, 3, 5, 10} ({1, 5, 10} in the quick run; refresh on one host
worker, paced) beside native SOAP (refresh inline, S = 0), the same model, seed and batches, in
turns of one refresh interval (asteria_bench/turns.py). Per S: final validation loss, training
wall-clock, the time waited at the bound (refresh_wait), the spike ratio and the largest
staleness seen.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from asteria_bench.options import BenchOptions
from asteria_bench.plots import xy_plot
from asteria_bench.results import SuiteResult
from asteria_bench.turns import (
    CPU_MODEL,
    GPU_MODEL,
    INTERVAL,
    NATIVE,
    SOAP,
    Config,
    asteria,
    round_robin,
)

TITLE = "Staleness: final loss and wall-clock against the bound S"
BOUNDS = {"quick": (1, 5, 10), "full": (1, 2, 3, 5, 10)}
STEPS = {"quick": 30, "full": 120}


def run(opts: BenchOptions) -> SuiteResult:
    steps = opts.pick(STEPS["quick"], STEPS["full"])
    bounds = opts.pick(BOUNDS["quick"], BOUNDS["full"])
    model = GPU_MODEL if opts.device == "cuda" else CPU_MODEL
    result = SuiteResult("staleness", TITLE, opts.quick, opts.command,
                         config={"steps": steps, "refresh_interval": INTERVAL, "bounds": bounds,
                                 "model_args": model})
    chosen = [Config("native SOAP (S = 0)", SOAP + NATIVE, "soap")] + \
        [Config(f"Asteria-SOAP S={s}", SOAP + asteria(s), "soap") for s in bounds]
    with tempfile.TemporaryDirectory() as tmp:
        runs = round_robin(chosen, steps, Path(tmp), opts, model)
    result.runs = runs
    result.config["params"] = runs[0]["params"]
    native = runs[0]
    xs = [0, *bounds]
    result.plots.append(xy_plot(
        [("final val loss", xs, [r["final_val_loss"] for r in runs])],
        opts.out_dir / "staleness-loss.png", title=f"final validation loss against S "
        f"({steps} steps; S = 0: native)", xlabel="staleness bound S (steps)",
        ylabel="validation loss (measured)"))
    result.plots.append(xy_plot(
        [("train s / native", xs, [r["train_s"] / native["train_s"] for r in runs]),
         ("refresh wait / train s", xs,
          [r["idle_s"].get("refresh_wait", 0.0) / r["train_s"] for r in runs])],
        opts.out_dir / "staleness-time.png", title="wall-clock against S (S = 0: native)",
        xlabel="staleness bound S (steps)", ylabel="ratio (measured)"))
    result.save(opts.out_dir)
    return result
