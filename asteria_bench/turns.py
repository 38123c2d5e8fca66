"""Configurations that take turns on one machine, so its drift falls on all of them alike.

Every configuration is built up front (same seed: same initial model and the same batches) and
they train in turns of one refresh interval each. A turn opens at a refresh point (steps 11, 21,
...), so a native refresh spike and a whole burst round fall inside one turn. The jobs that
pacing releases at a turn's last boundary are held and released when the configuration's next
turn starts, right before the step they would have run beside; a job released earlier and still
running is waited for, and the wait is charged to the configuration's next step. So no
configuration's background work lands in another's turn (asteria_bench/pausable.py).

Step-time figures leave out the first WARMUP_TURNS turns (first-time costs: every block's first
eigendecomposition, a peer's torch.compile); the time to a target loss counts those steps at the
configuration's median step, so a one-off compilation does not decide it. A peer that fails (a
compiler error, say) is dropped from the run with its error, and the others go on.

"Spike" is the median over turns of (slowest step / median step) within the turn: a refresh spike
shows in every turn, while the machine's slower drift, which p99/p50 over a whole run also picks
up (AdamW, with no refresh at all, is its floor), does not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from asteria_bench.options import BenchOptions, progress
from asteria_bench.pausable import make_pausable
from asteria_bench.results import percentile
from asteria_core.cli import resolve_config
from asteria_core.optim.seam import refresh_fn as default_refresh_fn
from asteria_core.runtime.config import RefreshFn
from asteria_core.telemetry.records import StepRecord
from asteria_core.train.config import parse_cpu_list
from asteria_core.train.trainer import Trainer

INTERVAL = 10  # steps between refreshes, and the length of one turn
# Turns left out of the step-time figures: the first-time costs (every block's first
# eigendecomposition, a peer's torch.compile at its first step and first refresh).
WARMUP_TURNS = 2

# The model of the critical-path and staleness suites: a 3.3M-parameter GPT whose SOAP refresh
# (every 10 steps) is a large share of a native step on a CPU.
CPU_MODEL = ["--model.n_embd", "256", "--model.n_head", "4", "--model.n_layer", "4",
             "--data.batch_size", "16", "--policy.refresh_interval", str(INTERVAL)]
# On one CUDA device: ~100M parameters (85M in the blocks), bf16 autocast (gpu_check.sh).
GPU_MODEL = ["--model.n_embd", "768", "--model.n_head", "12", "--model.n_layer", "12",
             "--model.block_size", "512", "--data.batch_size", "32",
             "--policy.refresh_interval", str(INTERVAL), "--train.device", "cuda",
             "--optim.precond_block_size", "1024"]  # bf16 autocast: the CUDA default

ADAMW = ["--optim.name", "adamw", "--optim.lr", "3e-3"]
SOAP = ["--optim.name", "soap", "--optim.lr", "3e-3"]
KL = ["--optim.name", "kl_shampoo", "--optim.lr", "1e-3"]
SHAMPOO = ["--optim.name", "shampoo", "--optim.lr", "3e-3"]
NATIVE = ["--policy.workers", "0", "--policy.swap_delay", "0"]  # refresh inline at the step


def asteria(bound: int, *, train_threads: int = 2, kind: str = "thread",
            pace: bool = True, workers: int = 1, worker_threads: int = 1) -> list[str]:
    """Asteria's refresh off the critical path with d = S = `bound`: a round's results are
    swapped over the last ceil(d / 2) steps up to `bound` steps after its statistics (the
    default swap window), which lets pacing spread the round over min(d - V + 1, S, interval)
    steps before them."""
    return ["--policy.workers", str(workers), "--policy.worker_threads", str(worker_threads),
            "--policy.staleness_bound", str(bound), "--policy.swap_delay", str(bound),
            "--train.threads", str(train_threads), "--policy.worker_kind", kind,
            "--policy.pace", str(pace).lower()]


# Where training and the refresh workers run. Every figure says which arrangement it comes from.
DEVICE_CPU = 0  # the "device" of the device-and-host arrangement: every arm trains here
HOST_CPU = 1  # its "host": Asteria's refresh workers
ARRANGEMENTS = {
    "shared": "shared cores: training with 2 threads, the refresh workers wherever the OS puts "
              "them (this machine's 2 cores, shared)",
    "device-host": f"device and host: every arm trains on core {DEVICE_CPU} with one thread (the "
                   f"device), Asteria's refresh workers run on core {HOST_CPU} (the host), "
                   f"native SOAP refreshes inline on core {DEVICE_CPU}, as on a GPU",
}


def arrangement_args(arrangement: str) -> list[str]:
    """The config overrides that put one arm (any: AdamW, native, Asteria) in `arrangement`;
    they go after the arm's own arguments, so they win. A worker setting is harmless where the
    arm has no workers (AdamW, native SOAP)."""
    if arrangement not in ARRANGEMENTS:
        raise ValueError(f"arrangement: got {arrangement!r}; allowed: "
                         f"{' | '.join(ARRANGEMENTS)}")
    if arrangement == "shared":
        return []
    # The machine's CPUs, not the calling thread's: building an arm pins that thread.
    if max(DEVICE_CPU, HOST_CPU) >= (os.cpu_count() or 1):
        raise ValueError(f"arrangement: got 'device-host', which needs CPUs {DEVICE_CPU} and "
                         f"{HOST_CPU}; this machine has {os.cpu_count()}; allowed: shared")
    return ["--train.cpus", str(DEVICE_CPU), "--train.threads", "1",
            "--train.worker_cpus", str(HOST_CPU)]


def arranged(config: Config, arrangement: str) -> Config:
    """`config` in `arrangement` (same label and family; ARRANGEMENTS says what each means)."""
    return dataclasses.replace(config, args=[*config.args, *arrangement_args(arrangement)])


@contextlib.contextmanager
def main_thread_cpus() -> Iterator[None]:
    """Give the calling thread its CPUs back afterwards. Building a trainer with train.cpus
    pins the thread that builds it (all arms are built in one process, on the main thread), and
    whatever runs next (another arm, another suite, the shared arrangement) must not stay
    pinned: `build`, `Contender.turn` and `summary` pin it only while they run."""
    before = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        yield
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)


OptimizerFactory = Callable[[torch.nn.Module], torch.optim.Optimizer]


@dataclass
class Config:
    """One configuration: a label, its config overrides, and (for a peer) its optimizer."""

    label: str
    args: list[str]
    family: str  # "adamw", "soap", "kl_shampoo", "shampoo": what it is compared with
    peer: str | None = None  # the peer's name (asteria_bench/peers.py), None for ours


@dataclass
class Contender:
    """One configuration's run, trained a turn at a time."""

    config: Config
    trainer: Trainer
    threads: int
    cpus: frozenset[int] | None = None
    """train.cpus: where its training thread runs (set again at each turn, so arms pinned
    differently can take turns on one thread); None: wherever the thread is allowed."""
    records: list[StepRecord] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    """The training thread's own CPU time per step (time.thread_time): in the device-host
    arrangement, the device's busy time. Wall time minus it is time the training core went to
    something else (on a busy machine, other processes; see ARRANGEMENTS)."""
    charge: float = 0.0
    """Seconds waited at the end of the last turn for refreshes already handed to the workers;
    added to the next step, where they would have run."""

    def enter(self) -> None:
        """Put the calling (training) thread in this configuration's CPUs and threads."""
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)
        torch.set_num_threads(self.threads)

    def turn(self, steps: int) -> None:
        """`steps` steps on this configuration's CPUs; the calling thread's own CPUs after."""
        with main_thread_cpus():
            self.enter()
            self._steps(steps)

    def _steps(self, steps: int) -> None:
        engine = self.trainer.runtime.refresh
        if engine is not None:
            engine.defer_releases(False)  # what the last turn's last boundary released goes now
        for i in range(steps):
            if engine is not None and i == steps - 1:
                engine.defer_releases(True)  # this turn's last boundary releases at the next
            cpu = time.thread_time()
            self.trainer.train_step()
            record = self.trainer.runtime.end_step()  # telemetry adds the idle (wait) figures
            self.cpu_seconds.append(time.thread_time() - cpu)
            record.step_seconds += self.charge
            self.charge = 0.0
            self.records.append(record)
        if engine is not None:
            self.charge = engine.wait_released()


