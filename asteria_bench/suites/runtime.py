"""What the runtime costs a training loop: its own CPU per step, against the step.

Three arms train the same model (the default GPT, same init, same batches) in one process:
- bare AdamW: `torch.optim.AdamW` in a plain loop, no runtime;
- Asteria AdamW: `asteria.optimizer(model, "adamw")`, the runtime attached (hooks, boundary,
  telemetry, records);
- Asteria SOAP: `asteria.optimizer(model, "soap")`, refresh on one host worker (the default
  policy).
The two AdamW arms take interleaved turns, in ABBA order, so machine drift falls on both alike;
the SOAP arm trains after them (its refresh worker would otherwise run beside the other arms'
turns). The runtime's own CPU is measured directly: `time.thread_time()` of the training thread
inside every runtime entry point (forward hooks, optimizer step pre/post hooks with the step
boundary, record completion), outermost call only, per step and as a share of the arm's median
step time. Of it, the basis swaps (`apply_refresh` at the boundary: installing a new basis and
re-expressing the moments in it, SOAP's own math that native SOAP does inside its step) are
timed apart, so the runtime's bookkeeping and the optimizer's swap math are told apart.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

import asteria_core as asteria
from asteria_bench.clocks import SwapClock
from asteria_bench.options import BenchOptions, progress
from asteria_bench.results import SuiteResult
from asteria_core.runtime import Runtime, RuntimeConfig, decay_groups
from asteria_core.runtime.hooks import TorchHooks
from asteria_core.telemetry.records import StepRecord
from asteria_core.train.config import ModelConfig
from asteria_core.train.data import BatchLoader, encode, load_corpus, split_tokens
from asteria_core.train.model import GPT

TITLE = "Runtime: what attaching Asteria costs a training loop"
SIZES = {"quick": {"steps": 10, "rounds": 2}, "full": {"steps": 20, "rounds": 6}}
THREADS = 2


class CpuCount:
    """Thread CPU seconds inside the runtime's entry points (outermost calls only)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.depth = 0

    def timed(self, fn, *args, **kwargs):
        if self.depth:
            return fn(*args, **kwargs)
        self.depth += 1
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds += time.thread_time() - t0
            self.depth -= 1


def _timed(base: type, name: str):
    def method(self, *args, **kwargs):
        return self.cpu.timed(getattr(base, name), self, *args, **kwargs)
    return method


class TimedHooks(TorchHooks):
    """The runtime's torch hooks, counted: what torch calls on every forward and step."""

    @property
    def cpu(self) -> CpuCount:
        return self.events.cpu

    for _name in ("before_forward", "after_forward", "before_optimizer", "after_optimizer"):
        locals()[_name] = _timed(TorchHooks, _name)
    del _name


class TimedRuntime(Runtime):
    """The real runtime, with the CPU of its entry points counted: the torch hooks (the step
    boundary runs inside the optimizer's post hook) and the record's completion."""

    hooks_type = TimedHooks

    def __init__(self, *args, **kwargs) -> None:
        self.cpu = CpuCount()
        super().__init__(*args, **kwargs)

    @property
    def cpu_seconds(self) -> float:
        return self.cpu.seconds

    end_step = _timed(Runtime, "end_step")


