"""`scale-memory`: the paper's memory headline on the machine it runs on: a model whose
all-in-memory SOAP state does not fit a memory cap trains under it with tiered state. A suite of
its own beside `scale` (the ladder): at 1B parameters it runs for tens of minutes.

The suite creates a cgroup v1 memory cgroup with the cap (root only), and runs two children in
it, each a fresh process:
  memory : `asteria train` with SOAP's state all in memory: refused before step 1, exit 2, with
           the shortfall named (the up-front check counts the state, the refresh work in flight,
           parameters and gradients against the cgroup's limit), not killed by the cap;
  tiered : the same run with a device budget of one working set, a host budget of two staging
           buffers and the rest on disk, trained `steps` steps by this module's worker
           (`python -m asteria_bench.suites.scale_memory ARGS`), which reports its peak RSS,
           bytes on disk, and where each step's time goes.
Refreshes run inline (workers = 0): a disk-homed block's result goes to a file of the disk tier
while it waits d steps for its swap, so one block's refresh work is in memory at a time.
`tiered_matches_memory` trains a smaller model both ways (no cap) and compares the losses bit
for bit.

Full: 20 x 2048 (1.0B parameters, byte vocabulary), 1 x 128 tokens, under a 16 GiB cap. Quick:
3 x 768 under 880 MiB for 6 steps, in about a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult

TITLE = "Scale: the memory headline, a 1B-parameter GPT under a memory cap"

ROOT = Path(__file__).resolve().parents[2]
V1 = Path("/sys/fs/cgroup/memory")
GiB, MiB = 1 << 30, 1 << 20
REFUSED = 2  # the CLI's exit status for a config error


@dataclass(frozen=True)
class Size:
    n_layer: int
    n_embd: int
    n_head: int
    seq: int
    batch: int
    precond_block: int
    steps: int
    cap_bytes: int = 0

    @property
    def name(self) -> str:
        return f"{self.n_layer} x {self.n_embd}"

    def args(self) -> list[str]:
        return ["--model.n_layer", str(self.n_layer), "--model.n_embd", str(self.n_embd),
                "--model.n_head", str(self.n_head), "--model.block_size", str(self.seq),
                "--data.batch_size", str(self.batch), "--optim.name", "soap",
                "--optim.precond_block_size", str(self.precond_block),
                "--train.steps", str(self.steps), "--train.device", "cpu",
                "--train.eval_interval", "100000", "--train.eval_batches", "1",
                "--policy.workers", "0"]


# The cap: above the config's own bound for the model (weights, gradients, two moments and
# activations in memory: 15.2 GiB at 1B, checked against the cgroup's limit before anything
# runs), below what SOAP's state needs in memory (13.5 GB of state, 8 GB of parameters and
# gradients, and its refresh work in flight).
FULL = Size(20, 2048, 16, 128, 1, 1024, 10, cap_bytes=16 * GiB)
QUICK = Size(3, 768, 12, 32, 2, 1024, 6, cap_bytes=880 * MiB)
"""880 MiB: the tiered run peaks at about 715 MiB RSS; its first step swaps every block's first
basis in and writes the whole state back at once, whose page cache the cgroup charges too (at
800 MiB that burst was killed). All in memory still needs more than the cap."""
MATCH_FULL = Size(12, 768, 12, 128, 1, 1024, 5)
MATCH_QUICK = Size(2, 128, 4, 32, 2, 64, 5)
MATCH_DELAY = ["--policy.swap_delay", "2", "--policy.refresh_interval", "2"]
"""A round every 2 steps, swapped 2 later: the first bases are swapped at once, the rounds of
steps 3 and 5 wait in the disk tier's files (the match covers staged results)."""


def match_threads() -> int:
    """The threads both match children compute with, named on both command lines: this
    process's CPUs. MKL's products and eigendecompositions round differently with another
    thread count (at 12 x 768, step 5's loss is 5.1991448 with 2 threads, 5.2016392 with 1),
    so the two runs must not differ in it, whatever thread default each would pick."""
    return len(os.sched_getaffinity(0))


