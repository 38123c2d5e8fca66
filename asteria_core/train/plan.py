"""`asteria plan`: how many host workers keep a run's refreshes off the critical path, and where
its optimizer state lives.

The blocks come from the optimizer itself: the run's model is built on the meta device (shapes,
no memory) and its optimizer from the config exactly as the trainer builds it, so
`refresh_blocks()` and `state_spec()` give the blocks and state tensors a real run would have.
The refresh cost per block side comes from `refresh_cost` (measured on this host, or estimated
and labelled). The arithmetic is the refresh engine's:

    round work  W = sum over blocks of one refresh's seconds     (worker-seconds per round)
    duty(n)     = W / (n x refresh_interval x step_seconds)       (the records' background_load)

Above 1 the workers cannot keep up: every swap is late and the step waits (refresh_wait). A
round is placed on the swap window's V boundaries by cost, each slot's blocks read at its
boundary and swapped d - V + 1 steps later (refresh/schedule.py; d = min(S, interval) by
default, V fitted to the blocks), and a block is never split across workers, so the plan asks
for the fewest workers n whose duty is at most `headroom` and on which the busiest slot, packed
largest block first onto the least loaded worker, ends within headroom x (d - V + 1) steps.
When one block alone takes longer than that, no worker count helps: the plan says so and names
the block size that would fit.
Memory per tier is the tier store's own placement (`tiers.placement.plan`) of the state entries.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from asteria_core.fields import AUTO
from asteria_core.machine import MACHINE, Machine
from asteria_core.optim.base import BlockPreconditioner
from asteria_core.optim.seam import RefreshConfig
from asteria_core.policy import PLANNED_DUTY, Policy
from asteria_core.refresh.schedule import share_out, swap_window
from asteria_core.telemetry.labels import TIERS, Tier
from asteria_core.tiers.lifecycle import Entry, classify, leaves
from asteria_core.tiers.placement import plan as place
from asteria_core.train.config import RunConfig
from asteria_core.train.refresh_cost import MEASURE_CAP, RefreshCost, calibrate
from asteria_core.validation import ConfigError, finite_in, int_in

HEADROOM = PLANNED_DUTY
"""Default target: duty at most 0.8, so a slower step or a busier host still keeps up."""
MAX_STEP_SECONDS = 86_400.0
MAX_SIDE = 65536  # optim.precond_block_size's and max_precond_dim's upper limit


# ------------------------------------------------------------------------------ the run's shapes
@dataclass(frozen=True)
class RunShape:
    """What the plan needs of a run: its refresh blocks and state entries, from its optimizer."""

    sizes: tuple[int, ...]
    """b of every refresh block, in the optimizer's block order."""
    configs: dict[int, RefreshConfig]
    """The refresh config of the first block of each size (what calibration runs)."""
    entries: list[Entry]
    """Every optimizer-state tensor a run holds after its first update."""
    parameters: int
    param_bytes: int


def run_shape(config: RunConfig) -> RunShape:
    """The run's model on the meta device and its optimizer as the trainer builds it."""
    from asteria_core.train.model import GPT
    from asteria_core.train.optimizers import optimizer_from_config

    with torch.device("meta"):
        model = GPT(config.model)
    opt = optimizer_from_config(config.optim, model, config.policy)
    if not isinstance(opt, BlockPreconditioner):
        raise ConfigError(f"optim.name: got {config.optim.name!r}; allowed: soap | shampoo | "
                          "kl_shampoo (a first-order optimizer refreshes nothing; add --optim.name "
                          "soap)")
    return shape_of(opt)


def shape_of(opt: BlockPreconditioner) -> RunShape:
    """The blocks and state entries of a built optimizer (meta or real parameters)."""
    blocks = opt.refresh_blocks()
    configs: dict[int, RefreshConfig] = {}
    for block in blocks:
        configs.setdefault(block.size, opt.refresh_config(block.key))
    entries = []
    params = [p for group in opt.param_groups for p in group["params"]]
    for index in range(len(params)):
        for path, t in leaves(opt.state_spec(index)):
            entries.append(Entry(index, path, tuple(t.shape), t.dtype, classify(path)))
    return RunShape(tuple(b.size for b in blocks), configs, entries,
                    sum(p.numel() for p in params),
                    sum(p.numel() * p.element_size() for p in params))


