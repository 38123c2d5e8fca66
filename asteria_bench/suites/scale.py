"""`scale`: how each of Asteria's costs grows with the model (issue 24, item 1).

A ladder of GPT sizes, from the default up to GPT-2 small's shape (12 x 768, 12 heads) and
24 x 1024 in full mode, byte vocabulary, sequences and batches kept small enough that a step
stays within tens of seconds on 2 cores. At each size three arms train the same model on the
same batches, taking interleaved turns of one refresh interval (asteria_bench/turns.py), so the
machine's drift falls on all of them alike:
  AdamW;
  native SOAP: the references' defaults (max_precond_dim 10000, no block size, refresh every
      10 steps), refreshing inline at the step;
  Asteria-SOAP: the same optimizer, refresh on one host worker thread, d = S = 10.
Per size and arm: step time (p50, mean, p99, over the steps after the warm-up turns), the refresh
work of one round (worker seconds for every block: the mean refresh time times the blocks)
against the training time of one interval, the *refresh duty* (above 1 the worker cannot keep
up: staleness is then pinned at S and the step waits, as refresh_wait), the staleness reached
against S, refresh_wait and basis-swap time per step (the swap measured as the training
thread's CPU inside `apply_refresh`), optimizer-state bytes by kind (moments, factors, bases)
and the peak RSS of the size (VmHWM, reset before it through /proc/self/clear_refs; all three
arms are resident together). Every figure is then fitted against the parameter count on log-log
axes: the fitted exponent k says how it grows (k = 1: in proportion to the parameters).

Not measured yet (the rest of issue 24, item 1): SOAP at a recommended block size beside the
references' defaults, tokens per step at one size, and the device-and-host arrangement
(training pinned to core 0, workers to core 1).
"""

from __future__ import annotations

import math
import shutil
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from asteria_bench import turns
from asteria_bench.clocks import SwapClock, peak_rss_bytes, reset_peak_rss
from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult
from asteria_core.tiers.lifecycle import leaves

TITLE = "Scale: how each cost grows with the model"
INTERVAL = turns.INTERVAL
BOUND = 10  # S = d: the default policy's staleness bound
REFERENCE_DEFAULTS = ["--optim.max_precond_dim", "10000", "--optim.precond_block_size", "10000"]
MOMENTS = ("exp_avg", "exp_avg_sq", "exp_avg_eigen")


@dataclass(frozen=True)
class Rung:
    """One size of the ladder."""

    n_layer: int
    n_embd: int
    n_head: int
    seq: int
    batch: int
    turns: int  # turns of INTERVAL steps each arm trains (the first turns.WARMUP_TURNS warm up)

    @property
    def name(self) -> str:
        return f"{self.n_layer} x {self.n_embd}"

    def args(self) -> list[str]:
        return ["--model.n_layer", str(self.n_layer), "--model.n_embd", str(self.n_embd),
                "--model.n_head", str(self.n_head), "--model.block_size", str(self.seq),
                "--data.batch_size", str(self.batch),
                "--policy.refresh_interval", str(INTERVAL)]


FULL = (Rung(5, 128, 4, 128, 4, 5), Rung(6, 384, 6, 128, 4, 4), Rung(8, 512, 8, 128, 4, 4),
        Rung(12, 768, 12, 128, 4, 4), Rung(24, 1024, 16, 128, 2, 3))
QUICK = (Rung(2, 64, 2, 32, 4, 3), Rung(3, 96, 3, 32, 4, 3))


def arms() -> list[turns.Config]:
    return [
        turns.Config("AdamW", turns.ADAMW, "adamw"),
        turns.Config("native SOAP (refresh inline)",
                     [*turns.SOAP, *turns.NATIVE, *REFERENCE_DEFAULTS], "soap"),
        turns.Config(f"Asteria-SOAP (1 worker, d = S = {BOUND})",
                     [*turns.SOAP, *turns.asteria(BOUND), *REFERENCE_DEFAULTS], "soap"),
    ]


# ------------------------------------------------------------------------------------ measuring
def state_bytes(optimizer) -> dict[str, int]:
    """Optimizer-state bytes by kind: moments, factors, bases, other."""
    kinds = {"moments": 0, "factors": 0, "bases": 0, "other": 0}
    for state in optimizer.state.values():
        for path, t in leaves(state):
            kind = "moments" if path[0] in MOMENTS else path[0] if path[0] in kinds else "other"
            kinds[kind] += t.numel() * t.element_size()
    return kinds


