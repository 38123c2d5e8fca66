"""The critical-path suite's words: each configuration's step time and spikes, its idle time by
cause, and native and Asteria-SOAP against the peers (the targets, as measured)."""

from __future__ import annotations

from typing import Any

from asteria_bench.reports import fmt
from asteria_bench.results import Words
from asteria_bench.turns import final_turn_loss, time_to_loss


def render(data: dict[str, Any], words: Words) -> None:
    runs = [dict(r) for r in data["runs"]]  # each given its time to AdamW's loss below
    words.findings += data["config"].get("failures", [])
    by_label = {r["label"]: r for r in runs}
    adamw = by_label["AdamW"]
    target = final_turn_loss(adamw)
    for r in runs:
        r["to_target_steps"], r["to_target_s"] = time_to_loss(r, target)
    table = words.table(
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
        table.add(r["label"], fmt(r["p50_ms"]), fmt(r["p90_ms"]), fmt(r["p99_ms"]),
                  fmt(r["max_ms"]), fmt(r["mean_ms"]), fmt(r["spike"], ".2f"),
                  "-" if overhead is None else f"{overhead:+.0%}",
                  fmt(r["idle_s"].get("refresh_wait", 0.0), ".2f"), r["staleness_max"],
                  fmt(r["final_val_loss"], ".4f"), fmt(r["to_target_s"], ".1f"))
    causes = sorted({cause for r in runs for cause in r["idle_s"]})
    if causes:
        idle = words.table("Idle by cause (seconds over the run)", ["configuration", *causes])
        for r in runs:
            idle.add(r["label"], *(fmt(r["idle_s"].get(c, 0.0), ".2f") for c in causes))
    compare(words, by_label)


def compare(words: Words, by_label: dict[str, dict[str, Any]]) -> None:
    """The targets, as measured: native SOAP against the fastest peer SOAP, and
    Asteria-SOAP against every peer."""
    native, ours, kl_native, kl_ours = (by_label.get(k) for k in (
        "native SOAP", "Asteria-SOAP", "native KL-Shampoo", "Asteria-KL-Shampoo"))
    for name, plain, background in (("SOAP", native, ours), ("KL-Shampoo", kl_native, kl_ours),
                                    ("Shampoo", by_label.get("native Shampoo"),
                                     by_label.get("Asteria-Shampoo"))):
        if plain and background:
            words.findings.append(
                f"Asteria-{name} against native {name}: spike {background['spike']:.2f} vs "
                f"{plain['spike']:.2f}, p99 {background['p99_ms']:.0f} vs {plain['p99_ms']:.0f} "
                f"ms, mean step {background['mean_ms'] / plain['mean_ms']:.2f}x native's, "
                f"val loss {background['final_val_loss']:.4f} vs {plain['final_val_loss']:.4f}.")
    if native and ours:
        words.quote("soap_spike", [ours["spike"], native["spike"]],
                    "refresh spikes: Asteria-SOAP's slowest step of a turn is {value[0]:.2f}x "
                    "the turn's median, native SOAP's {value[1]:.2f}x")
    names = {"kl_shampoo": "KL-Shampoo", "shampoo": "Shampoo"}
    for peer in (r for r in by_label.values() if r["peer"] and r["family"] in names):
        name = names[peer["family"]]
        plain, background = by_label.get(f"native {name}"), by_label.get(f"Asteria-{name}")
        if plain and background:
            words.findings.append(
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
    words.quote("native_soap_p50_vs_fastest_peer", ratio,
                "native SOAP's p50 step is {value:.2f}x the fastest peer SOAP's")
    words.findings.append(
        f"Native SOAP against the fastest peer ({fastest['label']}): p50 {ratio:.2f}x, mean "
        f"{native['mean_ms'] / fastest['mean_ms']:.2f}x (target: at most 1.00 on both).")
    table = words.table("Asteria-SOAP against each peer SOAP (ratios; below 1 is Asteria ahead)",
                        ["peer", "p99", "mean step", "train s to AdamW's loss", "val loss"])
    for peer in peers:
        to_target = "-" if not (ours["to_target_s"] and peer["to_target_s"]) else \
            f"{ours['to_target_s'] / peer['to_target_s']:.2f}"
        table.add(peer["label"], f"{ours['p99_ms'] / peer['p99_ms']:.2f}",
                  f"{ours['mean_ms'] / peer['mean_ms']:.2f}", to_target,
                  f"{ours['final_val_loss']:.4f} vs {peer['final_val_loss']:.4f}")
    worst_p99 = max(ours["p99_ms"] / p["p99_ms"] for p in peers)
    words.quote("asteria_soap_p99_vs_peers", worst_p99,
                "Asteria-SOAP's p99 step is {value:.2f}x that of the peer SOAP with the "
                "lowest p99")
