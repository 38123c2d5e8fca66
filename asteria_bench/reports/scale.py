"""The scale suite's words: step time, refresh, memory and `asteria plan`'s predictions per size
and arrangement, the tokens-per-step axis, the Hugging Face row, and each figure's fitted growth
with the parameter count."""

from __future__ import annotations

from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites.scale import (
    BLOCK,
    BOUND,
    OVERHEAD_TARGET,
    figures,
    plan_error,
    sizes_of,
)


def render(data: dict[str, Any], words: Words) -> None:
    config = data["config"]
    by_size = sizes_of(data["runs"])
    steps = words.table("Step time per size (ms; interleaved turns, after the warm-up turns)",
                        ["size", "params", "arrangement", "arm", "p50", "mean", "p99", "spike",
                          "worst spike", "CPU mean", "CPU spike"],
                        note="spike: the median over turns of a turn's slowest step over its "
                             "median; worst spike: the same for the worst turn. CPU: the "
                             "training thread's own CPU time per step (in device-host, the "
                             "device's busy time; wall minus CPU is time its core went to "
                             "other work).")
    verdict = words.table(
        "Asteria-SOAP against native SOAP, per size and arrangement",
        ["size", "params", "arrangement", "SOAP", "Asteria / native mean",
         "Asteria / native CPU mean", "worst spike", "CPU spike"],
        note="device-host: training pinned to core 0 with one thread for every arm, Asteria's "
             "worker pinned to core 1, native SOAP refreshing inline on core 0; shared: two "
             "training threads and the worker share both cores.")
    refresh = words.table(
        f"Refresh per size (Asteria-SOAP, 1 worker thread, S = {BOUND})",
        ["size", "params", "arrangement", "SOAP", "blocks", "round work s", "interval s", "duty",
         "staleness max / S", "refresh_wait ms/step", "swap ms/step"],
        note="duty = one round's refresh work (worker seconds, every block) over the training "
             "time of one interval; above 1 the worker cannot keep up.")
    memory = words.table("Memory per size", ["size", "params", "arm", "moments MB",
                                              "factors MB", "bases MB",
                                              "peak RSS MB (all arms)"])
    soaps = {"asteria": ("native", "references' defaults"),
             "asteria_block": ("native_block", f"block {BLOCK}")}
    for size in by_size:
        for arrangement, runs in size["runs"].items():
            for r in runs.values():
                steps.add(size["size"], size["params"], arrangement, r["label"],
                          round(r["p50_ms"], 1), round(r["mean_ms"], 1), round(r["p99_ms"], 1),
                          round(r["spike"], 2), round(r["spike_max"], 2),
                          round(r["cpu_mean_ms"], 1), round(r["cpu_spike"], 2))
            for ours_key, (native_key, soap) in soaps.items():
                if ours_key not in runs:
                    continue
                ours, native = runs[ours_key], runs[native_key]
                verdict.add(size["size"], size["params"], arrangement, soap,
                            round(ours["mean_ms"] / native["mean_ms"], 3),
                            round(ours["cpu_mean_ms"] / native["cpu_mean_ms"], 3),
                            round(ours["spike_max"], 2), round(ours["cpu_spike"], 2))
                refresh.add(size["size"], size["params"], arrangement, soap,
                            ours.get("blocks", 0), round(ours.get("round_work_s", 0.0), 3),
                            round(ours.get("interval_train_s", 0.0), 3),
                            round(ours.get("refresh_duty", 0.0), 3),
                            f"{ours['staleness_max']} / {BOUND}",
                            round(ours["refresh_wait_ms_per_step"], 2),
                            round(ours["swap_ms_per_step"], 2))
        for r in size["runs"]["shared"].values():
            kinds = r["state_bytes"]
            memory.add(size["size"], size["params"], r["label"],
                       *(round(kinds[k] / 2**20, 2) for k in ("moments", "factors", "bases")),
                       round((size["peak_rss_bytes"]["shared"] or 0) / 2**20, 1))
    tokens = words.table("SOAP's overhead over AdamW against tokens per step (shared, one size)",
                         ["size", "params", "batch", "tokens/step", "AdamW mean ms",
                           "Asteria-SOAP mean ms", "overhead"])
    for row in config["tokens_axis"]:
        tokens.add(row["size"], row["params"], row["batch"], row["tokens_per_step"],
                   round(row["adamw_mean_ms"], 1), round(row["asteria_mean_ms"], 1),
                   f"{100 * row['overhead']:.0f}%")
    planned = words.table(
        "asteria plan against the ladder: one round's refresh work, predicted and measured",
        ["size", "params", "arrangement", "SOAP", "predicted s", "measured s", "error",
         "predicted duty", "measured duty"],
        note="predicted: `asteria plan`'s refresh cost per block side, measured on this host by "
             "its calibration (wider sides extrapolated, an estimate), times the blocks, at the "
             "arm's measured step time; measured: the engine's mean refresh time times the "
             "blocks.")
    for size in by_size:
        for arrangement, runs in size["runs"].items():
            for key, (_, soap) in soaps.items():
                r = runs.get(key)
                if not r or "plan" not in r or not r.get("round_work_s"):
                    continue
                planned.add(size["size"], size["params"], arrangement, soap,
                            round(r["plan"]["round_work_s"], 3), round(r["round_work_s"], 3),
                            f"{100 * plan_error(r):+.0f}%"
                            + (" (estimate)" if r["plan"]["estimated"] else ""),
                            round(r["plan"]["duty"], 3), round(r["refresh_duty"], 3))
    hf = config.get("hf_row")
    if hf:
        words.table(f"A Hugging Face architecture: {hf['model']} through "
                    "asteria_core.integrations.hf (HF Trainer)",
                    ["params", "tokens/step", "steps", "p50 ms", "mean ms", "p99 ms", "blocks",
                      "duty", "staleness max / S", "state MB", "peak RSS MB", "records",
                      "metrics exported"]).add(
            hf["params"], hf["tokens_per_step"], hf["steps"], round(hf["p50_ms"], 1),
            round(hf["mean_ms"], 1), round(hf["p99_ms"], 1), hf["blocks"],
            round(hf["refresh_duty"] or 0.0, 3), f"{hf['staleness_max']} / {hf['staleness_bound']}",
            round(hf["state_bytes_total"] / 2**20, 1), round((hf["peak_rss_bytes"] or 0) / 2**20),
            hf["records"], hf["metrics_exported"])
    table = words.table("How each figure grows: y = a N^k fitted on log-log axes "
                        "(N: parameters)", ["figure", "k", "a", "sizes"])
    for key, label, _ in figures(by_size):
        fit = config["fits"].get(key)
        if fit is not None:
            table.add(label, round(fit["exponent"], 3), f"{fit['prefactor']:.3g}",
                      fit["points"])
    _conclude(words, config, by_size)


