"""`scale`: how each of Asteria's costs grows with the model.

A ladder of GPT sizes, from the default up to GPT-2 small's shape (12 x 768, 12 heads), byte
vocabulary, sequences and batches kept small enough that a step stays within tens of seconds on
2 cores. At each size the arms train the same model on the same batches, taking interleaved
turns of one refresh interval (asteria_bench/turns.py), so the machine's drift falls on all of
them alike:
  AdamW;
  native SOAP: the references' defaults (max_precond_dim 10000, no block size, refresh every
      10 steps), refreshing inline at the step;
  Asteria-SOAP: the same optimizer, refresh on one host worker thread, d = S = 10;
  native and Asteria SOAP at the block size recommended for large models (BLOCK, 1024), in the
      device-host arrangement, where the size has a factor wider than it (below, the two
      configurations are one optimizer).
Each size runs in two arrangements (turns.ARRANGEMENTS): "shared", where training's two threads
and the host worker share both cores (this machine as it is), and "device-host", a stand-in for
a GPU and its host: every arm trains on core 0 with one thread, Asteria's worker refreshes on
core 1, native SOAP refreshes inline on core 0 as it does on a GPU.
Per size, arrangement and arm: step time (p50, mean, p99, over the steps after the warm-up
turns; the spike, a turn's slowest step over its median), the refresh work of one round (worker
seconds for every block: the mean refresh time times the blocks) against the training time of
one interval, the *refresh duty* (above 1 the worker cannot keep up: staleness is then pinned at
S and the step waits, as refresh_wait), the staleness reached against S, refresh_wait and
basis-swap time per step (the swap measured as the training thread's CPU inside
`apply_refresh`), optimizer-state bytes by kind (moments, factors, bases) and the peak RSS of
the size (VmHWM of the process that trained it: the arms of a size and arrangement take their
turns in a process of their own, AdamW with native and Asteria SOAP at the defaults, the two at
BLOCK in a second one, so one size's memory is gone before the next is built). Every figure is
then fitted against the parameter count on log-log axes: the fitted exponent k says how it grows
(k = 1: in proportion to the parameters).

Tokens per step: at one size, AdamW and Asteria-SOAP at growing batches; SOAP's projections cost
the same whatever the batch, so its overhead over AdamW falls as the tokens per step grow.
"""

from __future__ import annotations

import math
import multiprocessing
import shutil
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asteria_bench import turns
from asteria_bench.clocks import SwapClock, peak_rss_bytes, reset_peak_rss
from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult
from asteria_bench.suites.scale_hf import hf_row
from asteria_core.telemetry.state_bytes import state_bytes
from asteria_core.train.plan import predict_optimizer

TITLE = "Scale: how each cost grows with the model"
INTERVAL = turns.INTERVAL
BOUND = 10  # S = d: the default policy's staleness bound
REFERENCE_DEFAULTS = ["--optim.max_precond_dim", "10000", "--optim.precond_block_size", "10000"]
BLOCK = 1024
"""The block size recommended for large models: a factor's refresh costs ~b^3 and its memory
b^2, so splitting a 3072 (4 x 768) factor into three 1024 blocks cuts its refresh work 9x and its
factor memory 3x, while 1024 still covers GPT-2 small's residual width whole (768) and keeps each
block's refresh within an interval on one host core at the ladder's step times."""
WARMUP_TURNS = 1
"""Turns left out of the step-time figures: the first, where every block's first basis is an
eigendecomposition from scratch (no peer here compiles). Asteria swaps that round in over steps
7-11 (d = 10, swap window 5), its first swaps from the identity basis, which carry SOAP's second
moment over with a full transport matrix where every later swap permutes; from the second turn on
every turn refreshes and swaps as the next."""


@dataclass(frozen=True)
class Rung:
    """One size of the ladder."""

    n_layer: int
    n_embd: int
    n_head: int
    seq: int
    batch: int
    turns: int  # turns of INTERVAL steps each arm trains (the first WARMUP_TURNS warm up)

    @property
    def name(self) -> str:
        return f"{self.n_layer} x {self.n_embd}"

    @property
    def widest(self) -> int:
        """The widest factor of a block: the MLP's 4 x n_embd."""
        return 4 * self.n_embd

    def args(self) -> list[str]:
        return ["--model.n_layer", str(self.n_layer), "--model.n_embd", str(self.n_embd),
                "--model.n_head", str(self.n_head), "--model.block_size", str(self.seq),
                "--data.batch_size", str(self.batch),
                "--policy.refresh_interval", str(INTERVAL)]


