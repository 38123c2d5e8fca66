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
    by_size: list[dict[str, Any]] = []
    root = opts.out_dir / ".scale-runs"
    for rung in ladder:
        size: dict[str, Any] = {"size": rung.name, "runs": {}, "peak_rss_bytes": {}}
        for arrangement in turns.ARRANGEMENTS:
            runs, peaks = [], []
            for group in groups(arms(rung, arrangement)):
                got, top = in_child(train_arms, rung, group, arrangement, opts,
                                    root / rung.name.replace(" ", "") / arrangement)
                runs += got
                peaks += [top] if top else []
            peak = max(peaks, default=None)
            size["params"] = runs[0]["params"]
            size["runs"][arrangement] = {r["arm"]: r for r in runs}
            size["peak_rss_bytes"][arrangement] = peak
            result.runs += [{**r, "peak_rss_bytes": peak} for r in runs]
            result.save(opts.out_dir)
        by_size.append(size)
    result.config["tokens_axis"] = tokens_axis(opts, root / "tokens")
    result.save(opts.out_dir)
    result.config["hf_row"] = hf_row(opts)
    result.save(opts.out_dir)

    shutil.rmtree(root, ignore_errors=True)
    summarize(result, by_size, opts)
    result.save(opts.out_dir)
    return result


