"""What the runtime costs a training loop: its own CPU per step, against the step.

    python benchmarks/bench_runtime.py                 # default GPT (~1M), 3 rounds
    python benchmarks/bench_runtime.py --steps 20 --rounds 1 --quick

Three arms train the same model (same init, same batches) in one process:

- bare AdamW: `torch.optim.AdamW` in a plain loop, no runtime;
- Asteria AdamW: `asteria.optimizer(model, "adamw")`, the runtime attached (hooks, boundary,
  telemetry, records);
- Asteria SOAP: `asteria.optimizer(model, "soap")`, refresh on one host worker (the default
  policy).

The two AdamW arms take interleaved turns of `--steps` steps, in ABBA order, so machine drift
falls on both alike; the SOAP arm trains after them (its refresh worker would otherwise run
beside the other arms' turns).

The runtime's own CPU is measured directly: `time.thread_time()` of the training thread inside
every runtime entry point (forward hooks, optimizer step pre/post hooks with the step boundary,
record completion), outermost call only. It is reported per step and as a share of the arm's
median step time. For AdamW the step times of the bare and the attached arm are also compared
side by side. Writes benchmarks/results/runtime.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import asteria_core as asteria  # noqa: E402
from asteria_core.runtime import Runtime, decay_groups  # noqa: E402
from asteria_core.telemetry.records import StepRecord  # noqa: E402
from asteria_core.train.config import ModelConfig  # noqa: E402
from asteria_core.train.data import BatchLoader, encode, load_corpus, split_tokens  # noqa: E402
from asteria_core.train.model import GPT  # noqa: E402

ENTRY_POINTS = ("_before_forward", "_after_forward", "_before_optimizer", "_after_optimizer",
                "end_step")


class TimedRuntime(Runtime):
    """The real runtime, with the CPU of its entry points counted (outermost calls only)."""

    cpu_seconds = 0.0
    _depth = 0

    def _timed(name):  # noqa: N805 - builds the methods below
        def method(self, *args, **kwargs):
            if self._depth:
                return getattr(Runtime, name)(self, *args, **kwargs)
            self._depth += 1
            t0 = time.thread_time()
            try:
                return getattr(Runtime, name)(self, *args, **kwargs)
            finally:
                self.cpu_seconds += time.thread_time() - t0
                self._depth -= 1
        return method

    for _name in ENTRY_POINTS:
        locals()[_name] = _timed(_name)
    del _name, _timed


class Arm:
    def __init__(self, label: str, name: str | None, model: GPT, lr: float) -> None:
        self.label, self.model = label, model
        self.runtime: TimedRuntime | None = None
        if name is None:
            self.opt = torch.optim.AdamW(decay_groups(model, 0.0), lr=lr, betas=(0.9, 0.95))
        else:
            self.opt = asteria.build_optimizer(name, decay_groups(model, 0.0), lr=lr)
            self.runtime = TimedRuntime(self.opt, model=model, optimizer_name=name)
            self.records: list[StepRecord] = []
            self.runtime.add_listener(self.records.append)
        self.step_seconds: list[float] = []
        self.runtime_cpu: list[float] = []

    def turn(self, batches: list) -> None:
        for x, y in batches:
            before = self.runtime.cpu_seconds if self.runtime else 0.0
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
            refresh = [r.refresh for r in self.records if r.refresh is not None]
            if refresh:
                out["staleness_max"] = max(r.staleness_max for r in refresh)
                out["refresh_wait_ms_total"] = 1e3 * sum(
                    r.timing.idle_seconds["refresh_wait"] for r in self.records if r.timing)
            self.runtime.close()
        return out


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--steps", type=int, default=20, help="steps per turn")
    cli.add_argument("--rounds", type=int, default=6, help="turns per arm")
    cli.add_argument("--threads", type=int, default=2)
    cli.add_argument("--quick", action="store_true", help="a smaller model (a smoke run)")
    cli.add_argument("--out", default=str(ROOT / "benchmarks/results/runtime.json"))
    args = cli.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = ModelConfig(n_layer=2, n_embd=64, block_size=64) if args.quick else ModelConfig()
    batch = 4 if args.quick else 16
    tokens, _ = split_tokens(encode(load_corpus("")), 0.1, config.block_size)
    loader = BatchLoader(tokens, config.block_size, batch, seed=1337)
    arms = []
    for label, name in (("bare AdamW (torch.optim)", None), ("Asteria AdamW", "adamw"),
                        ("Asteria SOAP (refresh on 1 worker)", "soap")):
        torch.manual_seed(1337)
        arms.append(Arm(label, name, GPT(config), 3e-3))
    warm = [loader.next_batch() for _ in range(3)]
    for arm in arms:  # allocator and caches settle; not counted
        arm.turn(warm)
    skip = len(warm)
    started = time.perf_counter()
    pair, soap = arms[:2], arms[2]
    for r in range(args.rounds):
        batches = [loader.next_batch() for _ in range(args.steps)]
        for arm in (pair if r % 2 == 0 else pair[::-1]):
            arm.turn(batches)
        print(f"AdamW round {r + 1}/{args.rounds}: " + ", ".join(
            f"{a.label} {1e3 * statistics.median(a.step_seconds[-args.steps:]):.1f} ms"
            for a in pair), flush=True)
    for r in range(args.rounds):
        soap.turn([loader.next_batch() for _ in range(args.steps)])
        print(f"SOAP round {r + 1}/{args.rounds}: "
              f"{1e3 * statistics.median(soap.step_seconds[-args.steps:]):.1f} ms", flush=True)
    results = [arm.summary(skip) for arm in arms]
    bare, attached = results[0], results[1]
    report = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": torch.get_num_threads(), "torch": torch.__version__,
                    "python": platform.python_version()},
        "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                     text=True, cwd=ROOT).stdout.strip(),
        "model_params": sum(p.numel() for p in arms[0].model.parameters()),
        "batch": [batch, config.block_size], "steps_per_turn": args.steps,
        "rounds": args.rounds, "seconds": time.perf_counter() - started,
        "adamw_attached_over_bare_median": attached["step_ms_median"] / bare["step_ms_median"],
        "arms": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"\n{report['model_params'] / 1e6:.2f}M-parameter GPT, batch {batch}x"
          f"{config.block_size}, {args.threads} threads, {args.rounds} x {args.steps} steps "
          "per arm (AdamW arms interleaved)")
    print(f"{'arm':38} {'step p50 ms':>11} {'runtime CPU ms/step':>20} {'share':>7}")
    for r in results:
        cpu = r.get("runtime_cpu_ms_mean")
        share = r.get("runtime_share_of_step")
        print(f"{r['label']:38} {r['step_ms_median']:11.1f} "
              f"{'' if cpu is None else f'{cpu:.3f}':>20} "
              f"{'' if share is None else f'{100 * share:.2f}%':>7}")
    print(f"Asteria AdamW / bare AdamW step time (medians, same run): "
          f"{report['adamw_attached_over_bare_median']:.4f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
