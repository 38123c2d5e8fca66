"""Autopilot: does the runtime's own tuning reach the best static policy's time to a loss?

Each scenario trains its configurations on the same model, seed and batches, in turns
(asteria_bench/turns.py), so the machine's drift and a scenario's disturbance fall on all alike:

- (a) refresh-bound: refreshes emulated SLOWER["a"] x slower than measured
  (asteria_bench/slower_host.py: on a GPU the step is many times shorter than this CPU's, the
  host's refresh is not; no model on this 2-core CPU reaches a refresh duty above 1 as it is),
  so at the default interval the one worker cannot keep up and steps wait;
- (b) a CPU hog on the workers' core arrives a third of the way in and leaves at two thirds
  (refreshes emulated SLOWER["b"] x slower: near capacity before the hog, behind during it);
- (c) a tier budget too tight: SOAP state on disk past a device budget of one working set W and a
  host budget of two staging buffers (as `asteria bench scale-memory` tiers it), steps waiting
  for the reads; the operator lets the autopilot raise the budgets to 8W / 16W and bring the
  state to the host.
- (d) two ranks, one slowed: torchrun with 2 ranks on gloo, each pinned with its refresh worker
  to a CPU of its own, S = 2 (as `asteria bench straggler`), rank 1's refreshes emulated
  SLOWER["d"] x slower (its host slower than rank 0's; a slowed rank's compute, which no policy
  field fixes, is the straggler suite's); rank 0 decides, from its own records, where rank 1's
  late bases show as sync_wait. These jobs run one after another, not in turns (one process
  group each).

Configurations: the scenario's starting policy kept static, the autopilot (mode apply) from it,
and a small grid of static policies searched offline, i.e. run beside them. The target loss is
the best final loss (mean training loss of the last turn) plus 0.02, the quality
tolerance: a configuration that trains faster but ends worse never reaches it. Per scenario:
time to the target, final loss, the autopilot's decisions with their reasons. Goal:
the autopilot within 1.05x of the best static policy's time, at least 1.25x faster than the
starting policy where that is poor, final loss within 0.02 of the best static run.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asteria_bench.options import BenchOptions
from asteria_bench.plots import xy_plot
from asteria_bench.results import SuiteResult
from asteria_bench.slower_host import SlowerHost
from asteria_bench.suites import distributed
from asteria_bench.suites.scale_memory import state_plan
from asteria_bench.suites.straggler import Sizes
from asteria_bench.turns import (
    HOST_CPU,
    SOAP,
    Config,
    Contender,
    final_turn_loss,
    round_robin,
    time_to_loss,
)
from asteria_core.autopilot import AutopilotConfig
from asteria_core.autopilot.config import DEFAULT_BOUNDS

TITLE = "Autopilot: time to a loss against the starting policy and the best static policy"
MODEL = {"quick": ["--model.n_embd", "128", "--model.n_head", "4", "--model.n_layer", "2",
                   "--data.batch_size", "8"],
         "full": ["--model.n_embd", "256", "--model.n_head", "4", "--model.n_layer", "3",
                  "--data.batch_size", "4", "--model.block_size", "64"]}
STEPS = {"quick": 30, "full": 200}
PILOT = {"quick": {"window": 8, "settle": 2, "spacing": 10, "guard_steps": 8},
         "full": {"window": 20, "settle": 10, "spacing": 40}}
SLOWER = {"a": 6.0, "b": 3.0, "c": 1.0, "d": 6.0}
"""How many times its measured time a refresh takes (1: as measured; see the docstring)."""
QUALITY = 0.02
"""The final loss a configuration may end above the best and still count."""
AUTOPILOT = "autopilot"


def _policy(interval: int = 10, workers: int = 1) -> list[str]:
    return [*SOAP, "--policy.refresh_interval", str(interval), "--policy.workers",
            str(workers), "--train.threads", "1", "--policy.worker_threads", "1"]


def _tiers(w: int, device: int, host: int, mode: str) -> list[str]:
    """Tier budgets in working sets W; the disk tier in each run's own folder."""
    return ["--policy.offload_mode", mode, "--policy.device_budget_bytes", str(device * w),
            "--policy.host_budget_bytes", str(host * w)]


@dataclass
class Scenario:
    key: str
    name: str
    start: tuple[str, list[str]]
    """The starting policy: its label and config overrides (the autopilot starts there too)."""
    grid: list[tuple[str, list[str]]]
    """The static policies searched offline."""
    bounds: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_BOUNDS))
    on_turn: Callable[[int], None] | None = None

    def configs(self) -> list[Config]:
        label, args = self.start
        return [Config(label, args, "soap"), Config(f"{AUTOPILOT} (from {label})", args, "soap"),
                *[Config(f"static {label}", args, "soap") for label, args in self.grid]]