def summarize(result: SuiteResult, by_size: list[dict[str, Any]], opts: BenchOptions) -> None:
    params = [s["params"] for s in by_size]
    steps = result.table("Step time per size (ms; interleaved turns, after the warm-up turns)",
                         ["size", "params", "arrangement", "arm", "p50", "mean", "p99", "spike",
                          "worst spike", "CPU mean", "CPU spike"],
                         note="spike: the median over turns of a turn's slowest step over its "
                              "median; worst spike: the same for the worst turn. CPU: the "
                              "training thread's own CPU time per step (in device-host, the "
                              "device's busy time; wall minus CPU is time its core went to "
                              "other work).")
    verdict = result.table(
        "Asteria-SOAP against native SOAP, per size and arrangement",
        ["size", "params", "arrangement", "SOAP", "Asteria / native mean",
         "Asteria / native CPU mean", "worst spike", "CPU spike"],
        note="device-host: training pinned to core 0 with one thread for every arm, Asteria's "
             "worker pinned to core 1, native SOAP refreshing inline on core 0; shared: two "
             "training threads and the worker share both cores.")
    refresh = result.table(
        f"Refresh per size (Asteria-SOAP, 1 worker thread, S = {BOUND})",
        ["size", "params", "arrangement", "SOAP", "blocks", "round work s", "interval s", "duty",
         "staleness max / S", "refresh_wait ms/step", "swap ms/step"],
        note="duty = one round's refresh work (worker seconds, every block) over the training "
             "time of one interval; above 1 the worker cannot keep up.")
    memory = result.table("Memory per size", ["size", "params", "arm", "moments MB",
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
    tokens = result.table("SOAP's overhead over AdamW against tokens per step (shared, one size)",
                          ["size", "params", "batch", "tokens/step", "AdamW mean ms",
                           "Asteria-SOAP mean ms", "overhead"])
    for row in result.config["tokens_axis"]:
        tokens.add(row["size"], row["params"], row["batch"], row["tokens_per_step"],
                   round(row["adamw_mean_ms"], 1), round(row["asteria_mean_ms"], 1),
                   f"{100 * row['overhead']:.0f}%")
    planned = result.table(
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
    hf = result.config.get("hf_row")
    if hf:
        result.table(f"A Hugging Face architecture: {hf['model']} through "
                     "asteria_core.integrations.hf (HF Trainer)",
                     ["params", "tokens/step", "steps", "p50 ms", "mean ms", "p99 ms", "blocks",
                      "duty", "staleness max / S", "state MB", "peak RSS MB", "records",
                      "metrics exported"]).add(
            hf["params"], hf["tokens_per_step"], hf["steps"], round(hf["p50_ms"], 1),
            round(hf["mean_ms"], 1), round(hf["p99_ms"], 1), hf["blocks"],
            round(hf["refresh_duty"] or 0.0, 3), f"{hf['staleness_max']} / {hf['staleness_bound']}",
            round(hf["state_bytes_total"] / 2**20, 1), round((hf["peak_rss_bytes"] or 0) / 2**20),
            hf["records"], hf["metrics_exported"])
    fits = result.table("How each figure grows: y = a N^k fitted on log-log axes (N: parameters)",
                        ["figure", "k", "a", "sizes"])
    fitted = {}
    for key, label, values in figures(by_size):
        fit = fit_exponent(params, values)
        if fit is None:
            continue
        fitted[key] = fit
        fits.add(label, round(fit["exponent"], 3), f"{fit['prefactor']:.3g}", fit["points"])
    result.config["fits"] = fitted
    result.plots.append(plot(by_size, fitted, opts.out_dir / "scale.png"))
    if result.config["tokens_axis"]:
        result.plots.append(plot_tokens(result.config["tokens_axis"],
                                        opts.out_dir / "scale-tokens.png"))
    _conclude(result, by_size, fitted)


def plan_error(run: dict[str, Any]) -> float:
    """The plan's relative error on one round's refresh work: predicted / measured - 1."""
    return run["plan"]["round_work_s"] / run["round_work_s"] - 1


def _conclude(result: SuiteResult, by_size: list[dict[str, Any]], fitted: dict) -> None:
    largest = by_size[-1]
    for arrangement, runs in largest["runs"].items():
        ratio = runs["asteria"]["mean_ms"] / runs["native"]["mean_ms"]
        text = (f"at {largest['size']} ({largest['params'] / 1e6:.1f}M parameters), "
                f"{arrangement}, Asteria-SOAP's mean step is {{value:.2f}}x native SOAP's")
        if arrangement == "device-host":  # the headline: the arrangement a GPU host stands for
            result.quote("asteria_over_native_largest", ratio, text)
        else:
            result.findings.append(text.format(value=ratio) + ".")
    if "asteria_step_ms" in fitted:
        result.quote("asteria_step_exponent", fitted["asteria_step_ms"]["exponent"],
                     "Asteria-SOAP's step time grows as N^{value:.2f} with the parameters N")
    for size in by_size:
        for arrangement, runs in size["runs"].items():
            for key in ("asteria", "asteria_block"):
                a = runs.get(key)
                if not a or a.get("refresh_duty") is None:
                    continue
                behind = a["refresh_duty"] > 1
                result.findings.append(
                    f"{size['size']} ({size['params'] / 1e6:.2f}M parameters), {arrangement}, "
                    f"{a['label']}: a round of refreshes takes {a['round_work_s']:.2f} worker-s "
                    f"against {a['interval_train_s']:.2f} s of training per interval (duty "
                    f"{a['refresh_duty']:.2f}); staleness reached {a['staleness_max']} of "
                    f"S = {BOUND} and the step waited {a['refresh_wait_ms_per_step']:.1f} ms per "
                    "step as refresh_wait"
                    + (" (the worker cannot keep up: the bound holds and the wait is counted)."
                       if behind else "."))
    tokens = result.config.get("tokens_axis") or []
    under = [row for row in tokens if row["overhead"] < OVERHEAD_TARGET]
    if tokens:
        result.findings.append(
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
        result.quote("plan_worst_error", abs(plan_error(worst)),
                     "`asteria plan` predicts a round's refresh work within {value:.0%} of the "
                     "measured one at every size and arrangement of the ladder")
        result.findings.append(
            f"asteria plan: {within} of {len(checked)} predictions of a round's refresh work "
            f"within 25% of the measured one; the worst, {100 * plan_error(worst):+.0f}%, at "
            f"{worst['size']} ({worst['arrangement']}, {worst['label']}).")
    hf = result.config.get("hf_row")
    if hf:
        result.findings.append(
            f"{hf['model']} at {hf['params'] / 1e6:.0f}M parameters trained {hf['steps']} steps "
            f"through HF's Trainer with Asteria-SOAP: mean step {hf['mean_ms'] / 1e3:.2f} s, "
            f"{hf['records']} step records, staleness {hf['staleness_max']} of S = "
            f"{hf['staleness_bound']}, refresh duty {hf['refresh_duty'] or 0:.2f}, "
            f"/metrics {'scraped while it trained' if hf['metrics_exported'] else 'NOT seen'}.")
    for key, fit in fitted.items():
        result.findings.append(f"{key}: fitted exponent {fit['exponent']:.2f} over "
                               f"{fit['points']} sizes.")
    ours = largest["runs"]["shared"]["asteria"]
    result.findings.append(
        f"Peak RSS of the largest size with all its arms resident (shared): "
        f"{(largest['peak_rss_bytes']['shared'] or 0) / 2**30:.2f} GiB; its SOAP state: "
        f"{ours['state_bytes_total'] / 2**30:.3f} GiB.")


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
