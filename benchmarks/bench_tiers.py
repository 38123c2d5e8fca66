"""Tiered optimizer state: peak RSS, step time and disk bandwidth against all-in-memory SOAP.

A stack of linear layers whose SOAP state (exp_avg, exp_avg_sq, factors, bases) is >= 1 GB is
trained a few steps in separate subprocesses, interleaved so load drift on a shared machine hits
every mode alike:
  base    : the model, forward and backward only (no optimizer state): the RSS floor;
  memory  : SOAP with all state in memory (offload_mode=none);
  tiered  : SOAP with device+host budgets of 25% of the state (10% device, 15% host,
            offload_mode=auto), the rest on disk in --dir.
Figures (medians over --repeats): peak RSS of each process (ru_maxrss), the optimizer-state
share of RSS (mode - base) and its tiered/memory ratio (target <= 0.5); median step time and
its tiered/memory ratio (target <= 1.3); the disk tier's read and write bandwidth (bytes over
time inside its read/write calls) against `dd` with O_DIRECT on the same directory in the same
run (target >= 0.7), three ways: during training (reads and writes overlap and share the disk)
against a 1 GiB dd file; the tier's own path alone on files of the run's sizes against the same
dd; and that against dd on those very files right after (same sizes, same cache state: on a VM
whose host caches the disk, dd's read of the file it has just written is not the disk's speed).
Writes benchmarks/results/tiers.json and prints a table.

    .venv/bin/python benchmarks/bench_tiers.py [--layers 28 --rows 4096 --cols 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "tiers.json"


def child(args) -> dict:
    import torch

    from asteria_core.optim import SOAP
    from asteria_core.policy import LivePolicy, Policy
    from asteria_core.tiers import TierStore
    from asteria_core.tiers.lifecycle import leaves

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.cols if i % 2 == 0 else args.rows,
                                                  args.rows if i % 2 == 0 else args.cols,
                                                  bias=False) for i in range(args.layers)])
    opt = SOAP(model.parameters(), lr=1e-3, block_size=args.block,
               precondition_frequency=args.refresh)
    state_total = sum(t.numel() * t.element_size() for i in range(args.layers)
                      for _, t in leaves(opt.state_spec(i)))
    store = None
    if args.child == "tiered":
        policy = Policy(offload_mode="auto", device_budget_bytes=int(0.10 * state_total),
                        host_budget_bytes=int(0.15 * state_total), disk_dir=args.dir)
        store = TierStore(opt, LivePolicy(policy), Path(args.dir))
    x = torch.randn(args.batch, args.cols)
    times = []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        if store is not None:
            store.announce()
        model(x).square().mean().backward()
        if args.child != "base":
            opt.step()
        opt.zero_grad(set_to_none=True)
        if store is not None:
            store.on_boundary(step + 1)
        if step:  # step 0 creates the state
            times.append(time.perf_counter() - t0)
    out = {"mode": args.child, "state_bytes": state_total,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "step_seconds": statistics.median(times), "step_times": times}
    if store is not None:
        disk = store.disk
        out.update(tier_bytes=store.tier_bytes(), staging_bytes=store.plan.slots
                   * store.plan.slot_bytes, prefetch_hit_ratio=store.hit_ratio(),
                   disk_read_bytes=disk.bytes_read, disk_read_seconds=disk.read_seconds,
                   disk_write_bytes=disk.bytes_written, disk_write_seconds=disk.write_seconds,
                   o_direct=disk.direct)
        store.close()
        sizes = [f.stat().st_size for f in Path(args.dir).glob("*.bin")]
        out.update(isolated_io(Path(args.dir) / "isolated", sizes))
    return out


def isolated_io(folder: Path, sizes: list[int]) -> dict:
    """The disk tier's own write and read path (header, checksums, O_DIRECT, rename) on files of
    the run's sizes, one at a time: what it gets from the disk without training's concurrent
    reads and writes sharing it."""
    import numpy as np

    from asteria_core.tiers.disk import ALIGN, DiskTier, aligned_buffer

    disk = DiskTier(folder)
    biggest = max(sizes) - ALIGN
    data = aligned_buffer(biggest)
    data[:] = np.random.default_rng(0).integers(0, 255, data.size, dtype=np.uint8)
    parts = [[("state", 0, (size - ALIGN) // ALIGN * ALIGN)] for size in sizes]
    for i, part in enumerate(parts):
        disk.write(f"f{i}", data, part)
    for i, part in enumerate(parts):
        disk.read(f"f{i}", data, part)
    disk.close()
    # dd on the same files (read) and on files of the same sizes (write), right after: the
    # same disk, file sizes and cache state, so the ratio is the tier's overhead alone.
    dd_read = dd_write = (0, 0.0)
    for i, size in enumerate(sizes):
        dd_read = _add(dd_read, _dd(["if=" + str(disk.path(f"f{i}")), "of=/dev/null", "bs=4M",
                                     "iflag=direct"]))
        dd_write = _add(dd_write, _dd(["if=/dev/zero", f"of={folder}/g{i}.bin", "bs=4M",
                                       f"count={max(1, size >> 22)}", "oflag=direct"]))
    return {"isolated_write_bytes_per_second": disk.bytes_written / disk.write_seconds,
            "isolated_read_bytes_per_second": disk.bytes_read / disk.read_seconds,
            "same_files_dd_read_bytes_per_second": dd_read[0] / dd_read[1],
            "same_files_dd_write_bytes_per_second": dd_write[0] / dd_write[1]}


def _dd(args: list[str]) -> tuple[int, float]:
    text = subprocess.run(["dd", *args], capture_output=True, text=True, check=True).stderr
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", text)
    return int(m.group(1)), float(m.group(2))


def _add(a: tuple[int, float], b: tuple[int, float]) -> tuple[int, float]:
    return a[0] + b[0], a[1] + b[1]


def dd(folder: Path, mib: int) -> dict[str, float]:
    """Raw sequential bandwidth (bytes/s) of `folder`'s disk, bypassing the page cache."""
    path = folder / "dd.bin"
    rate = {}
    for kind, cmd in (("write", ["dd", "if=/dev/zero", f"of={path}", "bs=4M",
                                 f"count={mib // 4}", "oflag=direct"]),
                      ("read", ["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"])):
        text = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", text)
        rate[kind] = int(m.group(1)) / float(m.group(2))
    path.unlink()
    return rate