def _refresh_grid(opts: BenchOptions) -> list[tuple[str, list[str]]]:
    grid = opts.pick([(20, 1)], [(20, 1), (40, 1), (10, 2), (20, 2)])
    return [(f"interval {i}, {w} worker{'s' if w > 1 else ''}", _policy(i, w)) for i, w in grid]


def _scenarios(opts: BenchOptions, hog: Hog) -> list[Scenario]:
    default = ("default (interval 10, 1 worker)", _policy())
    w = state_plan([*opts.pick(MODEL["quick"], MODEL["full"]), *SOAP])["working_set"]
    tight = [*_policy(), *_tiers(w, 1, 2, "disk")]
    tier_grid = [("device 4W, host 8W, disk", [*_policy(), *_tiers(w, 4, 8, "disk")]),
                 ("device 1W, host 16W, host tier", [*_policy(), *_tiers(w, 1, 16, "host")])]
    return [
        Scenario("a", "refresh-bound", default, _refresh_grid(opts)),
        Scenario("b", "CPU hog mid-run", default, _refresh_grid(opts), on_turn=hog),
        Scenario("c", "tier budget too tight", ("tight tiers (device 1W, host 2W, disk)", tight),
                 opts.pick(tier_grid[1:], tier_grid),
                 bounds={**DEFAULT_BOUNDS, "device_budget_bytes": [w, 8 * w],
                         "host_budget_bytes": [2 * w, 16 * w],
                         "offload_mode": ["disk", "host"]}),
    ]


class Hog:
    """A busy process pinned to the workers' core between two turns (scenario b)."""

    def __init__(self, start_turn: int, stop_turn: int) -> None:
        self.start_turn, self.stop_turn = start_turn, stop_turn
        self.proc: subprocess.Popen | None = None

    def __call__(self, turn: int) -> None:
        if turn == self.start_turn and self.proc is None:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{HOST_CPU}}})\n"
                                       "while True: pass"])
        elif turn == self.stop_turn:
            self.close()

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _prepare(pilot: AutopilotConfig):
    def prepare(c: Contender) -> None:
        if c.config.label.startswith(AUTOPILOT):
            c.trainer.runtime.autopilot.configure(pilot)
    return prepare


def _run_scenario(sc: Scenario, opts: BenchOptions, tmp: Path) -> dict[str, Any]:
    steps = opts.pick(STEPS["quick"], STEPS["full"])
    model = opts.pick(MODEL["quick"], MODEL["full"])
    pilot = AutopilotConfig(mode="apply", bounds=sc.bounds,
                            **opts.pick(PILOT["quick"], PILOT["full"]))
    runs = round_robin(sc.configs(), steps, tmp / sc.key, opts, model,
                       prepare=_prepare(pilot), on_turn=sc.on_turn,
                       refresh_fn=SlowerHost(SLOWER[sc.key]))
    return _judged({"name": f"{sc.key}: {sc.name}", "steps": steps, "slower": SLOWER[sc.key],
                    "autopilot": pilot.to_dict(), "runs": runs})


RANKS = {"quick": Sizes(steps=20, interval=5, repeats=1),
         "full": Sizes(steps=160, interval=10, repeats=1, n_embd=256)}
RANK_ARGS = [*distributed.bound(2), "--train.split_cpus", "true", "--slower-rank", "1",
             "--slower", str(SLOWER["d"])]
RANK_AUTOPILOT = ["--autopilot.mode", "apply", "--autopilot.window", "20",
                  "--autopilot.settle", "10", "--autopilot.spacing", "40"]
"""Scenario d's autopilot: it applies its changes (default bounds; rank 0 decides)."""
RANK_GRID = {"quick": [],
             "full": [("interval 20", ["--policy.refresh_interval", "20"]),
                      ("S 4", distributed.bound(4)), ("2 workers", ["--policy.workers", "2"])]}


def _ranks_scenario(opts: BenchOptions) -> dict[str, Any]:
    """(d): each configuration one torchrun job of 2 ranks, rank 1's refreshes slower."""
    sizes = opts.pick(RANKS["quick"], RANKS["full"])
    if len(os.sched_getaffinity(0)) < 2:
        raise RuntimeError("scenario d needs 2 CPUs (one per rank)")
    start = f"default (interval {sizes.interval}, S 2, 1 worker)"
    configs = [(start, []), (f"{AUTOPILOT} (from {start})", RANK_AUTOPILOT),
               *[(f"static {label}", args) for label, args in opts.pick(RANK_GRID["quick"],
                                                                         RANK_GRID["full"])]]
    runs = []
    for label, args in configs:
        ranks = distributed.launch(2, sizes, [*RANK_ARGS, *args], 0, None)
        runs.append(_rank_zero_run(label, ranks, sizes.interval))
    return _judged({"name": "d: two ranks, one slowed", "steps": sizes.steps,
                    "slower": SLOWER["d"],
                    "autopilot": AutopilotConfig(mode="apply", window=20, settle=10,
                                                 spacing=40).to_dict(), "runs": runs})


