"""One process of the `tiers` suite: a stack of linear layers trained a few steps with one
placement of its SOAP state, so its peak RSS (VmHWM) is that placement's alone. Prints one JSON
line (the last line of stdout) with its figures.

    python -m asteria_bench.suites.tiers_worker --mode tiered --device-frac 0.1 --host-frac 0.15
        --dir DIR [--layers 28 --rows 4096 --cols 1024 ...]

Modes: `base` (forward and backward only, no optimizer state: the RSS floor), `memory` (SOAP,
all state in memory, offload_mode none), `tiered` (SOAP with device and host budgets of the
given fractions of its state, offload_mode auto, the rest on disk in --dir).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time
from pathlib import Path

from asteria_bench.clocks import peak_rss_bytes


def train(args: argparse.Namespace) -> dict:
    import torch

    from asteria_core.optim import SOAP
    from asteria_core.policy import LivePolicy, Policy
    from asteria_core.tiers import TierStore
    from asteria_core.tiers.lifecycle import leaves

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    model = torch.nn.Sequential(*[torch.nn.Linear(args.cols if i % 2 == 0 else args.rows,
                                                  args.rows if i % 2 == 0 else args.cols,
                                                  bias=False) for i in range(args.layers)])
    model.to(device)
    opt = SOAP(model.parameters(), lr=1e-3, block_size=args.block,
               precondition_frequency=args.refresh)
    state_total = sum(t.numel() * t.element_size() for i in range(args.layers)
                      for _, t in leaves(opt.state_spec(i)))
    store = None
    if args.mode == "tiered":
        policy = Policy(offload_mode="auto",
                        device_budget_bytes=max(1, int(args.device_frac * state_total)),
                        host_budget_bytes=max(1, int(args.host_frac * state_total)),
                        disk_dir=args.dir)
        store = TierStore(opt, LivePolicy(policy), Path(args.dir))
    x = torch.randn(args.batch, args.cols, device=device)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for step in range(args.steps + 1):
        t0 = time.perf_counter()
        if store is not None:
            store.announce()
        model(x).square().mean().backward()
        if args.mode != "base":
            opt.step()
        opt.zero_grad(set_to_none=True)
        if store is not None:
            store.on_boundary(step + 1)
        if cuda:
            torch.cuda.synchronize(device)
        if step:  # step 0 creates the state
            times.append(time.perf_counter() - t0)
    out = {"mode": args.mode, "device_frac": args.device_frac, "host_frac": args.host_frac,
           "state_bytes": state_total,
           "peak_rss_bytes": peak_rss_bytes(),
           "device_peak_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
           "step_seconds": statistics.median(times), "step_times": times}
    if store is not None:
        disk = store.disk
        out.update(tier_bytes=store.tier_bytes(), staging_bytes=store.plan.slots
                   * store.plan.slot_bytes, prefetch_hit_ratio=store.hit_ratio(),
                   disk_read_bytes=disk.bytes_read if disk else 0,
                   disk_read_seconds=disk.read_seconds if disk else 0.0,
                   disk_write_bytes=disk.bytes_written if disk else 0,
                   disk_write_seconds=disk.write_seconds if disk else 0.0,
                   o_direct=disk.direct if disk else None)
        store.close()
        sizes = [f.stat().st_size for f in Path(args.dir).glob("*.bin")]
        if sizes and args.isolated:
            out.update(isolated_io(Path(args.dir) / "isolated", sizes))
    return out


def isolated_io(folder: Path, sizes: list[int]) -> dict:
    """The disk tier's own write and read path (header, checksums, O_DIRECT, rename) on files of
    the run's sizes, one at a time: what it gets from the disk without training's concurrent
    reads and writes sharing it; then dd on those very files (read) and on files of the same
    sizes (write), right after: the same disk, file sizes and cache state, so the ratio is the
    tier's overhead alone (on a VM whose host caches the disk, dd's read of a file it has just
    written is not the disk's speed)."""
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
    dd_read = dd_write = (0, 0.0)
    for i, size in enumerate(sizes):
        dd_read = _add(dd_read, dd(["if=" + str(disk.path(f"f{i}")), "of=/dev/null", "bs=4M",
                                    "iflag=direct"]))
        dd_write = _add(dd_write, dd(["if=/dev/zero", f"of={folder}/g{i}.bin", "bs=4M",
                                      f"count={max(1, size >> 22)}", "oflag=direct"]))
    return {"isolated_write_bytes_per_second": disk.bytes_written / disk.write_seconds,
            "isolated_read_bytes_per_second": disk.bytes_read / disk.read_seconds,
            "same_files_dd_read_bytes_per_second": dd_read[0] / dd_read[1],
            "same_files_dd_write_bytes_per_second": dd_write[0] / dd_write[1]}


def dd(args: list[str]) -> tuple[int, float]:
    """(bytes, seconds) of one dd run, as dd reports them."""
    text = subprocess.run(["dd", *args], capture_output=True, text=True, check=True).stderr
    m = re.search(r"(\d+) bytes .* copied, ([\d.e-]+) s", text)
    if m is None:
        raise RuntimeError(f"dd {' '.join(args)}: no figure in {text!r}")
    return int(m.group(1)), max(float(m.group(2)), 1e-9)


def _add(a: tuple[int, float], b: tuple[int, float]) -> tuple[int, float]:
    return a[0] + b[0], a[1] + b[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("base", "memory", "tiered"), required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--device-frac", type=float, default=0.0)
    ap.add_argument("--host-frac", type=float, default=0.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--refresh", type=int, default=3)
    ap.add_argument("--isolated", type=int, default=1, help="also time the tier's path alone")
    print(json.dumps(train(ap.parse_args())))


if __name__ == "__main__":
    main()