def _conclude(words: Words, config: dict[str, Any], by_size: list[dict[str, Any]]) -> None:
    fitted = config["fits"]
    largest = by_size[-1]
    for arrangement, runs in largest["runs"].items():
        ratio = runs["asteria"]["mean_ms"] / runs["native"]["mean_ms"]
        text = (f"at {largest['size']} ({largest['params'] / 1e6:.1f}M parameters), "
                f"{arrangement}, Asteria-SOAP's mean step is {{value:.2f}}x native SOAP's")
        if arrangement == "device-host":  # the headline: the arrangement a GPU host stands for
            words.quote("asteria_over_native_largest", ratio, text)
        else:
            words.findings.append(text.format(value=ratio) + ".")
    if "asteria_step_ms" in fitted:
        words.quote("asteria_step_exponent", fitted["asteria_step_ms"]["exponent"],
                    "Asteria-SOAP's step time grows as N^{value:.2f} with the parameters N")
    for size in by_size:
        for arrangement, runs in size["runs"].items():
            for key in ("asteria", "asteria_block"):
                a = runs.get(key)
                if not a or a.get("refresh_duty") is None:
                    continue
                behind = a["refresh_duty"] > 1
                words.findings.append(
                    f"{size['size']} ({size['params'] / 1e6:.2f}M parameters), {arrangement}, "
                    f"{a['label']}: a round of refreshes takes {a['round_work_s']:.2f} worker-s "
                    f"against {a['interval_train_s']:.2f} s of training per interval (duty "
                    f"{a['refresh_duty']:.2f}); staleness reached {a['staleness_max']} of "
                    f"S = {BOUND} and the step waited {a['refresh_wait_ms_per_step']:.1f} ms per "
                    "step as refresh_wait"
                    + (" (the worker cannot keep up: the bound holds and the wait is counted)."
                       if behind else "."))
    tokens = config.get("tokens_axis") or []
    under = [row for row in tokens if row["overhead"] < OVERHEAD_TARGET]
    if tokens:
        words.findings.append(
            f"Tokens per step at {tokens[0]['size']}: Asteria-SOAP's overhead over AdamW goes "
            + ", ".join(f"{100 * r['overhead']:.0f}% at {r['tokens_per_step']}"
                        for r in tokens)
            + (f"; it falls under {100 * OVERHEAD_TARGET:.0f}% from batch {under[0]['batch']} "
               f"({under[0]['tokens_per_step']} tokens per step)." if under else
               f"; it stays above {100 * OVERHEAD_TARGET:.0f}% up to "
               f"{tokens[-1]['tokens_per_step']} tokens per step."))
    checked = [r for size in by_size for runs in size["runs"].values() for r in runs.values()
               if "plan" in r and r.get("round_work_s")]
    if checked:
        worst = max(checked, key=lambda r: abs(plan_error(r)))
        within = sum(abs(plan_error(r)) <= 0.25 for r in checked)
        words.quote("plan_worst_error", abs(plan_error(worst)),
                    "`asteria plan` predicts a round's refresh work within {value:.0%} of the "
                    "measured one at every size and arrangement of the ladder")
        words.findings.append(
            f"asteria plan: {within} of {len(checked)} predictions of a round's refresh work "
            f"within 25% of the measured one; the worst, {100 * plan_error(worst):+.0f}%, at "
            f"{worst['size']} ({worst['arrangement']}, {worst['label']}).")
    hf = config.get("hf_row")
    if hf:
        words.findings.append(
            f"{hf['model']} at {hf['params'] / 1e6:.0f}M parameters trained {hf['steps']} steps "
            f"through HF's Trainer with Asteria-SOAP: mean step {hf['mean_ms'] / 1e3:.2f} s, "
            f"{hf['records']} step records, staleness {hf['staleness_max']} of S = "
            f"{hf['staleness_bound']}, refresh duty {hf['refresh_duty'] or 0:.2f}, "
            f"/metrics {'scraped while it trained' if hf['metrics_exported'] else 'NOT seen'}.")
    for key, fit in fitted.items():
        words.findings.append(f"{key}: fitted exponent {fit['exponent']:.2f} over "
                              f"{fit['points']} sizes.")
    ours = largest["runs"]["shared"]["asteria"]
    words.findings.append(
        f"Peak RSS of the largest size with all its arms resident (shared): "
        f"{(largest['peak_rss_bytes']['shared'] or 0) / 2**30:.2f} GiB; its SOAP state: "
        f"{ours['state_bytes_total'] / 2**30:.3f} GiB.")
