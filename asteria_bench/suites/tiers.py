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
    dds: list[dict] = []
    try:
        for r in range(sizes.repeats):
            dds.append(dd_rate(root, sizes.dd_mib))
            result.runs.append({"kind": "dd", "repeat": r, **dds[-1]})
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
    summarize(result, runs, dds, sizes, opts)
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


def summarize(result: SuiteResult, runs: dict[str, list[dict]], dds: list[dict], sizes: Sizes,
              opts: BenchOptions) -> None:
    mib = 2**20
    state_bytes = runs["memory"][0]["state_bytes"]
    rss = {m: med(r["peak_rss_bytes"] for r in rs) for m, rs in runs.items()}
    share = {m: rss[m] - rss["base"] for m in runs if m != "base"}
    if share["memory"] <= 0:  # the state is lost in the RSS noise: no share to compare
        raise RuntimeError(f"tiers: all-in-memory SOAP's peak RSS ({rss['memory']} B) is not "
                           f"above the base process's ({rss['base']} B); the state "
                           f"({state_bytes} B) is too small to measure: use more or larger "
                           "layers")
    step = {m: med(r["step_seconds"] for r in rs) for m, rs in runs.items()}
    step_ratio = {m: med(t["step_seconds"] / b["step_seconds"]
                         for t, b in zip(rs, runs["memory"], strict=True))
                  for m, rs in runs.items() if m != "base"}
    cuda = opts.device == "cuda"
    result.config["state_bytes"] = state_bytes
    columns = ["placement", "in memory (device / host MiB)", "on disk MiB", "peak RSS MiB",
               "state share of RSS MiB", "share / all in memory", "step s (median)",
               "step / all in memory", "prefetch hit ratio"]
    if cuda:
        columns.insert(4, "device peak MiB")
    t = result.table(f"Peak memory and step time per budget (SOAP state "
                     f"{state_bytes / mib:.0f} MiB, {sizes.layers} layers "
                     f"{sizes.rows}x{sizes.cols}; medians of {sizes.repeats} repeats)", columns,
                     note="state share = the placement's peak RSS - the base process's "
                          "(forward and backward only)")
    for name, rs in runs.items():
        first = rs[0]
        tiers = first.get("tier_bytes") or {"device": state_bytes if name == "memory" else 0,
                                            "host": 0, "disk": 0}
        hit = med(r["prefetch_hit_ratio"] for r in rs) if first.get("tier_bytes") else None
        row = [name, f"{tiers['device'] / mib:.0f} / {tiers['host'] / mib:.0f}",
               round(tiers["disk"] / mib, 1), round(rss[name] / mib, 1),
               round(share[name] / mib, 1) if name in share else None,
               round(share[name] / share["memory"], 3) if name in share else None,
               round(step[name], 4), round(step_ratio[name], 3) if name in step_ratio else None,
               round(hit, 4) if hit is not None else None]
        if cuda:
            row.insert(4, round(med(r["device_peak_bytes"] for r in rs) / mib, 1))
        t.add(*row)

    # Disk bandwidth of the original tiered budget (25% in memory), against dd.
    tiered = runs["tiered 25%"]
    dd_read, dd_write = med(d["read_bytes_per_second"] for d in dds), \
        med(d["write_bytes_per_second"] for d in dds)
    bw = {
        "read": {
            "training": med(r["disk_read_bytes"] / r["disk_read_seconds"] for r in tiered),
            "alone": med(r["isolated_read_bytes_per_second"] for r in tiered),
            "same_dd": med(r["same_files_dd_read_bytes_per_second"] for r in tiered),
            "same_ratio": med(r["isolated_read_bytes_per_second"]
                              / r["same_files_dd_read_bytes_per_second"] for r in tiered),
            "dd": dd_read},
        "write": {
            "training": med(r["disk_write_bytes"] / r["disk_write_seconds"] for r in tiered),
            "alone": med(r["isolated_write_bytes_per_second"] for r in tiered),
            "same_dd": med(r["same_files_dd_write_bytes_per_second"] for r in tiered),
            "same_ratio": med(r["isolated_write_bytes_per_second"]
                              / r["same_files_dd_write_bytes_per_second"] for r in tiered),
            "dd": dd_write},
    }
    b = result.table(
        "Disk tier bandwidth against dd (O_DIRECT, same disk, same run; budget 25%)",
        ["direction", "dd MB/s", "tier during training MB/s", "/ dd", "tier alone MB/s",
         "/ dd", "dd on the same files MB/s", "tier alone / dd, same files"],
        note=f"dd file {sizes.dd_mib} MiB; O_DIRECT {tiered[0]['o_direct']}; during training "
             "the prefetch reads and the write-backs overlap and share the disk")
    for direction, v in bw.items():
        b.add(direction, round(v["dd"] / 1e6, 1), round(v["training"] / 1e6, 1),
              round(v["training"] / v["dd"], 3), round(v["alone"] / 1e6, 1),
              round(v["alone"] / v["dd"], 3), round(v["same_dd"] / 1e6, 1),
              round(v["same_ratio"], 3))

    ratio = share["tiered 25%"] / share["memory"]
    result.quote("state_rss_ratio", round(ratio, 3),
                 "tiered SOAP (25% of its state in memory, the rest on disk) keeps "
                 "{value:.2f}x of all-in-memory SOAP's optimizer-state RSS")
    result.quote("step_time_ratio", round(step_ratio["tiered 25%"], 3),
                 "at {value:.2f}x all-in-memory SOAP's step time")
    result.quote("read_bandwidth_ratio", round(bw["read"]["same_ratio"], 3),
                 "the disk tier reads at {value:.2f}x dd's bandwidth on the same files")
    for name in share:
        if name == "memory":
            continue
        result.findings.append(
            f"With {name.split()[-1]} of the SOAP state in memory (device + host budgets, the rest "
            f"on disk), the optimizer-state share of peak RSS is "
            f"{share[name] / mib:.0f} MiB against {share['memory'] / mib:.0f} MiB all in memory "
            f"({share[name] / share['memory']:.2f}x), at {step_ratio[name]:.2f}x the step time "
            f"(median over {sizes.repeats} interleaved repeats).")
    result.findings.append(
        f"During training the disk tier read at {bw['read']['training'] / 1e6:.0f} MB/s and "
        f"wrote at {bw['write']['training'] / 1e6:.0f} MB/s, {bw['read']['training'] / dd_read:.2f}"
        f"x and {bw['write']['training'] / dd_write:.2f}x dd's "
        f"{dd_read / 1e6:.0f} / {dd_write / 1e6:.0f} MB/s on the same disk; alone, on the very "
        f"files dd then read and wrote, it reached {bw['read']['same_ratio']:.2f}x (read) and "
        f"{bw['write']['same_ratio']:.2f}x (write) of dd.")
    lo, hi = min(d["read_bytes_per_second"] for d in dds), max(d["read_bytes_per_second"]
                                                               for d in dds)
    if len(dds) > 1:
        result.findings.append(
            f"dd's own read of its {sizes.dd_mib} MiB file ranged {lo / 1e6:.0f} to "
            f"{hi / 1e6:.0f} MB/s between repeats, hence the same-files comparison.")
    plot(result, runs, rss, share, step, opts)


def plot(result: SuiteResult, runs: dict, rss: dict, share: dict, step: dict,
         opts: BenchOptions) -> None:
    plt = pyplot()

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
