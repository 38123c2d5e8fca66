"""`serving`: telemetry and control-plane overhead under load.

Telemetry. Two trainers of the same config live in this process, one with telemetry (serving
/metrics, scraped at 1 Hz by a client thread, like Prometheus) and one with telemetry off. They
train in alternating blocks (on, off, off, on, ...), so drift in the machine's load hits both
alike; the scraper only runs while the telemetry trainer trains. Step time is the loop period
(between successive step records), so it includes all per-step telemetry work and the scrapes'
rendering competing for the same cores; a warm-up of each arm and evaluation steps are left
out. The measured overhead is the median over block pairs of (median on / median off - 1). On a
machine shared with other work that difference drowns in noise, so telemetry's cost is also
accounted directly in CPU time of the training thread: its record sink per step, the trainer's
one `wait()` per step, and a scrape's rendering spread over the steps between scrapes, as a
share of the off arm's step time.

Control plane. `asteria serve` runs in a subprocess of its own (this package never imports the
control plane; it talks HTTP to it, as a client would) and trains its default run (SOAP, one
host refresh worker, 1 intra-op thread). 50 clients poll the run's status and steps at 2 Hz and
5 follow its SSE events, in windows that alternate with windows without clients, in one run;
API latency is every poll's, step times come from the run's own step records. Two CPU layouts,
one server each (on a machine with 2 or more CPUs):
- `pinned` (what a deployment does): the training thread pinned to the first CPU with
  `--train.cpus` (its refresh worker inherits it), the server's other threads and this load
  generator on the second. The clients run at nice 19, standing in for remote ones: at equal
  priority they preempt the server's event loop while it holds the GIL, and training waits for
  it (measured: +29% step time at nice 0).
- `shared` (worst case): the whole server process on the first CPU, so every request's CPU time
  is taken from training; the load generator on the second.

Stopping. `asteria train` gets SIGINT right after its first step while a busy process takes
every core, alternately AdamW serving /metrics and SOAP on worker processes that are still
starting: the seconds from the signal to the process's exit, with its checkpoint written (the
target: within 10 s; tests/asteria_core/train/test_stop_under_load.py checks the behaviour).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult, percentile
from asteria_core.machine import MACHINE

TITLE = "Serving: telemetry and control-plane overhead under load"
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "bench-token"
LAYOUTS = ("pinned", "shared")


@dataclass(frozen=True)
class Sizes:
    # telemetry
    steps: int            # measured steps per arm
    block: int            # steps per block
    warmup: int           # unmeasured steps per arm first
    scrape_hz: float
    overrides: tuple[str, ...]  # config of both trainers (`asteria train` keys)
    # control plane
    window: float         # seconds per window (quiet, then loaded)
    rounds: int
    settle: float         # seconds of the served run's first steps left out
    pollers: int
    sse_clients: int
    server_args: tuple[str, ...]
    # stopping
    stops: int            # SIGINTs beside busy cores, alternating AdamW and SOAP
    stop_args: tuple[str, ...] = ()  # model overrides of the stopped runs


FULL = Sizes(steps=400, block=20, warmup=20, scrape_hz=1.0, overrides=("--train.threads", "1"),
             window=20.0, rounds=3, settle=5.0, pollers=50, sse_clients=5, server_args=(),
             stops=10)
QUICK = Sizes(steps=30, block=10, warmup=5, scrape_hz=1.0, overrides=("--train.threads", "1"),
              window=3.0, rounds=2, settle=3.0, pollers=50, sse_clients=5, server_args=(),
              stops=4)


def run(opts: BenchOptions) -> SuiteResult:
    import torch

    sizes = opts.pick(QUICK, FULL)
    result = SuiteResult("serving", TITLE, opts.quick, opts.command,
                         config={**asdict(sizes), "device": opts.device, "layouts": LAYOUTS})
    threads = torch.get_num_threads()
    try:
        tel = telemetry_overhead(sizes, opts, result)
        result.save(opts.out_dir)
        api = {}
        for layout in LAYOUTS:
            api[layout] = control_plane(layout, sizes, opts, result)
            result.save(opts.out_dir)
        stop_latency(sizes, opts, result)
        result.save(opts.out_dir)
    finally:
        torch.set_num_threads(threads)  # the trainers set the process's thread count
    result.config["telemetry"] = tel
    result.config["control_plane"] = {layout: {k: v for k, v in r.items()
                                               if k not in ("quiet_all", "loaded_all")}
                                      for layout, r in api.items()}  # those two are in runs
    plot(result, tel, api, opts)
    result.save(opts.out_dir)
    return result


# ----------------------------------------------------------------------------- telemetry
class Scraper(threading.Thread):
    """GETs a /metrics URL every `period` seconds while `active` is set."""

    def __init__(self, url: str, period: float) -> None:
        super().__init__(daemon=True)
        self.url, self.period = url, period
        self.active, self.stop = threading.Event(), threading.Event()
        self.scrapes, self.last_bytes = 0, 0

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.active.wait(0.1) or self.stop.wait(self.period):
                continue
            if self.active.is_set():
                with urllib.request.urlopen(self.url, timeout=10) as response:
                    self.last_bytes = len(response.read())
                self.scrapes += 1


class Arm:
    """One trainer and the step periods it measured, block by block."""

    def __init__(self, telemetry: bool, sizes: Sizes, out_dir: str, device: str) -> None:
        from asteria_core.cli import resolve_config
        from asteria_core.train.trainer import Trainer

        total = sizes.steps + sizes.warmup
        config = resolve_config(None, [
            "--train.steps", str(total), "--train.out_dir", out_dir,
            "--train.eval_interval", str(total), "--train.device", device,
            "--telemetry.enabled", str(telemetry).lower(), *sizes.overrides])
        self.trainer = Trainer(config, jsonl=False)
        self.blocks: list[list[float]] = []
        self._last: float | None = None
        self.sink_cpu: list[float] = []
        if telemetry:  # telemetry's per-record work, timed in CPU seconds (robust to noise)
            reporter = self.trainer.runtime.reporter
            observe = reporter.observe

            def timed(record) -> None:
                t0 = time.thread_time()
                observe(record)
                self.sink_cpu.append(time.thread_time() - t0)

            reporter.observe = timed
        self.trainer.runtime.add_listener(self._stamp)

    def _stamp(self, record) -> None:
        now = time.perf_counter()
        if self._last is not None and record.eval_loss is None and self.blocks:
            self.blocks[-1].append(now - self._last)
        self._last = now

    def warm_up(self, n: int) -> None:
        """Unmeasured steps: allocators, caches and the first scrape settle."""
        self.trainer.train(stop_at=n, progress=False)

    def train_block(self, n: int) -> None:
        self.blocks.append([])
        self._last = None  # no period across blocks
        self.trainer.train(stop_at=self.trainer.step + n, progress=False)


def cpu_costs(telemetry, n: int = 2000) -> tuple[float, float]:
    """CPU seconds to render one exposition, and for one `wait()` outside a step."""
    t0 = time.thread_time()
    for _ in range(n // 20):
        telemetry.exposition()
    render = (time.thread_time() - t0) / (n // 20)
    t0 = time.thread_time()
    for _ in range(n):
        with telemetry.wait("data_wait"):
            pass
    return render, (time.thread_time() - t0) / n


def telemetry_overhead(sizes: Sizes, opts: BenchOptions, result: SuiteResult) -> dict:
    n_blocks = max(1, sizes.steps // sizes.block)
    with tempfile.TemporaryDirectory(prefix="asteria-bench-serving-") as tmp:
        on = Arm(True, sizes, tmp, opts.device)
        off = Arm(False, sizes, tmp, opts.device)
        port = on.trainer.telemetry.serve("127.0.0.1", 0)
        scraper = Scraper(f"http://127.0.0.1:{port}/metrics", 1.0 / sizes.scrape_hz)
        scraper.start()
        try:
            with progress(2 * n_blocks, "serving: telemetry on/off blocks", opts) as bar:
                scraper.active.set()
                on.warm_up(sizes.warmup)
                scraper.active.clear()
                off.warm_up(sizes.warmup)
                for i in range(n_blocks):
                    for arm in ((on, off) if i % 2 == 0 else (off, on)):
                        if arm is on:
                            scraper.active.set()
                        arm.train_block(sizes.block)
                        scraper.active.clear()
                        bar.update(1)
            render_s, wait_s = cpu_costs(on.trainer.telemetry)
        finally:
            scraper.stop.set()
            scraper.join()
            on.trainer.close()
            off.trainer.close()
    params = on.trainer.model_params
    for name, arm in (("on", on), ("off", off)):
        result.runs.append({"kind": "telemetry", "arm": name, "params": params,
                            "block_step_seconds": arm.blocks,
                            "sink_cpu_seconds": arm.sink_cpu or None})
    pairs = [(statistics.median(a), statistics.median(b))
             for a, b in zip(on.blocks, off.blocks, strict=True) if a and b]
    overheads = [a / b - 1 for a, b in pairs]
    med_on = statistics.median(p for block in on.blocks for p in block)
    med_off = statistics.median(p for block in off.blocks for p in block)
    sink = statistics.median(on.sink_cpu)
    # What telemetry costs per step in CPU time: its record sink, the trainer's one data_wait,
    # and the share of a scrape's rendering that falls into one step at the scrape rate.
    per_step_cpu = sink + wait_s + render_s * sizes.scrape_hz * med_off
    return {"params": params, "pairs": pairs, "overheads": overheads, "med_on": med_on,
            "med_off": med_off, "per_step_cpu": per_step_cpu, "sink": sink, "wait": wait_s,
            "render": render_s, "scrapes": scraper.scrapes, "bytes": scraper.last_bytes}


# ----------------------------------------------------------------------------- control plane
def start_server(port: int, data_dir: str, layout: str, sizes: Sizes, device: str,
                 cpus: list[int], log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "asteria", "serve", "--no-banner", "--port", str(port),
           "--data-dir", data_dir, "--train.steps", "1000000", "--train.threads", "1",
           "--train.eval_interval", "100000", "--train.device", device, *sizes.server_args]
    if len(cpus) >= 2 and shutil.which("taskset"):
        if layout == "pinned":
            cmd = ["taskset", "-c", str(cpus[1]), *cmd, "--train.cpus", str(cpus[0])]
        else:
            cmd = ["taskset", "-c", str(cpus[0]), *cmd]
    # Its output goes to a file: a pipe nobody reads while the clients run would fill and stall
    # the server.
    return subprocess.Popen(cmd, env={**os.environ, "ASTERIA_TOKEN": TOKEN}, cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)


async def poller(client, run_id: str, stop: asyncio.Event, latencies: list[float]) -> None:
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
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=None) as client, \
            client.stream("GET", f"/runs/{run_id}/events") as stream:
        async for line in stream.aiter_lines():
            if line.startswith("data:"):
                counter[0] += 1
            if stop.is_set():
                return


async def load_window(base: str, run_id: str, seconds: float, sizes: Sizes
                      ) -> tuple[list[float], int]:
    import httpx

    stop, latencies, events = asyncio.Event(), [], [0]
    limits = httpx.Limits(max_connections=sizes.pollers + 10)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        tasks = [asyncio.create_task(poller(client, run_id, stop, latencies))
                 for _ in range(sizes.pollers)]
        tasks += [asyncio.create_task(sse_client(base, run_id, stop, events))
                  for _ in range(sizes.sse_clients)]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.wait(tasks, timeout=10)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return latencies, events[0]


def run_clients(base: str, run_id: str, seconds: float, sizes: Sizes) -> tuple[list[float], int]:
    """The load window in a thread of its own at nice 19 (Linux nices threads one by one): the
    clients stand in for remote ones, so they must not preempt the server's threads on the CPU
    they share here; a server thread descheduled while holding the GIL stalls training too."""
    out: list = []

    def clients() -> None:
        os.setpriority(os.PRIO_PROCESS, 0, 19)
        out.append(asyncio.run(load_window(base, run_id, seconds, sizes)))

    thread = threading.Thread(target=clients)
    thread.start()
    thread.join()
    return out[0]


def step_times(base: str, run_id: str, t0: float, t1: float,
               timeout: float = 120.0) -> list[float]:
    """The served run's step times of the steps that began and ended inside [t0, t1].

    Asked once the run has recorded a step that ended after t1: the store writes records in
    batches, so a question asked at t1 can miss the window's last steps (on a busy machine, all
    of them). `timeout` is a hang guard only."""
    import httpx

    deadline = time.time() + timeout
    while True:
        steps = httpx.get(f"{base}/runs/{run_id}/steps", params={"limit": 10000},
                          timeout=30).json()["steps"]
        if any(s["time"] > t1 for s in steps) or time.time() > deadline:
            break
        time.sleep(0.2)
    return [s["step_seconds"] for s in steps if t0 <= s["time"] - s["step_seconds"] and
            s["time"] <= t1 and s.get("eval_loss") is None]


MAX_WINDOWS = 20  # a window is repeated until it holds a whole step: at most this many times


def quiet_window(base: str, run_id: str, seconds: float) -> list[float]:
    """Step times of a window without clients, lengthened until a whole step falls inside."""
    t0 = time.time()
    for _ in range(MAX_WINDOWS):
        time.sleep(seconds)
        times = step_times(base, run_id, t0, time.time())
        if times:
            break
    return times


def loaded_window(base: str, run_id: str, seconds: float, sizes: Sizes
                  ) -> tuple[list[float], list[float], int, float]:
    """Step times, request latencies and SSE events of a window with clients, lengthened the
    same way; and the window's seconds, with its clients' wind-down."""
    t0 = time.time()
    latencies: list[float] = []
    events = 0
    for _ in range(MAX_WINDOWS):
        lat, n_events = run_clients(base, run_id, seconds, sizes)
        latencies += lat
        events += n_events
        t1 = time.time()
        times = step_times(base, run_id, t0, t1)
        if times:
            break
    return times, latencies, events, t1 - t0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def control_plane(layout: str, sizes: Sizes, opts: BenchOptions, result: SuiteResult) -> dict:
    import httpx

    cpus = sorted(os.sched_getaffinity(0))
    affinity = os.sched_getaffinity(0)
    quiet, loaded, latencies, events, loaded_seconds = [], [], [], 0, 0.0
    with tempfile.TemporaryDirectory(prefix="asteria-bench-serve-") as tmp, \
            open(Path(tmp) / "serve.log", "w+b") as log:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_server(port, str(Path(tmp) / "data"), layout, sizes, opts.device, cpus,
                            log)
        try:
            if len(cpus) >= 2:  # this load generator beside the server's threads
                os.sched_setaffinity(0, {cpus[1]})
            deadline = time.time() + 120
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"asteria serve exited {proc.returncode}:\n"
                                       f"{log.read()[-3000:].decode(errors='replace')}")
                try:
                    run_id = httpx.get(f"{base}/healthz", timeout=5).json()["active_run"]
                    if run_id:
                        break
                except httpx.HTTPError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError("asteria serve did not start a run within 120 s")
                time.sleep(0.2)
            time.sleep(sizes.settle)  # let the first steps warm up
            with progress(sizes.rounds, f"serving: control plane, {layout}", opts) as bar:
                for r in range(sizes.rounds):
                    q = quiet_window(base, run_id, sizes.window)
                    ld, lat, n_events, seconds = loaded_window(base, run_id, sizes.window,
                                                               sizes)
                    loaded_seconds += seconds
                    quiet += q
                    loaded += ld
                    latencies += lat
                    events += n_events
                    lat_ms = sorted(x * 1e3 for x in lat)
                    result.runs.append({
                        "kind": "control_plane", "layout": layout, "round": r,
                        "window_seconds": sizes.window, "quiet_step_seconds": q,
                        "loaded_step_seconds": ld, "requests": len(lat),
                        "api_p50_ms": percentile(lat_ms, 0.5),
                        "api_p99_ms": percentile(lat_ms, 0.99), "sse_events": n_events})
                    bar.update(1)
        finally:
            os.sched_setaffinity(0, affinity)
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if not quiet or not loaded or not latencies:
        raise RuntimeError(f"control plane ({layout}): no steps or requests measured "
                           f"({len(quiet)} quiet, {len(loaded)} loaded steps, "
                           f"{len(latencies)} requests); a longer window is needed")
    lat_ms = sorted(x * 1e3 for x in latencies)
    return {
        "requests": len(lat_ms), "requests_per_second": len(lat_ms) / loaded_seconds,
        "p50": percentile(lat_ms, 0.5), "p99": percentile(lat_ms, 0.99), "events": events,
        "quiet": statistics.median(quiet), "loaded": statistics.median(loaded),
        "slowdown": statistics.median(loaded) / statistics.median(quiet) - 1,
        "steps_quiet": len(quiet), "steps_loaded": len(loaded),
        "quiet_all": quiet, "loaded_all": loaded,
    }


# ----------------------------------------------------------------------------- stopping
STOP_TARGET_SECONDS = 10.0
STOP_MODEL = ("--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
              "--model.block_size", "32", "--data.batch_size", "4")


def first_step_done(url: str, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    """Waits until the run's /metrics counts a step (`timeout` is a hang guard only)."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            body = urllib.request.urlopen(url, timeout=5).read().decode()
            steps = re.search(r"^asteria_steps(?:_total)? (\S+)$", body, re.M)
            if steps and float(steps[1]) > 0:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"no step seen on {url}; exit status {proc.poll()}")