FULL = (Rung(5, 128, 4, 128, 4, 4), Rung(4, 256, 4, 128, 4, 4), Rung(6, 384, 6, 128, 4, 3),
        Rung(8, 512, 8, 128, 4, 3), Rung(12, 768, 12, 128, 4, 3))
QUICK = (Rung(2, 64, 2, 32, 4, 3), Rung(3, 96, 3, 32, 4, 3))

# Tokens per step at one size: SOAP's projections cost the same whatever the batch, so its
# overhead over AdamW falls as the tokens per step grow.
TOKENS_RUNG = Rung(4, 256, 4, 128, 1, 3)
TOKENS_BATCHES = (1, 4, 16, 64, 256, 512)
"""Up to 65536 tokens a step: SOAP's extra work here is about 0.3 s a step whatever the batch,
AdamW's step about 0.1 ms a token, so the 10% crossing lies near 32768 tokens."""
QUICK_TOKENS_RUNG = Rung(2, 64, 2, 32, 1, 3)
QUICK_TOKENS_BATCHES = (1, 8)
OVERHEAD_TARGET = 0.10


@dataclass(frozen=True)
class Arm:
    key: str  # "adamw", "native", "asteria", "native_block", "asteria_block"
    config: turns.Config

    @property
    def asteria(self) -> bool:
        return self.key.startswith("asteria")


def arms(rung: Rung | None = None, arrangement: str = "device-host") -> list[Arm]:
    """AdamW, then native and Asteria SOAP at the references' defaults and, in the device-host
    arrangement where the rung has a factor wider than BLOCK (otherwise the two are the same
    optimizer), at BLOCK: the configuration recommended on a GPU host."""
    out = [
        Arm("adamw", turns.Config("AdamW", turns.ADAMW, "adamw")),
        Arm("native", turns.Config("native SOAP (refresh inline)",
                                   [*turns.SOAP, *turns.NATIVE, *REFERENCE_DEFAULTS], "soap")),
        Arm("asteria", turns.Config(f"Asteria-SOAP (1 worker, d = S = {BOUND})",
                                    [*turns.SOAP, *turns.asteria(BOUND), *REFERENCE_DEFAULTS],
                                    "soap")),
    ]
    if arrangement == "device-host" and (rung is None or rung.widest > BLOCK):
        recommended = ["--optim.max_precond_dim", "10000", "--optim.precond_block_size",
                       str(BLOCK)]
        out += [
            Arm("native_block", turns.Config(f"native SOAP, block {BLOCK}",
                                             [*turns.SOAP, *turns.NATIVE, *recommended],
                                             "soap")),
            Arm("asteria_block", turns.Config(f"Asteria-SOAP, block {BLOCK}",
                                              [*turns.SOAP, *turns.asteria(BOUND),
                                               *recommended], "soap")),
        ]
    return out


# ------------------------------------------------------------------------------------ measuring
def refresh_work(c: turns.Contender) -> tuple[float, int]:
    """(worker seconds, refreshes) the arm's engine has done so far; (0, 0) without one."""
    engine = c.trainer.runtime.refresh
    return (engine.work_seconds, engine.refreshes) if engine is not None else (0.0, 0)


def refresh_figures(c: turns.Contender, steps_ms: list[float],
                    warm: tuple[float, int]) -> dict[str, Any]:
    """One round's refresh work against one interval's training time: the refresh duty. The
    round is the mean refresh after the warm-up turns (`warm`: the work done by then; the first
    round, each block's eigendecomposition from scratch, costs more than the steady refresh)
    times the blocks."""
    engine = c.trainer.runtime.refresh
    if engine is None or not engine.refreshes:
        return {}
    work, refreshes = engine.work_seconds - warm[0], engine.refreshes - warm[1]
    if refreshes <= 0:  # none after the warm-up (a short run): the mean over all of them
        work, refreshes = engine.work_seconds, engine.refreshes
    blocks = len(engine.blocks)
    round_s = work / refreshes * blocks
    interval_s = INTERVAL * statistics.fmean(steps_ms) / 1e3
    return {"blocks": blocks, "refreshes": engine.refreshes, "work_s": engine.work_seconds,
            "steady_refreshes": refreshes, "round_work_s": round_s,
            "interval_train_s": interval_s, "refresh_duty": round_s / interval_s,
            "failures": engine.failures}