# ------------------------------------------------------------------ the cgroup
def cgroup_missing() -> str | None:
    """Why no memory cgroup can be made here, or None."""
    if os.geteuid() != 0:
        return "not root: cannot create a memory cgroup"
    if not (V1 / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory controller at {V1}"
    return None


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int, name: str = "asteria") -> Iterator[Path]:
    """A cgroup v1 memory cgroup capped at `limit_bytes`, removed after (root only). Start
    children in it with `preexec_fn=joiner(folder)`."""
    why = cgroup_missing()
    if why is not None:
        raise RuntimeError(why)
    folder = V1 / f"{name}-{os.getpid()}"
    folder.mkdir()
    try:
        (folder / "memory.limit_in_bytes").write_text(str(limit_bytes))
        yield folder
    finally:
        for pid in (folder / "cgroup.procs").read_text().split():
            (V1 / "cgroup.procs").write_text(pid)  # none should be left; never block rmdir
        folder.rmdir()


def joiner(folder: Path):
    """A preexec_fn: the child joins `folder`'s cgroup before it runs anything."""
    def join() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))
    return join


def cgroup_peak(folder: Path) -> int:
    """The cgroup's peak charge so far (RSS and page cache of everything in it)."""
    return int((folder / "memory.max_usage_in_bytes").read_text())


# ------------------------------------------------------------------ the plan of a size
def plan_bytes(size: Size) -> dict[str, int]:
    """Parameters, SOAP state and working set W (the largest parameter's state) of `size`,
    from a model on the meta device (no memory, seconds at 1B)."""
    return state_plan(size.args())


def state_plan(args: list[str]) -> dict[str, int]:
    """plan_bytes of the run that config overrides `args` describe."""
    import torch

    from asteria_core.cli import resolve_config
    from asteria_core.policy import Policy
    from asteria_core.tiers.lifecycle import Entry, classify, leaves
    from asteria_core.tiers.placement import working_set
    from asteria_core.train.model import GPT
    from asteria_core.train.optimizers import optimizer_from_config

    config = resolve_config(None, args)
    with torch.device("meta"):
        model = GPT(config.model)
    optimizer = optimizer_from_config(config.optim, model, Policy())
    entries = [Entry(i, path, tuple(t.shape), t.dtype, classify(path))
               for i in range(len(list(model.parameters())))
               for path, t in leaves(optimizer.state_spec(i))]
    params = sum(p.numel() for p in model.parameters())
    return {"params": params, "param_bytes": 4 * params,
            "state_bytes": sum(e.nbytes for e in entries), "working_set": working_set(entries)}


def tier_args(plan: dict[str, int], disk_dir: Path) -> list[str]:
    """Device budget one working set, host budget two staging buffers, the rest on disk."""
    w = plan["working_set"]
    return ["--policy.offload_mode", "disk", "--policy.device_budget_bytes", str(w),
            "--policy.host_budget_bytes", str(2 * w), "--policy.disk_dir", str(disk_dir)]


# ------------------------------------------------------------------ the children
def refused_run(size: Size, folder: Path, out: Path, timeout: float) -> dict[str, Any]:
    """`asteria train` with all state in memory, in the cgroup: its exit status and message."""
    proc = subprocess.run([sys.executable, "-m", "asteria_core.cli", "train", *size.args(),
                           "--train.out_dir", str(out)], cwd=ROOT, preexec_fn=joiner(folder),
                          capture_output=True, text=True, timeout=timeout)
    message = next((line.split("config error: ", 1)[1] for line in proc.stderr.splitlines()
                    if "config error: " in line), None)
    return {"returncode": proc.returncode, "refused": proc.returncode == REFUSED,
            "message": message, "stderr_tail": None if message else proc.stderr[-2000:]}