# ------------------------------------------------------------------------------ the prediction
@dataclass(frozen=True)
class SizeGroup:
    size: int
    blocks: int
    seconds: float
    """One refresh of one block of this size, on one worker."""
    estimated: bool
    """Not measured at this size: interpolated or extrapolated."""

    @property
    def round_seconds(self) -> float:
        return self.blocks * self.seconds


@dataclass(frozen=True)
class Prediction:
    step_seconds: float
    interval: int
    bound: int
    delay: int
    headroom: float
    groups: tuple[SizeGroup, ...]
    workers: int | None
    """The fewest workers that keep duty <= headroom and a round within its window; None when
    no count can (a block alone outlasts the window)."""
    why_none: str = ""
    spread: int = 1
    """V: the boundaries a round is placed on (refresh/schedule.py's `swap_window`, as the
    engine works it out); each slot is swapped d - V + 1 steps after it is read."""
    slots: tuple[tuple[int, ...], ...] = ()
    """The block sides of each of the V slots, placed as the engine places them."""

    @property
    def round_work_s(self) -> float:
        """Worker-seconds of one round: every block refreshed once."""
        return sum(g.round_seconds for g in self.groups)

    @property
    def interval_train_s(self) -> float:
        return self.interval * self.step_seconds

    @property
    def window_s(self) -> float:
        """Training time between a slot's read and its swap, which its refreshes are held
        to."""
        return self.window_steps * self.step_seconds

    @property
    def window_steps(self) -> int:
        """L = d - V + 1: the steps from a slot's read to its swap."""
        return self.delay - self.spread + 1

    @property
    def largest_block_s(self) -> float:
        return max((g.seconds for g in self.groups), default=0.0)

    @property
    def estimated(self) -> bool:
        return any(g.estimated for g in self.groups)

    def duty(self, workers: int) -> float:
        """The refresh engine's background load with `workers` workers at this step time."""
        return self.round_work_s / (workers * self.interval_train_s)

    def to_dict(self, counts: Sequence[int] = ()) -> dict:
        return {"step_seconds": self.step_seconds, "refresh_interval": self.interval,
                "staleness_bound": self.bound, "swap_delay": self.delay,
                "swap_window": self.spread,
                "headroom": self.headroom, "round_work_s": self.round_work_s,
                "interval_train_s": self.interval_train_s, "window_s": self.window_s,
                "largest_block_s": self.largest_block_s, "estimated": self.estimated,
                "blocks": [dataclasses.asdict(g) | {"round_seconds": g.round_seconds}
                           for g in self.groups],
                "duty": {str(n): self.duty(n) for n in counts},
                "workers": self.workers, "why_no_worker_count": self.why_none or None}


def check_inputs(step_seconds: float, interval: int, bound: int, headroom: float) -> None:
    finite_in("step_seconds", step_seconds, 0.0, MAX_STEP_SECONDS, lo_open=True)
    finite_in("headroom", headroom, 0.0, 1.0, lo_open=True)
    # a Policy checks these too; a caller of predict() may pass bare numbers
    if interval < 1:
        raise ConfigError(f"policy.refresh_interval: got {interval}; allowed: an integer >= 1")
    if bound < 0:
        raise ConfigError(f"policy.staleness_bound: got {bound}; allowed: an integer >= 0")


def predict(sizes: Sequence[int], cost: RefreshCost | Mapping[int, float], *,
            step_seconds: float, interval: int, bound: int, delay: int | None = None,
            spread: int | str | None = None, headroom: float = HEADROOM) -> Prediction:
    """The refresh work and worker count of blocks of sides `sizes` at `step_seconds` a step
    (pure: `cost` maps a block side to one refresh's seconds, or is a `RefreshCost`)."""
    check_inputs(step_seconds, interval, bound, headroom)
    cost = RefreshCost.of(cost)
    delay = bound if delay is None else delay
    groups = tuple(SizeGroup(b, n, cost.seconds(b), cost.is_estimate(b))
                   for b, n in sorted(Counter(sizes).items(), reverse=True))
    ordered = sorted(sizes, reverse=True)  # the engine's default queue order: costliest first
    costs = [float(b) ** 3 for b in ordered]  # the engine's cost (optimizer.refresh_blocks)
    v = swap_window(delay, AUTO if spread is None else spread, interval, costs)
    placed = share_out(range(len(ordered)), costs, v) if v > 1 else dict.fromkeys(
        range(len(ordered)), 0)
    slots = tuple(tuple(ordered[i] for i in placed if placed[i] == k) for k in range(v))
    base = Prediction(step_seconds, interval, bound, delay, headroom, groups, None,
                      spread=v, slots=slots)
    workers, why = _workers(base, sizes, cost)
    return dataclasses.replace(base, workers=workers, why_none=why)


