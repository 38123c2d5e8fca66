"""Telemetry overhead: step time with /metrics scraped at 1 Hz vs telemetry off.

    .venv/bin/python benchmarks/bench_telemetry.py --steps 400 --block 20

Two trainers of the same config live in one process, one with telemetry (serving /metrics,
scraped at 1 Hz by a client thread, like Prometheus) and one with telemetry off. They train in
alternating blocks of `--block` steps (on, off, off, on, ...), so drift in the machine's load
hits both alike; the scraper only runs while the telemetry trainer trains. Step time is the
loop period (between successive step records, taken by the last record sink), so it includes
all per-step telemetry work (idle attribution, metrics, energy polling) and the
scrapes' rendering competing for the same cores. A warm-up of each arm and evaluation steps are
left out. Measured overhead is the median over block pairs of (median on / median off - 1).

On a machine shared with other work, the step-time difference is drowned in noise; the
benchmark therefore also accounts telemetry's cost directly, in CPU time of the training
thread: its record sink per step, the trainer's one `wait()` per step, and a scrape's rendering
spread over the steps between scrapes, as a share of the off-arm step time. Writes
benchmarks/results/telemetry.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import torch

from asteria_core.cli import resolve_config
from asteria_core.train.trainer import Trainer

WARMUP = 20


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
                self.last_bytes = len(urllib.request.urlopen(self.url, timeout=10).read())
                self.scrapes += 1


class Arm:
    """One trainer and the step periods it measured, block by block."""

    def __init__(self, telemetry: bool, steps: int, out_dir: str, overrides: list[str]) -> None:
        config = resolve_config(None, [
            "--train.steps", str(steps + WARMUP), "--train.out_dir", out_dir,
            "--train.eval_interval", str(steps + WARMUP),
            "--telemetry.enabled", str(telemetry).lower(), *overrides])
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
        if self._last is not None and record.eval_loss is None:
            self.blocks[-1].append(now - self._last)
        self._last = now

    def warm_up(self) -> None:
        """Unmeasured steps: allocators, caches and the first scrape settle."""
        self.blocks.append([])
        self.trainer.train(stop_at=WARMUP, progress=False)
        self.blocks.pop()

    def train_block(self, n: int) -> None:
        self.blocks.append([])
        self._last = None  # no period across blocks (a checkpoint is written between them)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400, help="steps per arm")
    parser.add_argument("--block", type=int, default=20, help="steps per block")
    parser.add_argument("--scrape-hz", type=float, default=1.0)
    parser.add_argument("--out", default="benchmarks/results/telemetry.json")
    args, overrides = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        on, off = Arm(True, args.steps, tmp, overrides), Arm(False, args.steps, tmp, overrides)
        port = on.trainer.telemetry.serve("127.0.0.1", 0)
        scraper = Scraper(f"http://127.0.0.1:{port}/metrics", 1.0 / args.scrape_hz)
        scraper.start()
        scraper.active.set()
        on.warm_up()
        scraper.active.clear()
        off.warm_up()
        for i in range(args.steps // args.block):
            for arm in ((on, off) if i % 2 == 0 else (off, on)):
                if arm is on:
                    scraper.active.set()
                arm.train_block(args.block)
                scraper.active.clear()
            print(f"block {i + 1}/{args.steps // args.block}: median step on "
                  f"{statistics.median(on.blocks[-1]) * 1e3:.2f} ms, off "
                  f"{statistics.median(off.blocks[-1]) * 1e3:.2f} ms", flush=True)
        scraper.stop.set()
        scraper.join()
        render_s, wait_s = cpu_costs(on.trainer.telemetry)
        on.trainer.close()
        off.trainer.close()
    pairs = [(statistics.median(a), statistics.median(b))
             for a, b in zip(on.blocks, off.blocks, strict=True) if a and b]
    overheads = [a / b - 1 for a, b in pairs]
    med_on = statistics.median(p for block in on.blocks for p in block)
    med_off = statistics.median(p for block in off.blocks for p in block)
    # What telemetry costs per step in CPU time: its record sink, the trainer's one data_wait,
    # and the share of a scrape's rendering that falls into one step at the scrape rate.
    per_step_cpu = statistics.median(on.sink_cpu) + wait_s + render_s * args.scrape_hz * med_off
    summary = {
        "machine": f"{platform.machine()}, {torch.get_num_threads()} torch threads, "
                   f"torch {torch.__version__}",
        "params": on.trainer.model_params, "steps_per_arm": args.steps, "block": args.block,
        "scrape_hz": args.scrape_hz, "scrapes": scraper.scrapes, "overrides": overrides,
        "median_step_ms_off": med_off * 1e3, "median_step_ms_on": med_on * 1e3,
        "overhead_pct_median_of_blocks": 100 * statistics.median(overheads),
        "overhead_pct_pooled": 100 * (med_on / med_off - 1),
        "block_overheads_pct": [100 * o for o in overheads],
        "telemetry_cpu_us_per_step": per_step_cpu * 1e6,
        "sink_cpu_us_median": statistics.median(on.sink_cpu) * 1e6,
        "wait_cpu_us": wait_s * 1e6,
        "overhead_pct_accounted": 100 * per_step_cpu / med_off,
        "exposition_render_ms": render_s * 1e3, "exposition_bytes": scraper.last_bytes,
        "target_pct": 2.0,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(summary, indent=2))
    print(f"\n| params | step ms, off | step ms, on + {args.scrape_hz:g} Hz scrape | measured "
          "overhead (median of block pairs) | pooled | telemetry CPU per step | accounted "
          "overhead | render /metrics | target |\n|---|---|---|---|---|---|---|---|---|\n"
          f"| {summary['params'] / 1e6:.2f}M | {med_off * 1e3:.2f} | {med_on * 1e3:.2f} | "
          f"{summary['overhead_pct_median_of_blocks']:+.2f}% | "
          f"{summary['overhead_pct_pooled']:+.2f}% | {per_step_cpu * 1e6:.0f} us | "
          f"{summary['overhead_pct_accounted']:.3f}% | {render_s * 1e3:.2f} ms "
          f"({scraper.last_bytes} B) | <= 2% |")


if __name__ == "__main__":
    main()
