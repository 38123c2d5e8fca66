"""`straggler`: a rank whose refreshes fall behind, with owners fixed and with rebalancing.

2 ranks on gloo, each pinned to a CPU of its own with its refresh worker
(`--train.split_cpus true`). A GPT
of width 256 (factor blocks up to 1024 wide) and S = 2, so that a round's refreshes take a real
share of the steps they must fit in. Two kinds of straggler on rank 1:

- its refreshes SLOWER x slower than measured (`ddp_rank --slower --slower-rank 1`,
  asteria_bench/slower_host.py: a slower host's CPU, emulated; its training is as fast as rank
  0's): the refresh throughput falls and nothing else, the case ownership can fix;
- a busy loop pinned to its CPU (full sizes only): its training and its worker both get a share
  of that CPU, so rank 0 waits for its gradients as much as for its bases.

Configurations: no straggler (the reference), each straggler with owners fixed (ownership by
cost alone, as without rebalancing) and with rebalancing (`RuntimeConfig(rebalance_rounds=2)`:
speeds shared every 2 refresh rounds, blocks moved off the slow rank). Each repeat runs every
configuration once, in turn; the tables give medians. The eval loss of all is the same:
ownership changes who computes a refresh, not its numbers. Needs at least 2 CPUs.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult
from asteria_bench.suites import distributed

TITLE = "A straggler rank: owners fixed against owners that move"


@dataclass(frozen=True)
class Sizes:
    steps: int
    interval: int
    repeats: int
    eval_at: tuple[int, ...] = ()
    n_layer: int = 2
    n_embd: int = 128
    block_size: int = 64


FULL = Sizes(steps=80, interval=10, repeats=3, n_embd=256)
QUICK = Sizes(steps=40, interval=5, repeats=1)
SLOWER = 4.0
"""How many times its measured time rank 1's refreshes take in the slowed configurations."""
NO_STRAGGLER = "no straggler"
BASE = [*distributed.bound(2), "--train.split_cpus", "true"]
SLOWED = [*BASE, "--slower", str(SLOWER), "--slower-rank", "1"]
MOVING = ["--runtime.rebalance_rounds", "2"]


@dataclass(frozen=True)
class Straggler:
    label: str
    short: str
    args: list[str]
    with_hog: bool


CONFIGS = [
    Straggler(NO_STRAGGLER, "none", BASE, False),
    Straggler(f"rank 1's refreshes {SLOWER:g}x slower, owners fixed", "slowed\nfixed", SLOWED,
              False),
    Straggler(f"rank 1's refreshes {SLOWER:g}x slower, rebalancing every 2 rounds",
              "slowed\nmoving", [*SLOWED, *MOVING], False),
    Straggler("busy loop on rank 1's CPU, owners fixed", "hog\nfixed", BASE, True),
    Straggler("busy loop on rank 1's CPU, rebalancing every 2 rounds", "hog\nmoving",
              [*BASE, *MOVING], True),
]
QUICK_CONFIGS = CONFIGS[:3]


@contextlib.contextmanager
def hog(cpu: int) -> Iterator[None]:
    """A busy loop pinned to `cpu` for the length of the block."""
    proc = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})"
                             "\nwhile True: pass"])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


def run(opts: BenchOptions) -> SuiteResult:
    sizes = opts.pick(QUICK, FULL)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError("the straggler suite needs 2 CPUs (one per rank)")
    configs = opts.pick(QUICK_CONFIGS, CONFIGS)
    result = SuiteResult("straggler", TITLE, opts.quick, opts.command,
                         config={**asdict(sizes), "world": 2, "hog_cpu": cpus[1],
                                 "slower": SLOWER, "configurations": [asdict(c) for c in configs]})
    per_config: list[list[dict]] = [[] for _ in configs]
    with progress(sizes.repeats * len(configs), "straggler: torchrun jobs", opts) as bar:
        for repeat in range(sizes.repeats):
            for i, c in enumerate(configs):
                with hog(cpus[1]) if c.with_hog else contextlib.nullcontext():
                    ranks = distributed.launch(2, sizes, c.args, 0, None)
                row = {"repeat": repeat, "short": c.short, "with_hog": c.with_hog,
                       "owned_first": [r["owned_blocks"][0] for r in ranks],
                       "owned_last": [r["owned_blocks"][-1] for r in ranks],
                       "blocks_moved": ranks[0]["blocks_moved"],
                       **distributed.summary(c.label, 2, 0, ranks)}
                per_config[i].append(row)
                result.runs.append(row)
                result.save(opts.out_dir)
                bar.update(1)
    rows = [merge(runs) for runs in per_config]
    plot(result, rows, opts)
    result.save(opts.out_dir)
    return result


def merge(runs: list[dict]) -> dict:
    row = {k: v for k, v in runs[-1].items() if k not in ("ranks", "repeat")}
    for key in ("step_ms", "step_ms_mean", "sync_wait_ms_per_step", "refresh_wait_ms_per_step"):
        row[key] = statistics.median(r[key] for r in runs)
        row[f"{key}_runs"] = [r[key] for r in runs]
    row["eval_loss_runs"] = [r["eval_loss"] for r in runs]
    return row


def plot(result: SuiteResult, rows: list[dict], opts: BenchOptions) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    names = [r["short"] for r in rows]
    axes[0].bar(names, [r["step_ms_mean"] for r in rows], color="#3b75af")
    axes[0].set_ylabel("step mean (ms)")
    axes[1].bar(names, [r["sync_wait_ms_per_step"] for r in rows], color="#d9822b")
    axes[1].set_ylabel("sync_wait (ms/step)")
    fig.tight_layout()
    result.plots.append(save(fig, opts.out_dir / "straggler.png", "Mean step time and time "
        "waiting for other ranks' bases per step: no straggler, each straggler with owners "
        "fixed and with rebalancing (2 ranks).", dpi=120))