def stop_latency(sizes: Sizes, opts: BenchOptions, result: SuiteResult) -> None:
    """Seconds from SIGINT to exit of `asteria train` beside a busy process on every core."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)]
    try:
        with progress(sizes.stops, "serving: stop beside busy cores", opts) as bar, \
                tempfile.TemporaryDirectory(prefix="asteria-bench-stop-") as tmp:
            for i in range(sizes.stops):
                soap = i % 2 == 1
                port = free_port()
                cmd = [sys.executable, "-m", "asteria_core.cli", "train", "--metrics-port",
                       str(port), "--train.out_dir", f"{tmp}/run{i}", "--train.steps",
                       "1000000", "--train.eval_interval", "100000", "--train.threads", "1",
                       "--train.device", opts.device, "--no-progress",
                       *(sizes.stop_args or STOP_MODEL)]
                if soap:
                    cmd += ["--optim.name", "soap", "--policy.worker_kind", "process",
                            "--policy.workers", str(min(2, MACHINE.max_process_workers))]
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
                try:
                    first_step_done(f"http://127.0.0.1:{port}/metrics", proc)
                    sent = time.time()
                    proc.send_signal(signal.SIGINT)
                    _, err = proc.communicate(timeout=300)
                    took = time.time() - sent
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.communicate()
                if proc.returncode != 130:
                    raise RuntimeError(f"a stopped run exited {proc.returncode}:\n{err[-2000:]}")
                result.runs.append({"kind": "stop", "optimizer": "soap" if soap else "adamw",
                                    "seconds": took})
                bar.update(1)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def plot(result: SuiteResult, tel: dict, api: dict, opts: BenchOptions) -> None:
    plt = pyplot()

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    blocks = range(1, len(tel["pairs"]) + 1)
    ax1.plot(blocks, [a * 1e3 for a, _ in tel["pairs"]], "o-", label="telemetry on + scrape")
    ax1.plot(blocks, [b * 1e3 for _, b in tel["pairs"]], "s-", label="telemetry off")
    ax1.set_xticks(list(blocks))
    ax1.set_xlabel("block pair")
    ax1.set_ylabel("median step time (ms)")
    ax1.set_title("telemetry: alternating blocks")
    ax1.legend(fontsize=8)
    data, labels = [], []
    for layout, r in api.items():
        data += [[x * 1e3 for x in r["quiet_all"]], [x * 1e3 for x in r["loaded_all"]]]
        labels += [f"{layout}\nno clients", f"{layout}\nclients"]
    ax2.boxplot(data)
    ax2.set_xticks(range(1, len(labels) + 1), labels)
    ax2.set_ylabel("training step time (ms)")
    ax2.set_title("control plane: windows without and with clients")
    ax2.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    result.plots.append(save(fig, opts.out_dir / "serving.png", "Left: median step time per block "
        "with telemetry on (and /metrics scraped) and off, in alternating "
        "blocks. Right: the served run's step times in windows without and "
        "with clients, per CPU layout.", dpi=120))
