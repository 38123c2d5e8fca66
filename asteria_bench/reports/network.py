"""The network suite's words: each configuration at each loopback rate, and S = 5 against the
synchronous exchange and Distributed Shampoo."""

from __future__ import annotations

from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites import distributed
from asteria_bench.suites.distributed import DS_FP32, SYNC


def render(data: dict[str, Any], words: Words) -> None:
    config, rows = data["config"], data["runs"]
    if not any("distributed_shampoo" in args for _, args in config["configurations"]):
        words.findings.append(distributed.HOW_TO_GET + ".")
    t = words.table(
        f"2 ranks on a loopback limited by tc tbf ({config['steps']} steps, refresh every "
        f"{config['interval']}; timings after the first round)",
        ["rate", "configuration", "step p50 ms", "step mean ms", "sync_wait ms/step",
         "staleness max", "bytes/step/rank"],
        note="the rate is the namespace loopback's, shared by every rank's traffic in both "
             "directions, DDP's gradient all-reduce included")
    for r in rows:
        t.add(r["rate"], r["label"], round(r["step_ms"], 1), round(r["step_ms_mean"], 1),
              "-" if r["sync_wait_ms_per_step"] is None else round(r["sync_wait_ms_per_step"], 2),
              r["staleness_max"], round(r["bytes_per_step_per_rank"]))

    def find(rate: str, label: str) -> dict | None:
        return next((r for r in rows if r["rate"] == rate and r["label"] == label), None)

    for rate in config["rates"]:
        soap, sync, ds = (find(rate, "Asteria SOAP S=5"), find(rate, SYNC),
                          find(rate, DS_FP32))
        if soap and sync:
            words.findings.append(
                f"At {rate}, S = 5 waited {soap['sync_wait_ms_per_step']:.2f} ms per step for "
                f"other ranks' bases against {sync['sync_wait_ms_per_step']:.2f} ms for the "
                f"synchronous exchange; step mean {soap['step_ms_mean']:.1f} against "
                f"{sync['step_ms_mean']:.1f} ms.")
            if rate == config["rates"][0]:
                words.quote("step_mean_sync_over_s5", round(
                    sync["step_ms_mean"] / soap["step_ms_mean"], 3),
                    f"at {rate} the synchronous exchange's mean step is {{value:.2f}}x S = 5's")
        if soap and ds:
            words.findings.append(
                f"At {rate}, Distributed Shampoo's per-step all-gather made its mean step "
                f"{ds['step_ms_mean']:.1f} ms against Asteria S = 5's "
                f"{soap['step_ms_mean']:.1f} ms.")