def worker_run(size: Size, extra: list[str], out: Path, timeout: float,
               folder: Path | None = None) -> dict[str, Any]:
    """This module's worker trains `size` (in `folder`'s cgroup, if given): its figures."""
    proc = subprocess.run([sys.executable, "-m", "asteria_bench.suites.scale_memory",
                           *size.args(), "--train.out_dir", str(out), *extra], cwd=ROOT,
                          preexec_fn=joiner(folder) if folder else None, capture_output=True,
                          text=True, timeout=timeout)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or not lines:
        return {"returncode": proc.returncode, "steps": 0, "stderr_tail": proc.stderr[-2000:]}
    return {"returncode": 0, **json.loads(lines[-1])}


# ------------------------------------------------------------------ the row
def memory_headline(opts: BenchOptions) -> dict[str, Any]:
    """All-in-memory SOAP refused under the cap (shortfall named); tiered trains under it."""
    size = opts.pick(QUICK, FULL)
    plan = plan_bytes(size)
    timeout = 600 if opts.quick else 3600
    root = Path(tempfile.mkdtemp(prefix="asteria-bench-memory-"))
    try:
        with memory_cgroup(size.cap_bytes, "asteria-bench-memory") as folder, \
                progress(2, f"scale memory: {size.name}", opts) as bar:
            memory = refused_run(size, folder, root / "memory", timeout)
            bar.update(1)
            # A round every 5 steps: the first bases are swapped in at once, the round of
            # step 6 waits in the disk tier's files for its swap, as every later one would.
            tiered = worker_run(size, [*tier_args(plan, root / "disk"),
                                       "--policy.refresh_interval", "5"], root / "tiered",
                                timeout, folder)
            tiered["cgroup_peak_bytes"] = cgroup_peak(folder)
            bar.update(1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"size": asdict(size), "model": size.name, **plan, "cap_bytes": size.cap_bytes,
            "memory": memory, "tiered": tiered,
            "trained_under_cap": tiered["returncode"] == 0 and tiered["steps"] >= size.steps}


def tiered_matches_memory(opts: BenchOptions) -> dict[str, Any]:
    """The same run with tiered and with all-in-memory state (no cap): the losses, bit for bit."""
    size = opts.pick(MATCH_QUICK, MATCH_FULL)
    plan = plan_bytes(size)
    root = Path(tempfile.mkdtemp(prefix="asteria-bench-match-"))
    same = [*MATCH_DELAY, "--train.threads", str(match_threads())]
    try:
        with progress(2, f"scale memory: tiered = in memory, {size.name}", opts) as bar:
            memory = worker_run(size, same, root / "memory", 1800)
            bar.update(1)
            tiered = worker_run(size, [*same, *tier_args(plan, root / "disk")],
                                root / "tiered", 1800)
            bar.update(1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"model": size.name, "params": plan["params"], "steps": size.steps,
            "memory_losses": memory.get("losses"), "tiered_losses": tiered.get("losses"),
            "tiered_disk_bytes": tiered.get("disk_bytes"),
            "tiered_results_staged": tiered.get("results_staged"),
            "memory_threads": memory.get("threads"), "tiered_threads": tiered.get("threads"),
            "equal": memory.get("losses") is not None and
            memory.get("losses") == tiered.get("losses")}


def run(opts: BenchOptions) -> SuiteResult:
    size, match_size = opts.pick(QUICK, FULL), opts.pick(MATCH_QUICK, MATCH_FULL)
    result = SuiteResult("scale-memory", TITLE, opts.quick, opts.command,
                         config={"size": asdict(size), "match_size": asdict(match_size)})
    match = tiered_matches_memory(opts)
    result.config["tiered_match"] = match
    result.runs = [{"run": "bit-for-bit match", **match}]
    result.save(opts.out_dir)
    why = cgroup_missing()
    if why is not None:  # the cap needs root: say so, and keep what could be measured
        result.config["memory_headline_missing"] = why
        result.save(opts.out_dir)
        return result
    row = memory_headline(opts)
    result.config["memory_headline"] = row
    result.runs += [{"run": "all in memory", **row["memory"]}, {"run": "tiered", **row["tiered"]}]
    result.plots.append(plot(row, opts.out_dir / "scale-memory.png"))
    result.save(opts.out_dir)
    return result


