"""The serving suite's words: what telemetry costs a step, what the control plane's clients
cost a served run in each CPU layout, and how long a stop takes beside busy cores."""

from __future__ import annotations

import statistics
from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites.serving import STOP_TARGET_SECONDS


def render(data: dict[str, Any], words: Words) -> None:
    config = data["config"]
    tel, api = config["telemetry"], config["control_plane"]
    stops = [r["seconds"] for r in data["runs"] if r["kind"] == "stop"]
    t = words.table(
        f"Telemetry: step time with /metrics scraped at {config['scrape_hz']:g} Hz against "
        f"telemetry off ({tel['params'] / 1e6:.2f}M-parameter GPT, {config['steps']} steps per arm "
        f"in alternating blocks of {config['block']})",
        ["params", "step ms, off", "step ms, on + scrape", "measured overhead (median of block "
         "pairs)", "pooled", "telemetry CPU per step (us)", "accounted overhead",
         "render /metrics ms", "exposition bytes", "scrapes"],
        note="accounted = (record sink + one wait() + a scrape's rendering per step at the "
             "scrape rate) in training-thread CPU time over the off arm's step time")
    measured = statistics.median(tel["overheads"])
    pooled = tel["med_on"] / tel["med_off"] - 1
    accounted = tel["per_step_cpu"] / tel["med_off"]
    t.add(tel["params"], round(tel["med_off"] * 1e3, 2), round(tel["med_on"] * 1e3, 2),
          f"{measured * 100:+.2f}%", f"{pooled * 100:+.2f}%", round(tel["per_step_cpu"] * 1e6),
          f"{accounted * 100:.3f}%", round(tel["render"] * 1e3, 3), tel["bytes"],
          tel["scrapes"])
    a = words.table(
        f"Control plane under load: {config['pollers']} clients polling a run and its steps at "
        f"2 Hz plus {config['sse_clients']} SSE clients, against no clients (alternating "
        f"{config['window']:g} s windows of one run, {config['rounds']} rounds)",
        ["layout", "requests/s", "API p50 ms", "API p99 ms", "SSE events", "step ms, no clients",
         "step ms, with clients", "slowdown"],
        note="pinned: training thread on its own CPU (--train.cpus), server threads and clients "
             "on another; shared: the whole server on one CPU. Latencies are the clients' own, "
             "measured at nice 19 beside the server, so they include its queueing")
    for layout, r in api.items():
        a.add(layout, round(r["requests_per_second"], 1), round(r["p50"], 2),
              round(r["p99"], 1), r["events"], round(r["quiet"] * 1e3, 1),
              round(r["loaded"] * 1e3, 1), f"{r['slowdown'] * 100:+.1f}%")
    st = words.table(
        f"Stopping: seconds from SIGINT to exit of `asteria train`, its checkpoint written, "
        f"beside a busy process on every core ({len(stops)} stops)",
        ["runs", "median s", "max s", "target (max) s"],
        note="alternately AdamW serving /metrics and SOAP on worker processes still starting")
    st.add(len(stops), round(statistics.median(stops), 2), round(max(stops), 2),
           STOP_TARGET_SECONDS)
    words.findings.append(
        f"A stop beside busy cores took {statistics.median(stops):.1f} s (median) and "
        f"{max(stops):.1f} s at most over {len(stops)} runs, against a {STOP_TARGET_SECONDS:g} s "
        f"target{'' if max(stops) <= STOP_TARGET_SECONDS else ': OVER the target'}.")
    words.quote("telemetry_overhead_pct", round(accounted * 100, 3),
                "telemetry with /metrics scraped at 1 Hz costs {value:.2f}% of a step in "
                "training-thread CPU time")
    pinned = api.get("pinned") or next(iter(api.values()))
    words.quote("api_pinned_slowdown_pct", round(pinned["slowdown"] * 100, 1),
                f"{config['pollers']} clients polling at 2 Hz plus {config['sse_clients']} SSE "
                "streams change a pinned training step's time by {value:+.1f}%")
    words.quote("api_p50_ms", round(pinned["p50"], 2),
                "the control plane answers a poll in {value:.1f} ms (p50) beside training")
    words.findings.append(
        f"Telemetry on with a {config['scrape_hz']:g} Hz scrape: median step "
        f"{tel['med_on'] * 1e3:.1f} ms against {tel['med_off'] * 1e3:.1f} ms off, "
        f"{measured * 100:+.2f}% as the median of {len(tel['overheads'])} block pairs "
        f"({pooled * 100:+.2f}% pooled); accounted in CPU time it is "
        f"{tel['per_step_cpu'] * 1e6:.0f} us per step, {accounted * 100:.3f}% of the step "
        f"(record sink {tel['sink'] * 1e6:.0f} us, one /metrics rendering "
        f"{tel['render'] * 1e3:.2f} ms).")
    for layout, r in api.items():
        words.findings.append(
            f"{layout}: at {r['requests_per_second']:.0f} requests/s the training step took "
            f"{r['loaded'] * 1e3:.1f} ms with clients against {r['quiet'] * 1e3:.1f} ms "
            f"without ({r['slowdown'] * 100:+.1f}%, medians of {r['steps_loaded']} and "
            f"{r['steps_quiet']} steps); API p50 {r['p50']:.1f} ms, p99 {r['p99']:.1f} ms.")
