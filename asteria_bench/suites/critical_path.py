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
from typing import Any

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
    final_turn_loss,
    round_robin,
    time_to_loss,
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
    result.findings += failures
    result.config["params"] = runs[0]["params"]
    report(result, runs)
    result.plots.append(step_time_plot(runs, opts.out_dir / "critical-path-steps.png",
                                       f"step time per step, refresh every {INTERVAL} steps, "
                                       "configurations in turns"))
    result.save(opts.out_dir)
    return result


def _fmt(value: Any, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def report(result: SuiteResult, runs: list[dict[str, Any]]) -> None:
    by_label = {r["label"]: r for r in runs}
    adamw = by_label["AdamW"]
    target = final_turn_loss(adamw)
    for r in runs:
        r["to_target_steps"], r["to_target_s"] = time_to_loss(r, target)
    table = result.table(
        f"Step time ({runs[0]['params'] / 1e6:.1f}M parameters, steps after the first "
        f"{runs[0]['warmup_steps']})",
        ["configuration", "p50 ms", "p90 ms", "p99 ms", "max ms", "mean ms", "spike",
         "overhead vs AdamW", "refresh wait s", "max staleness", "val loss",
         "train s to AdamW's loss"],
        note=f"Overhead: mean step over AdamW's minus 1. Target loss: AdamW's mean training "
             f"loss over its last turn ({target:.4f}); time to it counts training steps only, "
             f"the first {runs[0]['warmup_steps']} at the configuration's median step.")
    for r in runs:
        overhead = r["mean_ms"] / adamw["mean_ms"] - 1 if r is not adamw else None
        table.add(r["label"], _fmt(r["p50_ms"]), _fmt(r["p90_ms"]), _fmt(r["p99_ms"]),
                  _fmt(r["max_ms"]), _fmt(r["mean_ms"]), _fmt(r["spike"], ".2f"),
                  "-" if overhead is None else f"{overhead:+.0%}",
                  _fmt(r["idle_s"].get("refresh_wait", 0.0), ".2f"), r["staleness_max"],
                  _fmt(r["final_val_loss"], ".4f"), _fmt(r["to_target_s"], ".1f"))
    causes = sorted({cause for r in runs for cause in r["idle_s"]})
    if causes:
        idle = result.table("Idle by cause (seconds over the run)", ["configuration", *causes])
        for r in runs:
            idle.add(r["label"], *(_fmt(r["idle_s"].get(c, 0.0), ".2f") for c in causes))
    compare(result, by_label)


def compare(result: SuiteResult, by_label: dict[str, dict[str, Any]]) -> None:
    """The targets, as measured: native SOAP against the fastest peer SOAP, and
    Asteria-SOAP against every peer."""
    native, ours, kl_native, kl_ours = (by_label.get(k) for k in (
        "native SOAP", "Asteria-SOAP", "native KL-Shampoo", "Asteria-KL-Shampoo"))
    for name, plain, background in (("SOAP", native, ours), ("KL-Shampoo", kl_native, kl_ours),
                                    ("Shampoo", by_label.get("native Shampoo"),
                                     by_label.get("Asteria-Shampoo"))):
        if plain and background:
            result.findings.append(
                f"Asteria-{name} against native {name}: spike {background['spike']:.2f} vs "
                f"{plain['spike']:.2f}, p99 {background['p99_ms']:.0f} vs {plain['p99_ms']:.0f} "
                f"ms, mean step {background['mean_ms'] / plain['mean_ms']:.2f}x native's, "
                f"val loss {background['final_val_loss']:.4f} vs {plain['final_val_loss']:.4f}.")
    if native and ours:
        result.quote("soap_spike", [ours["spike"], native["spike"]],
                     "refresh spikes: Asteria-SOAP's slowest step of a turn is {value[0]:.2f}x "
                     "the turn's median, native SOAP's {value[1]:.2f}x")
    names = {"kl_shampoo": "KL-Shampoo", "shampoo": "Shampoo"}
    for peer in (r for r in by_label.values() if r["peer"] and r["family"] in names):
        name = names[peer["family"]]
        plain, background = by_label.get(f"native {name}"), by_label.get(f"Asteria-{name}")
        if plain and background:
            result.findings.append(
                f"{peer['label']}: p50 / p99 / mean {peer['p50_ms']:.0f} / {peer['p99_ms']:.0f} "
                f"/ {peer['mean_ms']:.0f} ms, val loss {peer['final_val_loss']:.4f}; native "
                f"{name} {plain['p50_ms']:.0f} / {plain['p99_ms']:.0f} / {plain['mean_ms']:.0f}"
                f" ms, {plain['final_val_loss']:.4f}; Asteria-{name} "
                f"{background['p50_ms']:.0f} / {background['p99_ms']:.0f} / "
                f"{background['mean_ms']:.0f} ms, {background['final_val_loss']:.4f}.")
    peers = [r for r in by_label.values() if r["peer"] and r["family"] == "soap"]
    if not (peers and native and ours):
        return
    fastest = min(peers, key=lambda r: r["p50_ms"])
    ratio = native["p50_ms"] / fastest["p50_ms"]
    result.quote("native_soap_p50_vs_fastest_peer", ratio,
                 "native SOAP's p50 step is {value:.2f}x the fastest peer SOAP's")
    result.findings.append(
        f"Native SOAP against the fastest peer ({fastest['label']}): p50 {ratio:.2f}x, mean "
        f"{native['mean_ms'] / fastest['mean_ms']:.2f}x (target: at most 1.00 on both).")
    table = result.table("Asteria-SOAP against each peer SOAP (ratios; below 1 is Asteria ahead)",
                         ["peer", "p99", "mean step", "train s to AdamW's loss", "val loss"])
    for peer in peers:
        to_target = "-" if not (ours["to_target_s"] and peer["to_target_s"]) else \
            f"{ours['to_target_s'] / peer['to_target_s']:.2f}"
        table.add(peer["label"], f"{ours['p99_ms'] / peer['p99_ms']:.2f}",
                  f"{ours['mean_ms'] / peer['mean_ms']:.2f}", to_target,
                  f"{ours['final_val_loss']:.4f} vs {peer['final_val_loss']:.4f}")
    worst_p99 = max(ours["p99_ms"] / p["p99_ms"] for p in peers)
    result.quote("asteria_soap_p99_vs_peers", worst_p99,
                 "Asteria-SOAP's p99 step is {value:.2f}x that of the peer SOAP with the "
                 "lowest p99")