def _workers(p: Prediction, sizes: Sequence[int], cost: RefreshCost) -> tuple[int | None, str]:
    if not sizes:
        return 0, ""
    if p.delay == 0:
        return None, ("d = 0: every refresh is swapped in at its own boundary, so the step "
                      "waits for it whatever the workers; set policy.swap_delay (or S) >= 1")
    budget = p.headroom * p.window_s
    if p.largest_block_s > budget:
        return None, (f"one refresh of a {max(sizes)}-wide block takes {p.largest_block_s:.3g} s, "
                      f"more than {p.headroom:.0%} of the {p.window_s:.3g} s before its swap "
                      f"(d - swap window + 1 = {p.window_steps} steps): the step "
                      "waits whatever the workers; lower optim.precond_block_size"
                      + _fitting_block(cost, budget) + ", lower policy.swap_window, or set a "
                      "longer policy.swap_delay (\"auto\" is the interval; at most S)")
    slots = [sorted((cost.seconds(b) for b in slot), reverse=True) for slot in p.slots]
    n = max(1, math.ceil(p.round_work_s / (p.headroom * p.interval_train_s)))
    while n < len(sizes) and max(_makespan(times, n) for times in slots) > budget:
        n += 1
    return n, ""


def _makespan(times: Sequence[float], workers: int) -> float:
    """A round's length on `workers` workers, longest refresh first onto the least loaded."""
    loads = [0.0] * workers
    for t in times:
        heapq.heapreplace(loads, loads[0] + t)
    return max(loads)


def _fitting_block(cost: RefreshCost, budget: float) -> str:
    """' to B or less': the widest power of two whose refresh fits the budget."""
    b = 1 << 16
    while b > 1 and cost.seconds(b) > budget:
        b //= 2
    return f" to {b} or less" if b > 1 else ""


# ------------------------------------------------------------------------------ memory per tier
@dataclass(frozen=True)
class Memory:
    state: dict[str, int]
    """Optimizer-state bytes homed in each tier (the host's includes the disk tier's staging)."""
    staging: int
    parameters_and_gradients: int
    """On the device: fp32 weights and their gradients."""
    refresh_in_flight: int
    """Host, at most: the results of refreshes done and not swapped in yet (basis and the
    first moment's rotation, b x b each), ceil(d / interval) per block."""
    policy: Policy

    def to_dict(self) -> dict:
        return {"state_bytes": self.state, "staging_bytes": self.staging,
                "parameters_and_gradients_bytes": self.parameters_and_gradients,
                "refresh_in_flight_bytes_at_most": self.refresh_in_flight,
                "offload_mode": self.policy.offload_mode,
                "device_budget_bytes": self.policy.device_budget_bytes,
                "host_budget_bytes": self.policy.host_budget_bytes}


def memory(shape: RunShape, policy: Policy) -> Memory:
    """Bytes per tier under the policy's tier settings, placed as the tier store places them
    (PolicyError naming the budget when the placement cannot be met)."""
    placed = place(shape.entries, policy)
    state = {tier: placed.used(shape.entries, tier) for tier in TIERS}
    staging = placed.slots * placed.slot_bytes
    state[Tier.HOST] += staging
    rounds = max(1, math.ceil(policy.delay / policy.refresh_interval))
    itemsize = max((e.dtype.itemsize for e in shape.entries), default=4)
    in_flight = sum(2 * b * b * itemsize for b in shape.sizes) * rounds
    return Memory(state, staging, 2 * shape.param_bytes, in_flight, policy)


