"""Data-parallel SOAP on this machine: bytes, waits, refresh work and factor memory per rank.

    python benchmarks/bench_distributed.py --repeats 3   # world 1, 2, 4 (about 7 minutes here)

Every configuration is a real torchrun job (gloo, `benchmarks/ddp_rank.py`): a 0.43M-parameter
GPT (n_embd 128, 2 layers, 8 x 64 tokens per rank), 40 steps, refresh every 10, the first round
(every block's first eigendecomposition) left out of the per-step figures. Configurations:

- DDP AdamW: the first-order baseline at the same world size;
- Asteria SOAP, S in {1, 3, 5}: owner ranks refresh on one host worker each, the new bases
  travel in the background and every rank swaps them at step t + S;
- synchronous baseline: the owner refreshes inline at the refresh step and broadcasts at once,
  every rank waiting for it there (workers 0, swap delay 0: the same bytes, all waited for);
- Distributed Shampoo's scheme (each rank preconditions its own blocks and all-gathers the
  search directions every step): its bytes per step are the model's size x (world - 1) / world
  per rank; an AdamW run that also all-gathers a buffer of that size every step times it here.

Each repeat runs every configuration once, in turn (so drift falls on all alike); the table
gives medians over repeats. Absolute times on 2 cores shared by up to 4 ranks (each with a
refresh worker) are not what a cluster sees; compare within a world size. Writes
benchmarks/results/distributed.json and a table beside it.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RANK_SCRIPT = Path(__file__).with_name("ddp_rank.py")
RESULTS = ROOT / "benchmarks" / "results"
STEPS, INTERVAL = 40, 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, *args: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world),
               "--master-port", str(free_port()), str(RANK_SCRIPT), "--out", out,
               "--steps", str(STEPS), "--interval", str(INTERVAL), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}"
                               f"{proc.stderr[-3000:]}")
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(world)]


def summary(label: str, world: int, ranks: list[dict]) -> dict:
    rounds = STEPS // INTERVAL
    sent = sum(r["bytes_sent"] for r in ranks)
    return {
        "label": label, "world": world,
        "step_ms": statistics.median(r["step_ms_median"] for r in ranks),
        "sync_wait_ms_per_step": statistics.fmean(r["sync_wait_ms_per_step"] for r in ranks),
        "refresh_wait_ms_per_step": statistics.fmean(r["refresh_wait_ms_per_step"]
                                                     for r in ranks),
        "staleness_max": max(r["staleness_max"] for r in ranks),
        "refreshes_per_rank": [r["refreshes"] for r in ranks],
        "refresh_seconds_per_rank": [round(r["refresh_seconds"], 4) for r in ranks],
        "factor_bytes_per_rank": [r["factor_bytes"] for r in ranks],
        "bytes_per_step_per_rank": statistics.fmean(
            (r["bytes_sent"] + r["bytes_received"]) / STEPS for r in ranks),
        "bytes_sent_per_round": sent / rounds,
        "allgather_ms_per_step": ranks[0]["allgather_ms_per_step"],
        "allgather_bytes_per_step_per_rank": ranks[0]["allgather_bytes_per_step"],
        "ranks": ranks,
    }


CONFIGS = [
    (1, "DDP AdamW", ["--optimizer", "adamw"]),
    (1, "SOAP S=5", ["--bound", "5"]),
    (2, "DDP AdamW", ["--optimizer", "adamw"]),
    (2, "DDP AdamW + all-gather of the model per step (Distributed Shampoo's exchange)",
     ["--optimizer", "adamw", "--allgather"]),
    (2, "Asteria SOAP S=1", ["--bound", "1"]),
    (2, "Asteria SOAP S=3", ["--bound", "3"]),
    (2, "Asteria SOAP S=5", ["--bound", "5"]),
    (2, "synchronous baseline (inline refresh, broadcast at the refresh step)",
     ["--bound", "5", "--workers", "0", "--delay", "0"]),
    (4, "DDP AdamW", ["--optimizer", "adamw"]),
    (4, "DDP AdamW + all-gather of the model per step (Distributed Shampoo's exchange)",
     ["--optimizer", "adamw", "--allgather"]),
    (4, "Asteria SOAP S=5", ["--bound", "5"]),
    (4, "synchronous baseline (inline refresh, broadcast at the refresh step)",
     ["--bound", "5", "--workers", "0", "--delay", "0"]),
]


def table(rows: list[dict]) -> str:
    lines = ["| world | configuration | step p50 ms | sync_wait ms/step | staleness max | "
             "refreshes per rank | factor KiB per rank | exchange bytes/step/rank | "
             "bytes sent per round |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per_step = r["bytes_per_step_per_rank"]
        if r["allgather_bytes_per_step_per_rank"]:
            per_step = r["allgather_bytes_per_step_per_rank"]
        lines.append(
            f"| {r['world']} | {r['label']} | {r['step_ms']:.1f} | "
            f"{r['sync_wait_ms_per_step']:.2f} | {r['staleness_max']} | "
            f"{'/'.join(map(str, r['refreshes_per_rank']))} | "
            f"{'/'.join(str(b // 1024) for b in r['factor_bytes_per_rank'])} | "
            f"{per_step:,.0f} | {r['bytes_sent_per_round']:,.0f} |")
    return "\n".join(lines)


def merge(repeats: list[dict]) -> dict:
    """One configuration over repeats: medians of the timed figures, the rest as measured."""
    row = dict(repeats[-1])
    for key in ("step_ms", "sync_wait_ms_per_step", "refresh_wait_ms_per_step",
                "allgather_ms_per_step"):
        values = [r[key] for r in repeats if r[key] is not None]
        row[key] = statistics.median(values) if values else None
        row[f"{key}_runs"] = values
    row["staleness_max"] = max(r["staleness_max"] for r in repeats)
    row["ranks"] = [r["ranks"] for r in repeats]
    return row


def main() -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--repeats", type=int, default=3)
    args = cli.parse_args()
    started = time.perf_counter()
    runs: list[list[dict]] = [[] for _ in CONFIGS]
    for repeat in range(args.repeats):
        for i, (world, label, extra) in enumerate(CONFIGS):
            print(f"[repeat {repeat + 1}/{args.repeats}, {i + 1}/{len(CONFIGS)}] world {world}: "
                  f"{label}", flush=True)
            runs[i].append(summary(label, world, launch(world, *extra)))
    rows = [merge(r) for r in runs]
    text = table(rows)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "distributed.json").write_text(json.dumps(
        {"steps": STEPS, "refresh_interval": INTERVAL, "repeats": args.repeats,
         "seconds": time.perf_counter() - started,
         "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                      text=True, cwd=ROOT).stdout.strip(),
         "configs": rows}, indent=1))
    (RESULTS / "distributed_table.md").write_text(text + "\n")
    print(f"wrote {RESULTS / 'distributed.json'} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