def peer_factory(name: str, args: list[str], model_args: list[str]) -> OptimizerFactory:
    """The peer's optimizer with our config's hyperparameters, on our decay groups."""
    from asteria_bench import peers

    return peers.factory_from_config(name, resolve_config(None, [*model_args, *args]))


def build(config: Config, steps: int, out_dir: Path, model_args: list[str],
          refresh_fn: RefreshFn = default_refresh_fn) -> Contender:
    run = resolve_config(None, [*model_args, "--train.steps", str(steps), "--train.out_dir",
                                str(out_dir), "--telemetry.model_cpu_watts", "15",
                                *config.args])
    threads = run.train.threads or 2
    torch.set_num_threads(threads)
    factory = peer_factory(config.peer, config.args, model_args) if config.peer else None
    with main_thread_cpus():  # train.cpus pins the building thread: for the build only
        trainer = Trainer(run, jsonl=False, optimizer_factory=factory, refresh_fn=refresh_fn)
        make_pausable(trainer.runtime)
    cpus = parse_cpu_list("train.cpus", run.train.cpus) if run.train.cpus else None
    return Contender(config, trainer, threads, cpus)


def summary(c: Contender, warmup_turns: int = WARMUP_TURNS) -> dict[str, Any]:
    """Step-time figures over the steps after the warm-up turns (first-time costs), the run's
    idle by cause, the final validation loss, and every raw step time and training loss."""
    changes = [{"version": ch.version, "effective_step": ch.effective_step,
                "diff": {k: list(v) for k, v in ch.diff.items()}, "client": ch.client,
                "reason": ch.reason} for ch in c.trainer.runtime.policy.history()]
    with main_thread_cpus():
        c.enter()
        val_loss = c.trainer.evaluate()
        c.trainer.close()
    records = c.records
    warmup = min(warmup_turns * INTERVAL, len(records) - INTERVAL)
    steady = [r.step_seconds for r in records[max(warmup, 0):]]
    ranked = sorted(steady)
    turns = [steady[i:i + INTERVAL] for i in range(0, len(steady), INTERVAL)]
    cpu = c.cpu_seconds[max(warmup, 0):]
    cpu_turns = [cpu[i:i + INTERVAL] for i in range(0, len(cpu), INTERVAL)]
    idle: dict[str, float] = {}
    for r in records:
        for cause, seconds in (r.timing.idle_seconds if r.timing else {}).items():
            idle[cause] = idle.get(cause, 0.0) + seconds
    return {
        "label": c.config.label, "family": c.config.family, "peer": c.config.peer,
        "args": c.config.args, "params": c.trainer.model_params, "threads": c.threads,
        "train_s": sum(r.step_seconds for r in records),
        "p50_ms": 1e3 * percentile(ranked, 0.5), "p90_ms": 1e3 * percentile(ranked, 0.9),
        "p99_ms": 1e3 * percentile(ranked, 0.99), "max_ms": 1e3 * ranked[-1],
        "mean_ms": 1e3 * statistics.fmean(steady),
        "spike": statistics.median(max(t) / statistics.median(t) for t in turns),
        "cpu_mean_ms": 1e3 * statistics.fmean(cpu),
        "cpu_p50_ms": 1e3 * statistics.median(cpu),
        "cpu_spike": statistics.median(max(t) / statistics.median(t) for t in cpu_turns),
        "step_cpu_ms": [1e3 * x for x in c.cpu_seconds],
        "idle_s": idle,
        "staleness_max": max((r.refresh.staleness_max for r in records if r.refresh), default=0),
        "final_val_loss": val_loss,
        "step_ms": [1e3 * r.step_seconds for r in records],
        "loss": [r.loss for r in records],
        "warmup_steps": max(warmup, 0),
        "policy_changes": changes,
    }