class Arm:
    def __init__(self, label: str, name: str | None, model: GPT, lr: float) -> None:
        self.label, self.model = label, model
        self.runtime: TimedRuntime | None = None
        if name is None:
            self.opt = torch.optim.AdamW(decay_groups(model, 0.0), lr=lr, betas=(0.9, 0.95))
        else:
            self.opt = asteria.build_optimizer(name, decay_groups(model, 0.0), lr=lr)
            self.runtime = TimedRuntime(self.opt, model=model,
                                        config=RuntimeConfig(optimizer_name=name))
            self.records: list[StepRecord] = []
            self.runtime.add_listener(self.records.append)
            self.swaps = SwapClock(self.opt)
        self.step_seconds: list[float] = []
        self.runtime_cpu: list[float] = []
        self.swap_cpu: list[float] = []

    def turn(self, batches: list) -> None:
        for x, y in batches:
            before = self.runtime.cpu_seconds if self.runtime else 0.0
            swaps_before = self.swaps.seconds if self.runtime else 0.0
            t0 = time.perf_counter()
            _, loss = self.model(x, y)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            if self.runtime is not None:
                self.runtime.end_step()  # what the next forward would do: count it here
            self.step_seconds.append(time.perf_counter() - t0)
            if self.runtime is not None:
                self.runtime_cpu.append(self.runtime.cpu_seconds - before)
                self.swap_cpu.append(self.swaps.seconds - swaps_before)

    def summary(self, skip: int) -> dict:
        steps = self.step_seconds[skip:]
        out = {"label": self.label, "steps": len(steps),
               "step_ms_median": 1e3 * statistics.median(steps),
               "step_ms_mean": 1e3 * statistics.fmean(steps),
               "step_ms_raw": [1e3 * s for s in self.step_seconds]}
        if self.runtime is not None:
            cpu = self.runtime_cpu[skip:]
            out["runtime_cpu_ms_median"] = 1e3 * statistics.median(cpu)
            out["runtime_cpu_ms_mean"] = 1e3 * statistics.fmean(cpu)
            out["runtime_share_of_step"] = statistics.fmean(cpu) / statistics.median(steps)
            out["runtime_cpu_ms_raw"] = [1e3 * c for c in self.runtime_cpu]
            swaps = self.swap_cpu[skip:]
            out["swap_cpu_ms_mean"] = 1e3 * statistics.fmean(swaps)
            out["swap_share_of_step"] = statistics.fmean(swaps) / statistics.median(steps)
            out["bookkeeping_share_of_step"] = \
                out["runtime_share_of_step"] - out["swap_share_of_step"]
            refresh = [r.refresh for r in self.records if r.refresh is not None]
            if refresh:
                out["staleness_max"] = max(r.staleness_max for r in refresh)
                out["refresh_wait_ms_total"] = 1e3 * sum(
                    r.timing.idle_seconds["refresh_wait"] for r in self.records if r.timing)
            self.runtime.close()
        return out


def run(opts: BenchOptions) -> SuiteResult:
    size = opts.pick(SIZES["quick"], SIZES["full"])
    steps, rounds = size["steps"], size["rounds"]
    torch.set_num_threads(THREADS)
    config = ModelConfig()
    batch = 16
    result = SuiteResult("runtime", TITLE, opts.quick, opts.command,
                         config={"model": dataclasses.asdict(config),
                                 "batch": [batch, config.block_size],
                                 "threads": THREADS, "steps_per_turn": steps,
                                 "rounds": rounds})
    tokens, _ = split_tokens(encode(load_corpus("")), 0.1, config.block_size)
    loader = BatchLoader(tokens, config.block_size, batch, seed=1337)
    arms = []
    for label, name in (("bare torch.optim.AdamW", None), ("asteria.optimizer(model, 'adamw')",
                                                            "adamw"),
                        ("asteria.optimizer(model, 'soap'), refresh on 1 worker", "soap")):
        torch.manual_seed(1337)
        arms.append(Arm(label, name, GPT(config), 3e-3))
    warm = [loader.next_batch() for _ in range(3)]
    for arm in arms:  # allocator and caches settle; not counted
        arm.turn(warm)
    pair, soap = arms[:2], arms[2]
    with progress(2 * rounds, "AdamW arms, interleaved", opts) as bar:
        for r in range(rounds):
            batches = [loader.next_batch() for _ in range(steps)]
            for arm in (pair if r % 2 == 0 else pair[::-1]):
                arm.turn(batches)
                bar.update()
    with progress(rounds, "SOAP arm", opts) as bar:
        for _ in range(rounds):
            soap.turn([loader.next_batch() for _ in range(steps)])
            bar.update()
    result.runs = [arm.summary(len(warm)) for arm in arms]
    result.config["params"] = sum(p.numel() for p in arms[0].model.parameters())
    result.save(opts.out_dir)
    return result