# ------------------------------------------------------------------------------ the whole plan
@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    shape: RunShape
    prediction: Prediction
    memory: Memory
    measured_now: list[int]
    calibration: str
    """Where the measurements are kept ("" when not kept)."""
    machine: Machine = MACHINE
    """The machine planned for: its cores bound the workers recommended."""

    @property
    def recommended(self) -> int | None:
        """The workers to run: those needed, at most those this machine can use (None: no
        count is enough)."""
        needed = self.prediction.workers
        return None if needed is None else min(needed, self.machine.max_workers)

    def counts(self) -> list[int]:
        """Worker counts worth a row: 1, 2, 4, ... up to the recommended one (and one more)."""
        top = max(self.prediction.workers or 0, math.ceil(self.prediction.duty(1)), 1)
        counts = {1, top, top + 1}
        n = 2
        while n < top:
            counts.add(n)
            n *= 2
        return sorted(counts)

    def to_dict(self) -> dict:
        m, o = self.config.model, self.config.optim
        return {"model": {"n_layer": m.n_layer, "n_embd": m.n_embd, "n_head": m.n_head,
                          "vocab_size": m.vocab_size, "parameters": self.shape.parameters},
                "optim": {"name": o.name, "max_precond_dim": o.max_precond_dim,
                          "precond_block_size": o.precond_block_size,
                          "refresh_method": o.refresh_method},
                "worker_threads": self.config.policy.worker_threads,
                "calibration": {"file": self.calibration or None,
                                "measured_now": self.measured_now},
                "refresh": self.prediction.to_dict(self.counts()),
                "machine": {"cores": self.machine.cores,
                            "max_workers": self.machine.max_workers},
                "recommended_workers": self.recommended,
                "memory": self.memory.to_dict()}


def plan_run(config: RunConfig, *, step_seconds: float, headroom: float = HEADROOM,
             calibration=None, recalibrate: bool = False, cap: int = MEASURE_CAP,
             machine: Machine = MACHINE) -> RunPlan:
    """The plan of `config` at `step_seconds` a step on `machine`, calibrating what the cache
    at `calibration` (a Path, or None: no cache) lacks; sides over `cap` are extrapolated."""
    policy = config.policy
    check_inputs(step_seconds, policy.refresh_interval, policy.staleness_bound, headroom)
    int_in("measure_up_to", cap, 1, MAX_SIDE)
    shape = run_shape(config)
    mem = memory(shape, policy)  # a budget that cannot be met fails before any measuring
    cost, measured_now = shape_cost(shape, policy.worker_threads, calibration=calibration,
                                    recalibrate=recalibrate, cap=cap)
    prediction = predict(shape.sizes, cost, step_seconds=step_seconds,
                         interval=policy.refresh_interval, bound=policy.staleness_bound,
                         delay=policy.delay, spread=policy.swap_window, headroom=headroom)
    return RunPlan(config, shape, prediction, mem, measured_now,
                   str(calibration or ""), machine)


def shape_cost(shape: RunShape, threads: int, *, calibration=None, recalibrate: bool = False,
               cap: int = MEASURE_CAP) -> tuple[RefreshCost, list[int]]:
    """The refresh cost of every block side of `shape` (each side with its own blocks' refresh
    config), and the sides measured just now."""
    measured: dict[int, float] = {}
    estimates: dict[int, float] = {}
    measured_now: list[int] = []
    for refresh_config in dict.fromkeys(shape.configs.values()):  # one per kind of refresh
        sizes = [b for b in set(shape.sizes) if shape.configs[b] == refresh_config]
        cost, now = calibrate(sizes, refresh_config, threads, path=calibration,
                              recalibrate=recalibrate, cap=cap)
        for b in sizes:
            (estimates if cost.is_estimate(b) else measured)[b] = cost.seconds(b)
        measured_now += now
    return RefreshCost(measured, estimates), sorted(set(measured_now))