def round_robin(configs: list[Config], steps: int, out_dir: Path, opts: BenchOptions,
                model_args: list[str], failures: list[str] | None = None, *,
                prepare: Callable[[Contender], None] | None = None,
                on_turn: Callable[[int], None] | None = None,
                refresh_fn: RefreshFn = default_refresh_fn) -> list[dict[str, Any]]:
    """Every configuration's summary; a peer that raises is dropped and its error appended to
    `failures` (ours raise). `prepare(contender)` runs once each is built (the autopilot suite
    turns one's autopilot on), `on_turn(k)` before turn k of every configuration (a
    disturbance that arrives mid-run); `refresh_fn`, every configuration's refresh math (an
    emulated slower host, asteria_bench/slower_host.py). The calling thread's CPUs are as
    before afterwards."""
    with main_thread_cpus():
        return _round_robin(configs, steps, out_dir, opts, model_args, failures, prepare,
                            on_turn, refresh_fn)


def _round_robin(configs: list[Config], steps: int, out_dir: Path, opts: BenchOptions,
                 model_args: list[str], failures: list[str] | None,
                 prepare: Callable[[Contender], None] | None = None,
                 on_turn: Callable[[int], None] | None = None,
                 refresh_fn: RefreshFn = default_refresh_fn) -> list[dict[str, Any]]:
    contenders = [build(cfg, steps, out_dir / f"config{i}", model_args, refresh_fn)
                  for i, cfg in enumerate(configs)]
    for c in contenders if prepare is not None else ():
        prepare(c)
    turns = -(-steps // INTERVAL)
    bars = {id(c): progress(steps, c.config.label[:40], opts) for c in contenders}
    try:
        for k in range(turns):
            if on_turn is not None:
                on_turn(k)
            for c in list(contenders):
                n = min(INTERVAL, steps - k * INTERVAL)
                try:
                    c.turn(n)
                except Exception as err:  # a peer's compiler or kernel: not ours to fix here
                    if c.config.peer is None or failures is None:
                        raise
                    first = (str(err).strip().splitlines() or [""])[0]
                    failures.append(f"{c.config.label} failed at step {len(c.records) + 1} "
                                    f"and was left out: {type(err).__name__}: {first}")
                    contenders.remove(c)
                    c.trainer.close()
                    continue
                bars[id(c)].update(n)
    finally:
        for bar in bars.values():
            bar.close()
    return [summary(c) for c in contenders]


def time_to_loss(run: dict[str, Any], target: float) -> tuple[int | None, float | None]:
    """(steps, seconds of training) until the mean training loss of a turn first reaches
    `target`; the configurations see the same batches, so their turn means compare. Warm-up
    steps count at the run's median step (run["p50_ms"]). None where it never does."""
    warmup = run.get("warmup_steps", 0)
    step_ms = [run["p50_ms"]] * warmup + run["step_ms"][warmup:]
    seconds = 0.0
    for start in range(0, len(run["loss"]), INTERVAL):
        window = [x for x in run["loss"][start:start + INTERVAL] if x is not None]
        seconds += sum(step_ms[start:start + INTERVAL]) / 1e3
        if window and statistics.fmean(window) <= target:
            return start + len(window), seconds
    return None, None


def final_turn_loss(run: dict[str, Any]) -> float:
    """The mean training loss of the last turn."""
    last = [x for x in run["loss"][-INTERVAL:] if x is not None]
    return statistics.fmean(last)