def _rank_zero_run(label: str, ranks: list[dict], warmup: int) -> dict[str, Any]:
    """Rank 0's figures as turns.summary gives them (the loss over rank 0's batches, the same
    in every job: same seed)."""
    zero = ranks[0]
    step_ms = [1e3 * s for s in zero["step_seconds"]]
    steps = len(step_ms)
    return {"label": label, "params": zero["params"], "loss": zero["losses"],
            "step_ms": step_ms, "warmup_steps": warmup,
            "p50_ms": statistics.median(step_ms[warmup:]),
            "idle_s": {cause: zero[f"{cause}_ms_per_step"] * steps / 1e3
                       for cause in ("refresh_wait", "sync_wait")},
            "policy_changes": zero.get("policy_changes", []),
            "rank1_sync_wait_s": ranks[1]["sync_wait_ms_per_step"] * steps / 1e3}


def _judged(sc: dict[str, Any]) -> dict[str, Any]:
    """Target loss (the best final + QUALITY) and each run's time to it."""
    runs = sc["runs"]
    for r in runs:
        r["final_turn_loss"] = final_turn_loss(r)
    sc["target_loss"] = min(r["final_turn_loss"] for r in runs) + QUALITY
    for r in runs:
        r["to_target_steps"], r["to_target_s"] = time_to_loss(r, sc["target_loss"])
    return sc


def run(opts: BenchOptions) -> SuiteResult:
    result = SuiteResult("autopilot", TITLE, opts.quick, opts.command,
                         config={"steps": opts.pick(STEPS["quick"], STEPS["full"]),
                                 "model_args": opts.pick(MODEL["quick"], MODEL["full"]),
                                 "slower": SLOWER, "quality": QUALITY,
                                 "autopilot": opts.pick(PILOT["quick"], PILOT["full"])})
    turns = -(-result.config["steps"] // 10)
    mid_run = Hog(turns // 3, 2 * turns // 3)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            result.runs = [_run_scenario(sc, opts, Path(tmp))
                           for sc in _scenarios(opts, mid_run)]
        finally:
            mid_run.close()
    result.runs.append(_ranks_scenario(opts))
    result.plots += [_judge(sc, opts) for sc in result.runs]
    result.save(opts.out_dir)
    return result


def _judge(sc: dict[str, Any], opts: BenchOptions) -> dict[str, Any]:
    """The scenario's goal, judged (`met`), and a plot of its losses: the starting policy's, the
    autopilot's and the best static policy's."""
    start, pilot, best = sc["runs"][0], sc["runs"][1], best_static(sc["runs"])
    sc["met"] = goal(start, pilot, best).met
    sc["best_static"] = best["label"]
    sc["vs_best"] = _ratio(pilot["to_target_s"], best["to_target_s"])
    sc["vs_start"] = _ratio(start["to_target_s"], pilot["to_target_s"])
    xs = list(range(1, len(pilot["loss"]) + 1))
    return xy_plot(
        [(r["label"], xs, [x if x is not None else float("nan") for x in r["loss"]])
         for r in (start, pilot, best)],
        opts.out_dir / f"autopilot-{sc['name'].split(':')[0]}.png",
        title=f"scenario {sc['name']}: training loss", xlabel="step",
        ylabel="training loss (measured)")


def best_static(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The quickest to the target of the starting policy and the static grid."""
    return min([runs[0], *runs[2:]], key=lambda r: r["to_target_s"] or float("inf"))


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a / b, 2)


@dataclass
class Goal:
    """The autopilot's goal in a scenario: within 1.05x of the best static policy's time to the
    target, at least 1.25x faster than the starting policy where that is poor (1.25x the best
    or worse), final loss within QUALITY of the best's."""

    reached: bool
    ratio: float | None
    """The autopilot's time over the best static policy's."""
    gap: float
    """Its final loss minus the best static policy's."""
    poor: bool
    speedup: float | None
    """The starting policy's time over the autopilot's; None where the start never reached."""
    met: bool


def goal(start: dict[str, Any], pilot: dict[str, Any], best: dict[str, Any]) -> Goal:
    gap = pilot["final_turn_loss"] - best["final_turn_loss"]
    if pilot["to_target_s"] is None:
        return Goal(False, None, gap, True, None, False)
    ratio = pilot["to_target_s"] / best["to_target_s"]
    poor = start["to_target_s"] is None or start["to_target_s"] >= 1.25 * best["to_target_s"]
    speedup = None if start["to_target_s"] is None else start["to_target_s"] / pilot[
        "to_target_s"]
    met = ratio <= 1.05 and gap <= QUALITY and (not poor or speedup is None or speedup >= 1.25)
    return Goal(True, ratio, gap, poor, speedup, met)