def predict_optimizer(opt: BlockPreconditioner, policy: Policy, *, step_seconds: float,
                      calibration=None, cap: int = MEASURE_CAP,
                      headroom: float = HEADROOM) -> Prediction:
    """The plan's prediction for a built optimizer (the scale suite's: its measured step time
    in, the predicted round work `round_work_s` and `duty(workers)` out, to hold against the
    engine's measured ones). Sides up to `cap` are measured now (or read from `calibration`)."""
    shape = shape_of(opt)
    cost, _ = shape_cost(shape, policy.worker_threads, calibration=calibration, cap=cap)
    return predict(shape.sizes, cost, step_seconds=step_seconds,
                   interval=policy.refresh_interval, bound=policy.staleness_bound,
                   delay=policy.delay, spread=policy.swap_window, headroom=headroom)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def render(run: RunPlan) -> str:
    """The plan as a user reads it: blocks by size, duty per worker count, memory per tier."""
    c, p, m = run.config, run.prediction, run.memory
    lines = [
        f"asteria plan: {c.optim.name}, {c.model.n_layer} x {c.model.n_embd} "
        f"({run.shape.parameters / 1e6:.1f}M parameters), max_precond_dim "
        f"{c.optim.max_precond_dim}, precond_block_size {c.optim.precond_block_size}",
        f"refresh every {p.interval} steps, S = {p.bound} (d = {p.delay}; a round read over "
        f"{p.spread} steps, each basis swapped {p.window_steps} steps after its read); "
        f"step {p.step_seconds:g} s (given): an interval is {p.interval_train_s:.3g} s of "
        "training",
        f"refresh cost: one worker with {c.policy.worker_threads} thread(s), measured on this "
        "host" + (f" (kept in {run.calibration})" if run.calibration else "")
        + "; * = estimate (interpolated, or extrapolated as b^3 above the widest measured side: "
        "--measure-up-to measures wider ones)",
        f"this machine: {run.machine.cores} core(s) this process may run on: at most "
        f"{run.machine.max_workers} host workers",
        "",
        "blocks by size",
        f"  {'size':>6} {'blocks':>7} {'s per refresh':>14} {'worker-s per round':>19}",
    ]
    for g in p.groups:
        mark = "*" if g.estimated else " "
        lines.append(f"  {g.size:>6} {g.blocks:>7} {g.seconds:>13.4g}{mark} "
                     f"{g.round_seconds:>19.4g}")
    lines.append(f"  {'total':>6} {sum(g.blocks for g in p.groups):>7} {'':>14} "
                 f"{p.round_work_s:>19.4g}" + (" (an estimate)" if p.estimated else ""))
    lines += ["", "refresh duty per worker count (round work / (workers x interval's training "
                  "time); above 1 the workers fall behind: staleness is pinned at S and the "
                  "step waits, as refresh_wait)"]
    for n in run.counts():
        duty = p.duty(n)
        note = "falls behind" if duty > 1 else "keeps up" if duty <= p.headroom else \
            f"keeps up, under {1 - p.headroom:.0%} headroom"
        lines.append(f"  {n:>4} worker{'s' if n > 1 else ' '}  duty {duty:7.3f}  {note}")
    if p.workers is None:
        lines.append(f"no worker count is enough: {p.why_none}")
    elif p.workers > (use := run.recommended or 1):
        lines.append(f"recommended: {use} host worker(s) (--policy.workers {use}), the most "
                     f"this machine's {run.machine.cores} core(s) can use; {p.workers} would "
                     f"keep up, {use} give duty {p.duty(use):.2f}: the refreshes fall behind "
                     "(staleness pinned at S, the step waits); raise policy.refresh_interval "
                     "or lower optim.precond_block_size, or plan for a machine with more cores")
    else:
        lines.append(f"recommended: {p.workers} host worker(s) (--policy.workers {p.workers}): "
                     f"duty {p.duty(max(p.workers, 1)):.2f} <= {p.headroom:g} and a round "
                     f"done within {p.window_s:.3g} s, before its swap")
    lines += ["", f"memory per tier (offload_mode {m.policy.offload_mode}, device budget "
                  f"{_budget(m.policy.device_budget_bytes)}, host budget "
                  f"{_budget(m.policy.host_budget_bytes)})"]
    for tier in TIERS:
        extra = f" (with {_bytes(m.staging)} of staging for the disk tier)" \
            if tier == Tier.HOST and m.staging else ""
        lines.append(f"  {tier:<7} {_bytes(m.state[tier]):>12} optimizer state{extra}")
    lines.append(f"  device  {_bytes(m.parameters_and_gradients):>12} parameters and gradients "
                 "(fp32)")
    lines.append(f"  host    {_bytes(m.refresh_in_flight):>12} at most: refresh results "
                 "waiting for their swap")
    return "\n".join(lines)


def _budget(nbytes: int) -> str:
    return "no limit" if not nbytes else _bytes(nbytes)
