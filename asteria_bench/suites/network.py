"""`network`: the data-parallel exchange where it takes real time: a loopback shaped by tc.

The distributed suite's ranks talk over this machine's loopback, where bytes cost almost
nothing. Here every job runs inside a network namespace of its own (created and removed by the
suite; it needs root, `ip` and `tc`) whose loopback is rate-limited by a token bucket (`tbf`;
this kernel has no netem): all of the job's traffic, DDP's gradient all-reduce included, shares
that rate (both directions, one device). Configurations, 2 ranks: Asteria SOAP S in {1, 3, 5},
its synchronous exchange, its sharded mode, and Distributed Shampoo (fp32) when importable (see
the distributed suite). Per rate: step time and sync_wait, so the bounded-staleness claim is
measured where a basis takes time to arrive. --quick runs one rate and fewer configurations.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass

from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult
from asteria_bench.suites import distributed
from asteria_bench.suites.distributed import DS_FP32, SHARDED, SHARDED_ARGS, SYNC

TITLE = "Data-parallel SOAP on a rate-limited network (tc tbf in a namespace)"


@dataclass(frozen=True)
class Sizes:
    steps: int
    interval: int
    rates: tuple[str, ...]  # tc rates
    quick_configs: bool
    eval_at: tuple[int, ...] = ()
    seeds: int = 1
    n_layer: int = 2
    n_embd: int = 128
    block_size: int = 64


FULL = Sizes(steps=100, interval=10, rates=("100mbit", "1gbit", "10gbit"), quick_configs=False)
QUICK = Sizes(steps=30, interval=10, rates=("1gbit",), quick_configs=True)
# (label, short label, rank arguments, in the quick set)
CONFIGS = [
    ("Asteria SOAP S=1", "S=1", distributed.bound(1), False),
    ("Asteria SOAP S=3", "S=3", distributed.bound(3), False),
    ("Asteria SOAP S=5", "S=5", distributed.bound(5), True),
    (SYNC, "sync", distributed.SYNC_ARGS, True),
    (SHARDED, "sharded", SHARDED_ARGS, False),
    (DS_FP32, "DS fp32", [*distributed.DS_ARGS, "fp32"], False),
]


def can_shape() -> str | None:
    """None when this process can make namespaces and shape them; else why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    return f"needs {' and '.join(missing)} (iproute2)" if missing else None


@contextlib.contextmanager
def shaped_loopback(rate: str) -> Iterator[tuple[str, ...]]:
    """A namespace whose loopback is up and limited to `rate` (tbf); yields the command prefix
    that runs a process inside it. Removed on the way out, whatever happened."""
    name = f"asteria-bench-{os.getpid()}"
    run = ["ip", "netns", "exec", name]
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run([*run, "ip", "link", "set", "lo", "up"], check=True, capture_output=True)
        # burst: a few 64 KiB loopback packets; latency: how long a packet may queue
        subprocess.run([*run, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate,
                        "burst", "1mb", "latency", "200ms"], check=True, capture_output=True)
        yield tuple(run)
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def run(opts: BenchOptions) -> SuiteResult:
    sizes = opts.pick(QUICK, FULL)
    env = distributed.reference_env()
    chosen = [c for c in CONFIGS if (c[3] or not sizes.quick_configs)
              and (env is not None or "distributed_shampoo" not in c[2])]
    result = SuiteResult("network", TITLE, opts.quick, opts.command,
                         config={**asdict(sizes), "world": 2, "qdisc": "tbf burst 1mb "
                                 "latency 200ms on the namespace's lo",
                                 "configurations": [[c[0], c[2]] for c in chosen]})
    why_not = can_shape()
    if why_not:
        raise RuntimeError(f"the network suite {why_not}")
    rows = []
    with progress(len(sizes.rates) * len(chosen), "network: torchrun jobs", opts) as bar:
        for rate in sizes.rates:
            with shaped_loopback(rate) as prefix:
                for label, short, args, _ in chosen:
                    ranks = distributed.launch(2, sizes, args, 0, env, prefix)
                    row = {"rate": rate, "short": short,
                           **distributed.summary(label, 2, 0, ranks)}
                    rows.append(row)
                    result.runs.append(row)
                    result.save(opts.out_dir)
                    bar.update(1)
    plot(result, rows, sizes, opts)
    result.save(opts.out_dir)
    return result


def plot(result: SuiteResult, rows: list[dict], sizes: Sizes, opts: BenchOptions) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    labels = list(dict.fromkeys(r["short"] for r in rows))
    for short in labels:
        mine = [r for r in rows if r["short"] == short]
        xs = list(range(len(mine)))
        axes[0].plot(xs, [r["step_ms_mean"] for r in mine], marker="o", label=short)
        axes[1].plot(xs, [r["sync_wait_ms_per_step"] or 0.0 for r in mine], marker="o",
                     label=short)
    for ax, label in zip(axes, ("step mean (ms)", "sync_wait (ms/step)"), strict=True):
        ax.set_xticks(range(len(sizes.rates)), sizes.rates)
        ax.set_xlabel("loopback rate (tc tbf)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    result.plots.append(save(fig, opts.out_dir / "network.png", "Mean step time and time "
        "waiting for other ranks' bases per step, 2 ranks, against the loopback's rate.",
        dpi=120))
