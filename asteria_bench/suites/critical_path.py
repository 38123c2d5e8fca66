"""Critical path: what the optimizer adds to a step, native against Asteria, beside the peers.

AdamW, native SOAP and KL-Shampoo (refresh inline at the step), Asteria-SOAP and
Asteria-KL-Shampoo (refresh on one host worker, paced, d = S = 10), and the peers' SOAP (and
Shampoo or KL-Shampoo where a peer ships one; the `bench` extra) train the same model from the
same seed on the same batches, in turns of one refresh interval (asteria_bench/turns.py). Per
configuration: step time p50/p90/p99/max/mean over the steps after the warm-up turns, the spike
ratio, the optimizer's visible overhead (mean step over AdamW's), idle by cause, the final
validation loss, and the training time until the mean training loss of a turn first reaches
AdamW's last turn's (the same batches for all, so those means compare).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from asteria_bench.options import BenchOptions
from asteria_bench.plots import step_time_plot
from asteria_bench.results import SuiteResult
from asteria_bench.turns import (
    ADAMW,
    CPU_MODEL,
    GPU_MODEL,
    INTERVAL,
    KL,
    NATIVE,
    SHAMPOO,
    SOAP,
    Config,
    asteria,
    round_robin,
)

TITLE = "Critical path: step time, spikes and idle, native against Asteria and the peers"
STEPS = {"quick": 30, "full": 120}


def configs(opts: BenchOptions) -> list[Config]:
    """Ours, then the peers: SOAP's always, KL-Shampoo's and Shampoo's in the full run (with
    our Shampoo beside a Shampoo peer). A peer runs at our lr for its family, refresh inline."""
    background = asteria(INTERVAL)
    if opts.device == "cuda":
        background = asteria(INTERVAL, workers=2, worker_threads=2)
    found = [
        Config("AdamW", ADAMW, "adamw"),
        Config("native SOAP", SOAP + NATIVE, "soap"),
        Config("Asteria-SOAP", SOAP + background, "soap"),
        Config("native KL-Shampoo", KL + NATIVE, "kl_shampoo"),
        Config("Asteria-KL-Shampoo", KL + background, "kl_shampoo"),
    ]
    if not opts.peers:
        return found
    from asteria_bench import peers

    families = {"soap": SOAP} if opts.quick else {"soap": SOAP, "kl_shampoo": KL,
                                                   "shampoo": SHAMPOO}
    for family, ours in families.items():
        names = peers.available_peers(family)
        if names and family == "shampoo":
            found += [Config("native Shampoo", SHAMPOO + NATIVE, "shampoo"),
                      Config("Asteria-Shampoo", SHAMPOO + background, "shampoo")]
        found += [Config(peers.peer_label(name), ours + NATIVE, family, peer=name)
                  for name in names]
    return found


def run(opts: BenchOptions) -> SuiteResult:
    steps = opts.pick(STEPS["quick"], STEPS["full"])
    model = GPU_MODEL if opts.device == "cuda" else CPU_MODEL
    result = SuiteResult("critical-path", TITLE, opts.quick, opts.command,
                         config={"steps": steps, "refresh_interval": INTERVAL,
                                 "model_args": model, "turn_steps": INTERVAL,
                                 "measured_steps": f"steps {INTERVAL + 1}..{steps}"})
    chosen = configs(opts)
    failures: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = round_robin(chosen, steps, Path(tmp), opts, model, failures)
    result.runs = runs
    result.config["params"] = runs[0]["params"]
    result.config["failures"] = failures  # a peer's run that raised, and why
    result.plots.append(step_time_plot(runs, opts.out_dir / "critical-path-steps.png",
                                       f"step time per step, refresh every {INTERVAL} steps, "
                                       "configurations in turns"))
    result.save(opts.out_dir)
    return result
