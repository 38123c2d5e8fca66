"""Control-plane load: 50 clients polling status and steps at 2 Hz plus 5 SSE clients.

Measures API latency (p50/p99 over every poll) and the training step time with and without the
clients, in alternating windows of one run, so the ratio is measured side by side:

    .venv/bin/python benchmarks/bench_api.py --window 20 --rounds 3

The server trains the served default run (SOAP, one host refresh worker) with 1 intra-op thread.
On this 2-core machine two CPU layouts are measured, one server each:

- `pinned` (what a deployment does, and the target's layout): the training thread is pinned to
  CPU 0 with `--train.cpus 0` (its refresh worker inherits it); the server's other threads (event
  loop, store writer) and this load generator share CPU 1. What is left is what serving costs the
  training thread inside one process: the GIL and caches. The clients run at nice 19, standing
  in for remote ones: at equal priority they preempt the server's event loop on CPU 1 while it
  holds the GIL, and training waits for it (measured: +29% step time at nice 0).
- `shared` (worst case): the whole server process on CPU 0, so every request's CPU time is taken
  from training; the load generator on CPU 1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

TOKEN = "bench-token"
LAYOUTS = ("pinned", "shared")


def start_server(port: int, data_dir: str, layout: str, extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "backend.cli", "serve", "--port", str(port),
           "--data-dir", data_dir, "--train.steps", "1000000", "--train.threads", "1",
           "--train.eval_interval", "100000", *extra]
    if os.cpu_count() and os.cpu_count() >= 2:
        if layout == "pinned":
            cmd = ["taskset", "-c", "1", *cmd, "--train.cpus", "0"]
        else:
            cmd = ["taskset", "-c", "0", *cmd]
        os.sched_setaffinity(0, {1})
    return subprocess.Popen(cmd, env={**os.environ, "ASTERIA_TOKEN": TOKEN},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def poller(client: httpx.AsyncClient, run_id: str, stop: asyncio.Event,
                 latencies: list[float]) -> None:
    since = 0
    await asyncio.sleep(random.uniform(0, 0.5))  # independent clients: not all in phase
    while not stop.is_set():
        t0 = time.perf_counter()
        await client.get(f"/runs/{run_id}")
        latencies.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        page = (await client.get(f"/runs/{run_id}/steps", params={"since": since})).json()
        latencies.append(time.perf_counter() - t0)
        since = page["next_since"]
        await asyncio.sleep(0.5)


async def sse_client(base: str, run_id: str, stop: asyncio.Event, counter: list[int]) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=None) as client, \
            client.stream("GET", f"/runs/{run_id}/events") as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                counter[0] += 1
            if stop.is_set():
                return


async def load_window(base: str, run_id: str, seconds: float) -> tuple[list[float], int]:
    stop, latencies, events = asyncio.Event(), [], [0]
    limits = httpx.Limits(max_connections=60)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        tasks = [asyncio.create_task(poller(client, run_id, stop, latencies)) for _ in range(50)]
        tasks += [asyncio.create_task(sse_client(base, run_id, stop, events)) for _ in range(5)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.wait(tasks, timeout=10)
        for task in tasks:
            task.cancel()
    return latencies, events[0]


def run_clients(base: str, run_id: str, seconds: float) -> tuple[list[float], int]:
    """The load window in a thread of its own at nice 19 (Linux nices threads one by one): the
    clients stand in for remote ones, so they must not preempt the server's threads on the CPU
    they share here; a server thread descheduled while holding the GIL stalls training too."""
    out: list = []

    def clients() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        out.append(asyncio.run(load_window(base, run_id, seconds)))

    thread = threading.Thread(target=clients)
    thread.start()
    thread.join()
    return out[0]


def step_times(base: str, run_id: str, t0: float, t1: float) -> list[float]:
    steps = httpx.get(f"{base}/runs/{run_id}/steps", params={"limit": 10000}).json()["steps"]
    return [s["step_seconds"] for s in steps if t0 <= s["time"] - s["step_seconds"] and
            s["time"] <= t1]


def measure(layout: str, port: int, window: float, rounds: int, extra: list[str]) -> dict:
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        proc = start_server(port, tmp, layout, extra)
        try:
            deadline = time.time() + 120
            while True:
                try:
                    run_id = httpx.get(f"{base}/healthz").json()["active_run"]
                    if run_id:
                        break
                except httpx.HTTPError:
                    pass
                assert time.time() < deadline, "server did not start"
                time.sleep(0.2)
            time.sleep(5)  # let the first steps warm up
            quiet, loaded, latencies, events = [], [], [], 0
            for r in range(rounds):
                t0 = time.time()
                time.sleep(window)
                quiet += step_times(base, run_id, t0, time.time())
                t0 = time.time()
                lat, n_events = run_clients(base, run_id, window)
                loaded += step_times(base, run_id, t0, time.time())
                latencies += lat
                events += n_events
                print(f"{layout} round {r + 1}/{rounds}: quiet "
                      f"{statistics.median(quiet) * 1e3:.1f} ms, loaded "
                      f"{statistics.median(loaded) * 1e3:.1f} ms, "
                      f"{len(lat)} requests", flush=True)
        finally:
            proc.terminate()
            proc.wait(60)
    lat_ms = sorted(x * 1e3 for x in latencies)
    return {
        "requests": len(lat_ms),
        "requests_per_second": len(lat_ms) / (window * rounds),
        "api_p50_ms": lat_ms[len(lat_ms) // 2],
        "api_p99_ms": lat_ms[int(len(lat_ms) * 0.99)],
        "sse_events_received": events,
        "step_ms_quiet_median": statistics.median(quiet) * 1e3,
        "step_ms_loaded_median": statistics.median(loaded) * 1e3,
        "slowdown": statistics.median(loaded) / statistics.median(quiet) - 1,
        "steps_quiet": len(quiet), "steps_loaded": len(loaded),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=8791)
    parser.add_argument("--layouts", nargs="+", choices=LAYOUTS, default=list(LAYOUTS))
    parser.add_argument("--out", default="benchmarks/results/api.json")
    parser.add_argument("--server-args", default="",
                        help="extra `asteria serve` arguments, e.g. '--optim.name adamw'")
    args = parser.parse_args()
    results = {layout: measure(layout, args.port, args.window, args.rounds,
                               args.server_args.split()) for layout in args.layouts}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print("\n| layout | requests/s | API p50 ms | API p99 ms | SSE events | step ms quiet "
          "| step ms loaded | slowdown |")
    print("|---|---|---|---|---|---|---|---|")
    for layout, r in results.items():
        print(f"| {layout} | {r['requests_per_second']:.0f} | {r['api_p50_ms']:.1f} | "
              f"{r['api_p99_ms']:.1f} | {r['sse_events_received']} | "
              f"{r['step_ms_quiet_median']:.1f} | {r['step_ms_loaded_median']:.1f} | "
              f"{r['slowdown'] * 100:+.1f}% |")


if __name__ == "__main__":
    main()
