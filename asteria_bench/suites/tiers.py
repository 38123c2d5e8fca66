"""`tiers`: peak RSS and device memory per budget, disk-tier bandwidth against `dd` on the same
files.

A stack of linear layers (full: 28 x 4096x1024, SOAP state 0.94 GiB) is trained a few steps in
separate subprocesses (`asteria_bench.suites.tiers_worker`), one per placement, so each
process's peak RSS (VmHWM) is that placement's alone. Each repeat runs every placement once, in
turn, so load drift on a shared machine falls on all of them alike:
  base        : the model, forward and backward only (no optimizer state): the RSS floor;
  memory      : SOAP with all state in memory (offload_mode none);
  tiered X%   : SOAP with device + host budgets of X% of its state (offload_mode auto), the rest
                on disk with O_DIRECT.
Figures (medians over repeats): peak RSS of each process, the optimizer-state share of RSS
(placement - base) over all-in-memory's, the device's peak allocation on CUDA, the median step
time over all-in-memory's; the disk tier's read and write bandwidth (bytes over the time inside
its read/write calls) against `dd` with O_DIRECT on the same disk in the same run, three ways:
during training (reads and writes overlap and share the disk) against a dd file of its own;
the tier's own path alone on files of the run's sizes against that dd; and against dd on those
very files right after (same sizes, same cache state: on a VM whose host caches the disk, dd's
read of the file it has just written is not the disk's speed).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult
from asteria_bench.suites.tiers_worker import dd

TITLE = "Tiered optimizer state: memory per budget, disk bandwidth against dd"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sizes:
    layers: int
    rows: int
    cols: int
    block: int
    batch: int
    steps: int
    threads: int
    refresh: int
    repeats: int
    dd_mib: int  # the dd file of the in-training comparison


FULL = Sizes(layers=28, rows=4096, cols=1024, block=64, batch=16, steps=6, threads=2, refresh=3,
             repeats=3, dd_mib=1024)
QUICK = Sizes(layers=24, rows=1024, cols=512, block=64, batch=16, steps=4, threads=2, refresh=3,
              repeats=2, dd_mib=256)
# (name, device share, host share) of the SOAP state; the rest is on disk. "memory" is all in
# memory. Below ~25% in memory the staging buffers hold about one parameter and the step waits
# on the disk for each one (measured: 36x the step at 10% on the quick stack).
BUDGETS = (("memory", None, None), ("tiered 50%", 0.25, 0.25), ("tiered 25%", 0.10, 0.15))
DISK_DIR: str | None = None  # where the disk tier and dd's files go (default: the temp dir)


def run(opts: BenchOptions) -> SuiteResult:
    sizes = opts.pick(QUICK, FULL)
    result = SuiteResult("tiers", TITLE, opts.quick, opts.command,
                         config={**asdict(sizes), "budgets": [list(b) for b in BUDGETS],
                                 "device": opts.device, "optimizer": "soap",
                                 "malloc_mmap_threshold": 1 << 20})
    root = Path(tempfile.mkdtemp(prefix="asteria-bench-tiers-", dir=DISK_DIR))
    placements = [("base", None, None), *BUDGETS]
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in placements}
    try:
        for r in range(sizes.repeats):
            result.runs.append({"kind": "dd", "repeat": r, **dd_rate(root, sizes.dd_mib)})
            for name, dev, host in placements:
                folder = root / f"{name.replace(' ', '-').replace('%', '')}-{r}"
                folder.mkdir(parents=True)
                out = run_worker(name, dev, host, sizes, folder, opts)
                shutil.rmtree(folder, ignore_errors=True)
                runs[name].append(out)
                result.runs.append({"kind": "placement", "placement": name, "repeat": r, **out})
                result.save(opts.out_dir)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result.config["state_bytes"] = runs["memory"][0]["state_bytes"]
    found = figures(runs)
    if found.share["memory"] <= 0:  # the state is lost in the RSS noise: no share to compare
        raise RuntimeError(f"tiers: all-in-memory SOAP's peak RSS ({found.rss['memory']} B) is "
                           f"not above the base process's ({found.rss['base']} B); the state "
                           f"({result.config['state_bytes']} B) is too small to measure: use "
                           "more or larger layers")
    plot(result, runs, found, opts)
    result.save(opts.out_dir)
    return result


def dd_rate(folder: Path, mib: int) -> dict[str, float]:
    """Raw sequential bandwidth (bytes/s) of `folder`'s disk, bypassing the page cache."""
    path = folder / "dd.bin"
    w = dd(["if=/dev/zero", f"of={path}", "bs=4M", f"count={max(1, mib // 4)}", "oflag=direct"])
    r = dd([f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"])
    path.unlink()
    return {"write_bytes_per_second": w[0] / w[1], "read_bytes_per_second": r[0] / r[1]}


def run_worker(name: str, dev: float | None, host: float | None, sizes: Sizes, folder: Path,
               opts: BenchOptions) -> dict:
    mode = "base" if name == "base" else "memory" if dev is None else "tiered"
    cmd = [sys.executable, "-m", "asteria_bench.suites.tiers_worker", "--mode", mode,
           "--dir", str(folder), "--device", opts.device,
           "--device-frac", str(dev or 0.0), "--host-frac", str(host or 0.0)]
    for k in ("layers", "rows", "cols", "block", "batch", "steps", "threads", "refresh"):
        cmd += [f"--{k}", str(getattr(sizes, k))]
    # A fixed mmap threshold returns freed tensors to the OS in every mode alike; glibc's
    # dynamic threshold would keep freed step temporaries in the heap and blur peak RSS.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    with progress(1, f"tiers: {name}", opts) as bar:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        bar.update(1)
    if proc.returncode:
        raise RuntimeError(f"tiers worker {name} failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def med(values) -> float:
    return statistics.median(list(values))


def by_placement(rows: list[dict]) -> dict[str, list[dict]]:
    """The placements' runs, repeats in order, from the suite's runs (dd's left out)."""
    runs: dict[str, list[dict]] = {}
    for r in rows:
        if r["kind"] == "placement":
            runs.setdefault(r["placement"], []).append(r)
    return runs


@dataclass
class Figures:
    rss: dict[str, float]
    """Peak RSS per placement (median over repeats)."""
    share: dict[str, float]
    """The optimizer state's share of it: the placement's peak RSS minus the base process's."""
    step: dict[str, float]
    step_ratio: dict[str, float]
    """Step time over all-in-memory SOAP's, repeat by repeat (median)."""


def figures(runs: dict[str, list[dict]]) -> Figures:
    rss = {m: med(r["peak_rss_bytes"] for r in rs) for m, rs in runs.items()}
    return Figures(
        rss, {m: rss[m] - rss["base"] for m in runs if m != "base"},
        {m: med(r["step_seconds"] for r in rs) for m, rs in runs.items()},
        {m: med(t["step_seconds"] / b["step_seconds"] for t, b in zip(rs, runs["memory"],
                                                                      strict=True))
         for m, rs in runs.items() if m != "base"})


def plot(result: SuiteResult, runs: dict, found: Figures, opts: BenchOptions) -> None:
    plt = pyplot()
    rss, share, step = found.rss, found.share, found.step

    mib = 2**20
    names = [n for n in runs if n != "base"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    floor = rss["base"] / mib
    ax1.bar(names, [floor] * len(names), color="#bbbbbb", label="model, forward, backward")
    ax1.bar(names, [share[n] / mib for n in names], bottom=[floor] * len(names),
            color="#3b75af", label="optimizer state")
    ax1.set_ylabel("peak RSS (MiB)")
    ax1.set_title("peak RSS per budget")
    ax1.legend(fontsize=8, loc="lower right")
    for i, n in enumerate(names):
        ax2.scatter([i] * len(runs[n]), [r["step_seconds"] for r in runs[n]], color="#3b75af",
                    s=14, alpha=0.6)
        ax2.hlines(step[n], i - 0.3, i + 0.3, color="black")
    ax2.set_xticks(range(len(names)), names)
    ax2.set_ylabel("step time (s): repeats, median")
    ax2.set_ylim(bottom=0)
    ax2.set_title("step time per budget")
    fig.tight_layout()
    result.plots.append(save(fig, opts.out_dir / "tiers.png", "Peak RSS split into the base "
        "process's floor and the optimizer state's share, and step time, per "
        "budget (all in memory, then device + host budgets as a share of the "
        "SOAP state, the rest on disk).", dpi=120))