def spike_max(run: dict[str, Any]) -> float:
    """The worst turn's slowest step over that turn's median, over the steps after the warm-up."""
    steady = run["step_ms"][run["warmup_steps"]:]
    return max(max(t) / statistics.median(t)
               for t in (steady[i:i + INTERVAL] for i in range(0, len(steady), INTERVAL)))


def groups(chosen: list[Arm]) -> list[list[Arm]]:
    """The arms that take turns together: AdamW with native and Asteria SOAP at the references'
    defaults, and the two at BLOCK on their own (each pair is compared side by side in one
    group; at 12 x 768 five SOAP-sized arms at once would not fit this machine's memory)."""
    first = [a for a in chosen if not a.key.endswith("_block")]
    block = [a for a in chosen if a.key.endswith("_block")]
    return [first, block] if block else [first]


def in_child(fn, *args):
    """`fn(*args)` in a fresh process, which ends with it: the memory of one size's arms goes
    back to the machine before the next size is built (freed tensors stay in a process's heap,
    and at 12 x 768 five SOAP arms need most of this machine's memory). Spawned, not forked:
    a fork would inherit torch's thread pools."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def train_arms(rung: Rung, chosen: list[Arm], arrangement: str, opts: BenchOptions,
               out_dir: Path) -> tuple[list[dict], int | None]:
    """Every chosen arm's figures at one size in one arrangement (interleaved turns), and the
    peak RSS with all of them resident."""
    steps = rung.turns * INTERVAL
    reset_peak_rss()
    with turns.main_thread_cpus():
        contenders = [turns.build(turns.arranged(arm.config, arrangement), steps,
                                  out_dir / arm.key, rung.args()) for arm in chosen]
        clocks = [SwapClock(c.trainer.optimizer) for c in contenders]
        with progress(steps * len(contenders), f"scale {rung.name}, {arrangement}",
                      opts) as bar:
            warm = [(0.0, 0)] * len(contenders)
            for turn in range(rung.turns):
                if turn == WARMUP_TURNS:
                    warm = [refresh_work(c) for c in contenders]
                for c in contenders:
                    c.turn(INTERVAL)
                    bar.update(INTERVAL)
        peak = peak_rss_bytes()
        runs = []
        for arm, c, clock, done in zip(chosen, contenders, clocks, warm, strict=True):
            kinds = state_bytes(c.trainer.optimizer)
            run = turns.summary(c, WARMUP_TURNS)  # closes the trainer
            steady = run["step_ms"][run["warmup_steps"]:]
            if arm.asteria:
                run["plan"] = plan_check(c, statistics.fmean(steady) / 1e3)
            run.update(arm=arm.key, arrangement=arrangement, rung=asdict(rung), size=rung.name,
                       state_bytes=kinds, state_bytes_total=sum(kinds.values()),
                       spike_max=spike_max(run),
                       swap_ms_per_step=1e3 * clock.seconds / len(run["step_ms"]),
                       refresh_wait_ms_per_step=1e3 * run["idle_s"].get("refresh_wait", 0.0)
                       / len(run["step_ms"]),
                       staleness_bound=BOUND if arm.asteria else None,
                       **refresh_figures(c, steady, done))
            runs.append(run)
    return runs, peak


MEASURE_UP_TO = 4096
"""The plan measures every block side of the ladder (up to 3072) rather than extrapolating."""


def plan_check(c: turns.Contender, step_seconds: float) -> dict[str, Any]:
    """`asteria plan`'s prediction for the optimizer this arm trained, at its measured step time
    (the refresh cost of each block side measured on this host, or read from its cache)."""
    prediction = predict_optimizer(c.trainer.optimizer, c.trainer.runtime.policy.current,
                                   step_seconds=step_seconds, cap=MEASURE_UP_TO)
    return {"round_work_s": prediction.round_work_s, "duty": prediction.duty(1),
            "estimated": prediction.estimated}


def tokens_axis(opts: BenchOptions, out_dir: Path) -> list[dict[str, Any]]:
    """At one size, AdamW and Asteria-SOAP at growing batches (shared arrangement): SOAP's
    overhead over AdamW per tokens per step."""
    rung = opts.pick(QUICK_TOKENS_RUNG, TOKENS_RUNG)
    rows = []
    chosen = [a for a in arms(rung) if a.key in ("adamw", "asteria")]
    for batch in opts.pick(QUICK_TOKENS_BATCHES, TOKENS_BATCHES):
        sized = Rung(rung.n_layer, rung.n_embd, rung.n_head, rung.seq, batch, rung.turns)
        runs, _ = train_arms(sized, chosen, "shared", opts, out_dir / f"batch{batch}")
        adamw, ours = runs
        rows.append({"size": rung.name, "params": adamw["params"], "batch": batch,
                     "tokens_per_step": batch * rung.seq, "adamw_mean_ms": adamw["mean_ms"],
                     "asteria_mean_ms": ours["mean_ms"],
                     "overhead": ours["mean_ms"] / adamw["mean_ms"] - 1})
    return rows


# ------------------------------------------------------------------------------------ fitting
def fit_exponent(params: list[float], values: list[float]) -> dict[str, float] | None:
    """log y = log a + k log N by least squares over the positive points: k and a; None with
    fewer than two sizes."""
    points = [(n, y) for n, y in zip(params, values, strict=True)
              if y is not None and y > 0 and n > 0]
    if len({n for n, _ in points}) < 2:
        return None
    x = np.log([n for n, _ in points])
    y = np.log([v for _, v in points])
    k, log_a = np.polyfit(x, y, 1)
    return {"exponent": float(k), "prefactor": float(math.exp(log_a)), "points": len(points)}


def figures(by_size: list[dict[str, Any]]) -> list[tuple[str, str, list]]:
    """(key, label, value per size) of every figure fitted against the parameter count."""
    def of(arrangement: str, arm: str, key: str):
        return [size["runs"].get(arrangement, {}).get(arm, {}).get(key) for size in by_size]

    return [
        ("adamw_step_ms", "AdamW step, mean ms (shared)", of("shared", "adamw", "mean_ms")),
        ("native_step_ms", "native SOAP step, mean ms (shared)",
         of("shared", "native", "mean_ms")),
        ("asteria_step_ms", "Asteria-SOAP step, mean ms (shared)",
         of("shared", "asteria", "mean_ms")),
        ("native_step_ms_dh", "native SOAP step, mean ms (device-host)",
         of("device-host", "native", "mean_ms")),
        ("asteria_step_ms_dh", "Asteria-SOAP step, mean ms (device-host)",
         of("device-host", "asteria", "mean_ms")),
        ("round_work_s", "refresh work of a round, worker s",
         of("device-host", "asteria", "round_work_s")),
        ("refresh_duty", "refresh duty, device-host (round work / interval)",
         of("device-host", "asteria", "refresh_duty")),
        ("swap_ms", "Asteria swap ms per step (device-host)",
         of("device-host", "asteria", "swap_ms_per_step")),
        ("state_bytes", "SOAP state bytes", of("shared", "asteria", "state_bytes_total")),
        ("peak_rss", "peak RSS bytes (shared: all arms resident)",
         [size["peak_rss_bytes"].get("shared") for size in by_size]),
    ]


# ------------------------------------------------------------------------------------ the suite
def run(opts: BenchOptions) -> SuiteResult:
    ladder = opts.pick(QUICK, FULL)
    result = SuiteResult("scale", TITLE, opts.quick, opts.command,
                         config={"ladder": [asdict(r) for r in ladder], "interval": INTERVAL,
                                 "staleness_bound": BOUND, "block": BLOCK,
                                 "arms": [{"key": a.key, **asdict(a.config)} for a in arms()],
                                 "arrangements": turns.ARRANGEMENTS,
                                 "warmup_turns": WARMUP_TURNS,
                                 "vocab": "bytes (256)"})
    root = opts.out_dir / ".scale-runs"
    for rung in ladder:
        for arrangement in turns.ARRANGEMENTS:
            runs, peaks = [], []
            for group in groups(arms(rung, arrangement)):
                got, top = in_child(train_arms, rung, group, arrangement, opts,
                                    root / rung.name.replace(" ", "") / arrangement)
                runs += got
                peaks += [top] if top else []
            peak = max(peaks, default=None)
            result.runs += [{**r, "peak_rss_bytes": peak} for r in runs]
            result.save(opts.out_dir)
    result.config["tokens_axis"] = tokens_axis(opts, root / "tokens")
    result.save(opts.out_dir)
    result.config["hf_row"] = hf_row(opts)
    result.save(opts.out_dir)

    shutil.rmtree(root, ignore_errors=True)
    by_size = sizes_of(result.runs)
    result.config["fits"] = fits(by_size)
    result.plots.append(plot(by_size, result.config["fits"], opts.out_dir / "scale.png"))
    if result.config["tokens_axis"]:
        result.plots.append(plot_tokens(result.config["tokens_axis"],
                                        opts.out_dir / "scale-tokens.png"))
    result.save(opts.out_dir)
    return result


def sizes_of(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runs by size, ladder order: each size's params, its runs by arrangement and arm, and
    its peak RSS per arrangement (every arm of one arrangement resident)."""
    by_size: dict[str, dict[str, Any]] = {}
    for r in runs:
        size = by_size.setdefault(r["size"], {"size": r["size"], "params": r["params"],
                                              "runs": {}, "peak_rss_bytes": {}})
        size["runs"].setdefault(r["arrangement"], {})[r["arm"]] = r
        size["peak_rss_bytes"][r["arrangement"]] = r["peak_rss_bytes"]
    return list(by_size.values())