def refresh_figures(c: turns.Contender, steps_ms: list[float]) -> dict[str, Any]:
    """One round's refresh work against one interval's training time: the refresh duty."""
    engine = c.trainer.runtime.refresh
    if engine is None or not engine.refreshes:
        return {}
    blocks = len(engine.blocks)
    round_s = engine.work_seconds / engine.refreshes * blocks
    interval_s = INTERVAL * statistics.fmean(steps_ms) / 1e3
    return {"blocks": blocks, "refreshes": engine.refreshes, "work_s": engine.work_seconds,
            "round_work_s": round_s, "interval_train_s": interval_s,
            "refresh_duty": round_s / interval_s, "failures": engine.failures}


def train_rung(rung: Rung, opts: BenchOptions, out_dir: Path) -> tuple[list[dict], int | None]:
    """Every arm's figures at one size, and the size's peak RSS."""
    steps = rung.turns * INTERVAL
    reset_peak_rss()
    contenders = [turns.build(cfg, steps, out_dir / f"arm{i}", rung.args())
                  for i, cfg in enumerate(arms())]
    clocks = [SwapClock(c.trainer.optimizer) for c in contenders]
    with progress(steps * len(contenders), f"scale {rung.name}", opts) as bar:
        for _ in range(rung.turns):
            for c in contenders:
                c.turn(INTERVAL)
                bar.update(INTERVAL)
    peak = peak_rss_bytes()
    runs = []
    for c, clock in zip(contenders, clocks, strict=True):
        kinds = state_bytes(c.trainer.optimizer)
        run = turns.summary(c)  # closes the trainer
        steady = run["step_ms"][run["warmup_steps"]:]
        run.update(rung=asdict(rung), size=rung.name, state_bytes=kinds,
                   state_bytes_total=sum(kinds.values()),
                   swap_ms_per_step=1e3 * clock.seconds / len(run["step_ms"]),
                   refresh_wait_ms_per_step=1e3 * run["idle_s"].get("refresh_wait", 0.0)
                   / len(run["step_ms"]),
                   staleness_bound=BOUND if c.trainer.runtime.refresh is not None else None,
                   **refresh_figures(c, steady))
        runs.append(run)
    return runs, peak


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
    def of(arm: int, key: str):
        return [size["runs"][arm].get(key) for size in by_size]

    return [
        ("adamw_step_ms", "AdamW step, mean ms", of(0, "mean_ms")),
        ("native_step_ms", "native SOAP step, mean ms", of(1, "mean_ms")),
        ("asteria_step_ms", "Asteria-SOAP step, mean ms", of(2, "mean_ms")),
        ("round_work_s", "refresh work of a round, worker s", of(2, "round_work_s")),
        ("refresh_duty", "refresh duty (round work / interval)", of(2, "refresh_duty")),
        ("swap_ms", "Asteria swap ms per step", of(2, "swap_ms_per_step")),
        ("state_bytes", "SOAP state bytes", of(2, "state_bytes_total")),
        ("peak_rss", "peak RSS bytes (all arms)", [size["peak_rss_bytes"] for size in by_size]),
    ]


# ------------------------------------------------------------------------------------ the suite
def run(opts: BenchOptions) -> SuiteResult:
    ladder = opts.pick(QUICK, FULL)
    result = SuiteResult("scale", TITLE, opts.quick, opts.command,
                         config={"ladder": [asdict(r) for r in ladder], "interval": INTERVAL,
                                 "staleness_bound": BOUND, "arms": [asdict(a) for a in arms()],
                                 "threads": 2, "warmup_turns": turns.WARMUP_TURNS,
                                 "vocab": "bytes (256)"})
    by_size = []
    root = opts.out_dir / ".scale-runs"
    for rung in ladder:
        runs, peak = train_rung(rung, opts, root / rung.name.replace(" ", ""))
        by_size.append({"size": rung.name, "params": runs[0]["params"], "peak_rss_bytes": peak,
                        "runs": runs})
        result.runs = [{**r, "peak_rss_bytes": s["peak_rss_bytes"]} for s in by_size
                       for r in s["runs"]]
        result.save(opts.out_dir)
    shutil.rmtree(root, ignore_errors=True)
    summarize(result, by_size, opts)
    result.save(opts.out_dir)
    return result