def run_child(mode: str, args, folder: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--dir", str(folder)]
    for k in ("layers", "rows", "cols", "block", "batch", "steps", "threads", "refresh"):
        cmd += [f"--{k}", str(getattr(args, k))]
    # A fixed mmap threshold returns freed tensors to the OS in every mode alike; glibc's
    # dynamic threshold would keep freed step temporaries in the heap and blur peak RSS.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", default="")
    ap.add_argument("--dir", default="")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--refresh", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-tiers-", dir="/work"))
    root.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {"base": [], "memory": [], "tiered": []}
    dds = []
    for r in range(args.repeats):
        dds.append(dd(root, 1024))
        for mode in runs:
            folder = root / f"{mode}-{r}"
            folder.mkdir(parents=True, exist_ok=True)
            runs[mode].append(run_child(mode, args, folder))
            print(f"repeat {r} {mode}: {runs[mode][-1]['step_seconds']:.2f} s/step, "
                  f"peak RSS {runs[mode][-1]['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    print(json.dumps(summarize(runs, dds, args), indent=1))


def med(values) -> float:
    return statistics.median(values)


def summarize(runs: dict, dds: list, args) -> dict:
    rss = {m: med(r["peak_rss_bytes"] for r in rs) for m, rs in runs.items()}
    step = {m: med(r["step_seconds"] for r in rs) for m, rs in runs.items() if m != "base"}
    tiered = runs["tiered"]
    read_bw = med(r["disk_read_bytes"] / r["disk_read_seconds"] for r in tiered)
    write_bw = med(r["disk_write_bytes"] / r["disk_write_seconds"] for r in tiered)
    dd_read, dd_write = med(d["read"] for d in dds), med(d["write"] for d in dds)
    share = {m: rss[m] - rss["base"] for m in ("memory", "tiered")}
    result = {
        "config": {k: getattr(args, k) for k in ("layers", "rows", "cols", "block", "batch",
                                                 "steps", "threads", "repeats")},
        "state_bytes": runs["memory"][0]["state_bytes"],
        "peak_rss_bytes": rss, "state_rss_share_bytes": share,
        "state_rss_ratio": share["tiered"] / share["memory"],
        "step_seconds": step, "step_time_ratio": step["tiered"] / step["memory"],
        "step_time_ratio_per_repeat": [t["step_seconds"] / m["step_seconds"]
                                       for t, m in zip(tiered, runs["memory"], strict=True)],
        "disk_read_bytes_per_second": read_bw, "disk_write_bytes_per_second": write_bw,
        "dd_read_bytes_per_second": dd_read, "dd_write_bytes_per_second": dd_write,
        "read_bandwidth_ratio": read_bw / dd_read, "write_bandwidth_ratio": write_bw / dd_write,
        "isolated_read_bandwidth_ratio":
            med(r["isolated_read_bytes_per_second"] for r in tiered) / dd_read,
        "isolated_write_bandwidth_ratio":
            med(r["isolated_write_bytes_per_second"] for r in tiered) / dd_write,
        "same_files_read_bandwidth_ratio": med(r["isolated_read_bytes_per_second"]
                                               / r["same_files_dd_read_bytes_per_second"]
                                               for r in tiered),
        "same_files_write_bandwidth_ratio": med(r["isolated_write_bytes_per_second"]
                                                / r["same_files_dd_write_bytes_per_second"]
                                                for r in tiered),
        "prefetch_hit_ratio": med(r["prefetch_hit_ratio"] for r in tiered),
        "tier_bytes": tiered[0]["tier_bytes"], "staging_bytes": tiered[0]["staging_bytes"],
        "o_direct": tiered[0]["o_direct"], "runs": runs, "dd": dds,
        "targets": {"state_rss_ratio": "<= 0.5", "step_time_ratio": "<= 1.3",
                    "bandwidth_ratio": ">= 0.7"},
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    table(result)
    return {k: v for k, v in result.items() if k not in ("runs", "dd")}


def table(r: dict) -> None:
    gib = 2**30
    print(f"\nSOAP state {r['state_bytes'] / gib:.2f} GiB; tiers {r['tier_bytes']} "
          f"+ staging {r['staging_bytes'] / 2**20:.0f} MiB; O_DIRECT {r['o_direct']}")
    print(f"{'figure':<34}{'memory':>12}{'tiered':>12}{'ratio':>9}  target")
    print(f"{'peak RSS (MiB)':<34}{r['peak_rss_bytes']['memory'] / 2**20:>12.0f}"
          f"{r['peak_rss_bytes']['tiered'] / 2**20:>12.0f}")
    print(f"{'state share of RSS (MiB)':<34}{r['state_rss_share_bytes']['memory'] / 2**20:>12.0f}"
          f"{r['state_rss_share_bytes']['tiered'] / 2**20:>12.0f}{r['state_rss_ratio']:>9.2f}"
          "  <= 0.5")
    print(f"{'step time (s, median)':<34}{r['step_seconds']['memory']:>12.2f}"
          f"{r['step_seconds']['tiered']:>12.2f}{r['step_time_ratio']:>9.2f}  <= 1.3")
    print(f"{'disk read (MB/s): dd | tier':<34}{r['dd_read_bytes_per_second'] / 1e6:>12.0f}"
          f"{r['disk_read_bytes_per_second'] / 1e6:>12.0f}{r['read_bandwidth_ratio']:>9.2f}"
          "  >= 0.7")
    print(f"{'disk write (MB/s): dd | tier':<34}{r['dd_write_bytes_per_second'] / 1e6:>12.0f}"
          f"{r['disk_write_bytes_per_second'] / 1e6:>12.0f}{r['write_bandwidth_ratio']:>9.2f}"
          "  >= 0.7")
    print(f"{'tier alone (read | write) / dd':<34}{r['isolated_read_bandwidth_ratio']:>12.2f}"
          f"{r['isolated_write_bandwidth_ratio']:>12.2f}{'':>9}  >= 0.7")
    print(f"{'tier alone / dd, same files':<34}{r['same_files_read_bandwidth_ratio']:>12.2f}"
          f"{r['same_files_write_bandwidth_ratio']:>12.2f}{'':>9}  >= 0.7")
    print(f"{'prefetch hit ratio':<34}{'':>12}{r['prefetch_hit_ratio']:>12.2f}")


if __name__ == "__main__":
    main()