def fits(by_size: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each figure's fitted exponent against the parameter count, where it has two sizes."""
    params = [s["params"] for s in by_size]
    found = {key: fit_exponent(params, values) for key, _, values in figures(by_size)}
    return {key: fit for key, fit in found.items() if fit is not None}


def plan_error(run: dict[str, Any]) -> float:
    """The plan's relative error on one round's refresh work: predicted / measured - 1."""
    return run["plan"]["round_work_s"] / run["round_work_s"] - 1


def plot(by_size: list[dict[str, Any]], fitted: dict, path: Path) -> dict[str, str]:
    """Each figure against the parameter count, log-log, with its fitted line and exponent."""
    plt = pyplot()
    params = [s["params"] for s in by_size]
    panels = [("step time, mean ms", ("adamw_step_ms", "native_step_ms", "asteria_step_ms",
                                      "native_step_ms_dh", "asteria_step_ms_dh")),
              ("refresh", ("round_work_s", "refresh_duty", "swap_ms")),
              ("memory, bytes", ("state_bytes", "peak_rss"))]
    values = {key: (label, vals) for key, label, vals in figures(by_size)}
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.2))
    for ax, (title, keys) in zip(axes, panels, strict=True):
        for key in keys:
            label, vals = values[key]
            points = [(n, v) for n, v in zip(params, vals, strict=True) if v and v > 0]
            if not points:
                continue
            fit = fitted.get(key)
            line = ax.plot(*zip(*points, strict=True), marker="o",
                           label=label + (f" (k = {fit['exponent']:.2f})" if fit else ""))[0]
            if fit:
                xs = np.array([min(params), max(params)], dtype=float)
                ax.plot(xs, fit["prefactor"] * xs ** fit["exponent"], linestyle="--",
                        color=line.get_color(), linewidth=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters N")
        ax.set_title(title)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path, "each cost against the parameter count, log-log, with its fitted "
                           "exponent k (dashed: the fit)")


def plot_tokens(rows: list[dict[str, Any]], path: Path) -> dict[str, str]:
    """SOAP's overhead over AdamW against the tokens per step, with the 10% line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["tokens_per_step"] for r in rows], [100 * r["overhead"] for r in rows],
            marker="o", label="Asteria-SOAP over AdamW, mean step")
    ax.axhline(100 * OVERHEAD_TARGET, color="grey", linestyle="--", linewidth=0.8,
               label=f"{100 * OVERHEAD_TARGET:.0f}%")
    ax.set_xscale("log")
    ax.set_xlabel("tokens per step")
    ax.set_ylabel("overhead, %")
    ax.set_title(f"{rows[0]['size']} ({rows[0]['params'] / 1e6:.1f}M parameters)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path, "SOAP's overhead over AdamW falls as the tokens per step grow")