def summarize(result: SuiteResult, by_size: list[dict[str, Any]], opts: BenchOptions) -> None:
    params = [s["params"] for s in by_size]
    steps = result.table("Step time per size (ms; interleaved turns, after the warm-up turns)",
                         ["size", "params", "arm", "p50", "mean", "p99", "spike"])
    refresh = result.table(
        f"Refresh per size (Asteria-SOAP, 1 worker thread, S = {BOUND})",
        ["size", "params", "blocks", "round work s", "interval s", "duty", "staleness max / S",
         "refresh_wait ms/step", "swap ms/step"],
        note="duty = one round's refresh work (worker seconds, every block) over the training "
             "time of one interval; above 1 the worker cannot keep up.")
    memory = result.table("Memory per size", ["size", "params", "arm", "moments MB",
                                              "factors MB", "bases MB", "peak RSS MB (all arms)"])
    for size in by_size:
        for r in size["runs"]:
            steps.add(size["size"], size["params"], r["label"], round(r["p50_ms"], 1),
                      round(r["mean_ms"], 1), round(r["p99_ms"], 1), round(r["spike"], 2))
            kinds = r["state_bytes"]
            memory.add(size["size"], size["params"], r["label"],
                       *(round(kinds[k] / 2**20, 2) for k in ("moments", "factors", "bases")),
                       round((size["peak_rss_bytes"] or 0) / 2**20, 1))
        a = size["runs"][2]
        refresh.add(size["size"], size["params"], a.get("blocks", 0),
                    round(a.get("round_work_s", 0.0), 3), round(a.get("interval_train_s", 0.0), 3),
                    round(a.get("refresh_duty", 0.0), 3), f"{a['staleness_max']} / {BOUND}",
                    round(a["refresh_wait_ms_per_step"], 2), round(a["swap_ms_per_step"], 2))
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
    _conclude(result, by_size, fitted)


def _conclude(result: SuiteResult, by_size: list[dict[str, Any]], fitted: dict) -> None:
    largest = by_size[-1]
    native, ours = largest["runs"][1], largest["runs"][2]
    ratio = ours["mean_ms"] / native["mean_ms"]
    result.quote("asteria_over_native_largest", ratio,
                 f"at {largest['size']} ({largest['params'] / 1e6:.1f}M parameters) "
                 "Asteria-SOAP's mean step is {value:.2f}x native SOAP's (shared cores)")
    if "asteria_step_ms" in fitted:
        result.quote("asteria_step_exponent", fitted["asteria_step_ms"]["exponent"],
                     "Asteria-SOAP's step time grows as N^{value:.2f} with the parameters N")
    for size in by_size:
        a = size["runs"][2]
        if a.get("refresh_duty") is None:
            continue
        behind = a["refresh_duty"] > 1
        result.findings.append(
            f"{size['size']} ({size['params'] / 1e6:.2f}M parameters): a round of refreshes "
            f"takes {a['round_work_s']:.2f} worker-s against {a['interval_train_s']:.2f} s of "
            f"training per interval (duty {a['refresh_duty']:.2f}); staleness reached "
            f"{a['staleness_max']} of S = {BOUND} and the step waited "
            f"{a['refresh_wait_ms_per_step']:.1f} ms per step as refresh_wait"
            + (" (the worker cannot keep up: the bound holds and the wait is counted)."
               if behind else "."))
    for key, fit in fitted.items():
        result.findings.append(f"{key}: fitted exponent {fit['exponent']:.2f} over "
                               f"{fit['points']} sizes.")
    result.findings.append(
        f"Peak RSS of the largest size with all three arms resident: "
        f"{(largest['peak_rss_bytes'] or 0) / 2**30:.2f} GiB; its SOAP state: "
        f"{ours['state_bytes_total'] / 2**30:.3f} GiB.")


def plot(by_size: list[dict[str, Any]], fitted: dict, path: Path) -> dict[str, str]:
    """Each figure against the parameter count, log-log, with its fitted line and exponent."""
    plt = pyplot()
    params = [s["params"] for s in by_size]
    panels = [("step time, mean ms", ("adamw_step_ms", "native_step_ms", "asteria_step_ms")),
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
        ax.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path, "each cost against the parameter count, log-log, with its fitted "
                           "exponent k (dashed: the fit)")