def plot(row: dict[str, Any], path: Path) -> dict[str, str]:
    """The tiered run's step times, and its memory against the cap."""
    plt = pyplot()
    tiered = row["tiered"]
    fig, (steps, memory) = plt.subplots(1, 2, figsize=(11, 4))
    times = tiered.get("step_seconds") or []
    steps.bar(range(1, len(times) + 1), times)
    steps.set_xlabel("step")
    steps.set_ylabel("seconds")
    steps.set_title("tiered SOAP: step time")
    bars = {"SOAP state\n(all in memory)": row["state_bytes"],
            "parameters +\ngradients": 2 * row["param_bytes"],
            "tiered:\npeak RSS": tiered.get("peak_rss_bytes") or 0,
            "tiered:\non disk": tiered.get("disk_bytes") or 0}
    memory.bar(list(bars), [v / GiB for v in bars.values()])
    memory.axhline(row["cap_bytes"] / GiB, color="red", linestyle="--",
                   label=f"cap {row['cap_bytes'] / GiB:.1f} GiB")
    memory.set_ylabel("GiB")
    memory.set_title(f"{row['model']}: memory against the cap")
    memory.legend(fontsize=8)
    fig.tight_layout()
    return save(fig, path, "the tiered run's step times, and its memory against the cgroup's cap")


# ------------------------------------------------------------------ the worker
def _train(argv: list[str]) -> dict[str, Any]:
    """Train the config `argv` describes (CLI overrides) for its steps; no checkpoint."""
    import time

    import torch

    from asteria_bench.clocks import peak_rss_bytes
    from asteria_core.cli import resolve_config
    from asteria_core.train.trainer import Trainer

    config = resolve_config(None, argv)
    t0 = time.perf_counter()
    trainer = Trainer(config, jsonl=False)
    build = time.perf_counter() - t0
    rt, records = trainer.runtime, []
    try:
        for _ in range(config.train.steps):
            trainer.train_step()
            records.append(rt.end_step())
        tiers, refresh = rt.tiers, rt.refresh
        disk = tiers.disk
        out = {"steps": len(records), "build_seconds": build,
               "threads": torch.get_num_threads(),
               "losses": [r.loss for r in records],
               "step_seconds": [r.step_seconds for r in records],
               "peak_rss_bytes": peak_rss_bytes(),
               "planned_memory_bytes": tiers.memory_bytes(),
               "refresh_in_flight_bytes": tiers.refresh_bytes(),
               "disk_bytes": tiers.tier_bytes()["disk"],
               "disk_read_bytes": disk.bytes_read if disk else 0,
               "disk_write_bytes": disk.bytes_written if disk else 0,
               "disk_read_seconds": disk.read_seconds if disk else 0.0,
               "disk_write_seconds": disk.write_seconds if disk else 0.0,
               "results_staged": tiers.results.staged if tiers.results else 0,
               "refresh_seconds": refresh.computed_seconds + refresh.waited_seconds}
    finally:
        trainer.close()
    out["step_seconds_median"] = statistics.median(out["step_seconds"])
    idle = [r.timing.idle_seconds if r.timing else {} for r in records]
    compute = [sum(r.timing.compute_seconds.values()) if r.timing else r.step_seconds
               for r in records]
    n = len(records)
    out["seconds_per_step"] = {
        "step": sum(out["step_seconds"]) / n,
        "compute": sum(compute) / n,
        "transfer_wait": sum(i.get("transfer_wait", 0.0) for i in idle) / n,
        "refresh": out["refresh_seconds"] / n,
        "disk_read": out["disk_read_seconds"] / n, "disk_write": out["disk_write_seconds"] / n}
    return out


if __name__ == "__main__":
    print(json.dumps(_train(sys.argv[1:])))
