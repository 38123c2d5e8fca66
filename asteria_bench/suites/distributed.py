"""`distributed`: data-parallel SOAP against Meta's Distributed Shampoo: bytes, state, waits, loss.

Every configuration is a real torchrun job (gloo, `asteria_bench.ddp_rank`): a 0.43M-parameter
GPT (n_embd 128, 2 layers, 8 x 64 tokens per rank), refresh every 10 steps, lr 3e-3 for every
second-order run. Configurations:

- DDP AdamW: the first-order baseline at the same world size;
- Distributed Shampoo (facebookresearch/optimizers, its source unmodified, found on the path or
  in ASTERIA_DISTRIBUTED_SHAMPOO): its eigenvalue-corrected (SOAP-like) configuration with QR
  refresh, no grafting, its DDP distributor (each rank computes the search directions of its
  blocks and all-gathers them every step), fp32 and bf16 exchange;
- Asteria SOAP, S in {1, 3, 5}: owner ranks refresh on one host worker each, the new bases
  travel in the background and every rank swaps them at one step within S;
- synchronous baseline: the owner refreshes inline at the refresh step and broadcasts at once,
  every rank waiting for it there (workers 0, swap delay 0: the same bytes, all waited for);
- Asteria SOAP S=5 with sharded state (distributed/sharded.py): each rank keeps and updates only
  its own parameters' state (factors packed to their upper triangle, as Distributed Shampoo
  keeps them) and sends the updates every step, exact or rounded to bf16;
- FSDP2 (`fully_shard`, one seed): Distributed Shampoo's fully-shard distributor against
  Asteria SOAP S=5, each rank preconditioning its own dim-0 shards (no basis and no search
  direction travels in either), factors packed in both (Distributed Shampoo's default).

Bytes: one convention for all (docs/architecture.md, "One byte convention"): logical bytes sent
plus received per rank per step, every collective the optimizer posts counted (Asteria: bases,
headers, the policy sync; Distributed Shampoo: its all-gather), after the first round (Asteria's
first bases, a one-off, are reported apart). State: every tensor of the optimizer's state on a
rank. Each seed runs every configuration once, in turn (drift falls on all alike); timings are
medians over seeds, eval losses means, and each S's loss gap to the synchronous exchange is the
mean of its per-seed differences (`asteria bench distributed --seeds N`: N seeds instead of
3; the FSDP2 and 4-rank rows run one). Absolute times on a few cores shared by up to 4 ranks (each
with a refresh worker) are not what a cluster sees; compare within a world size. --quick runs
2 ranks, fewer configurations and steps, one seed.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult

TITLE = "Data-parallel SOAP against Distributed Shampoo: bytes, state and loss per rank"
ROOT = Path(__file__).resolve().parents[2]
SOURCE_ENV = "ASTERIA_DISTRIBUTED_SHAMPOO"
HOW_TO_GET = (f"Distributed Shampoo is not importable: clone facebookresearch/optimizers and "
              f"set {SOURCE_ENV} to that folder (the one holding distributed_shampoo/), or put "
              "it on PYTHONPATH; its rows are left out")


@dataclass(frozen=True)
class Sizes:
    steps: int
    eval_at: tuple[int, ...]  # also evaluate after these steps (every min(eval_at) steps)
    interval: int       # refresh interval; the first round is left out of per-step figures
    seeds: int
    worlds: tuple[int, ...]
    quick_configs: bool  # the reduced set of configurations
    n_layer: int = 2
    n_embd: int = 128
    block_size: int = 64


FULL = Sizes(steps=500, eval_at=(200,), interval=10, seeds=3, worlds=(2, 4),
             quick_configs=False)
QUICK = Sizes(steps=30, eval_at=(), interval=10, seeds=1, worlds=(2,), quick_configs=True)

def bound(s: int) -> list[str]:
    """The staleness bound S of an Asteria SOAP configuration."""
    return ["--policy.staleness_bound", str(s)]


RANK_DEFAULTS = ["--optim.name", "soap", "--optim.lr", "3e-3", "--optim.betas", "0.95,0.95",
                 "--optim.weight_decay", "0", "--optim.grad_clip", "0",
                 "--optim.warmup_steps", "0", "--optim.min_lr_ratio", "1",
                 "--policy.workers", "1", *bound(5), "--model.n_head", "4",
                 "--data.batch_size", "8", "--train.eval_batches", "8", "--train.threads", "1",
                 "--train.device", "cpu", "--telemetry.nvml", "false",
                 "--telemetry.rapl", "false"]
"""Every rank trains with these unless its configuration says otherwise: one lr, betas and
no weight decay, clipping or schedule for every optimizer (as Distributed Shampoo is
configured), one refresh worker, S = 5, 8 sequences per rank and step, one torch thread."""

ADAMW = "DDP AdamW"
DS_FP32 = "Distributed Shampoo, fp32 exchange"
DS_BF16 = "Distributed Shampoo, bf16 exchange"
SYNC = "Asteria synchronous (inline refresh, broadcast at the refresh step)"
SHARDED = "Asteria SOAP S=5, sharded state, exact updates"
SHARDED_BF16 = "Asteria SOAP S=5, sharded state, bf16 updates"
FSDP_DS = "FSDP2: Distributed Shampoo, fully-shard distributor"
FSDP_SOAP = "FSDP2: Asteria SOAP S=5, packed factors"
SYNC_ARGS = [*bound(5), "--policy.workers", "0", "--policy.swap_delay", "0"]
PACKED = ["--optim.pack_factors", "true"]
FSDP2 = ["--train.data_parallel", "fsdp2"]
SHARDED_ARGS = [*bound(5), "--runtime.distributed_state", "sharded", *PACKED]
DS_ARGS = ["--peer", "distributed_shampoo", "--exchange-dtype"]
# (world, label, short label for the plot, rank arguments, in the quick set, seeds: all | 1)
CONFIGS = [
    (2, ADAMW, "AdamW", ["--optim.name", "adamw"], True, True),
    (2, DS_FP32, "DS fp32", [*DS_ARGS, "fp32"], True, True),
    (2, DS_BF16, "DS bf16", [*DS_ARGS, "bf16"], False, True),
    (2, "Asteria SOAP S=1", "S=1", bound(1), False, True),
    (2, "Asteria SOAP S=3", "S=3", bound(3), False, True),
    (2, "Asteria SOAP S=5", "S=5", bound(5), True, True),
    (2, SYNC, "sync", SYNC_ARGS, True, True),
    (2, SHARDED, "sharded\nexact", [*SHARDED_ARGS], True, True),
    (2, SHARDED_BF16, "sharded\nbf16", [*SHARDED_ARGS, "--runtime.update_dtype", "bf16"], False,
     True),
    (2, FSDP_DS, "FSDP2\nDS", ["--peer", "distributed_shampoo", *FSDP2], True, False),
    (2, FSDP_SOAP, "FSDP2\nS=5", [*bound(5), *FSDP2, *PACKED], True, False),
    (4, ADAMW, "AdamW", ["--optim.name", "adamw"], False, False),
    (4, DS_FP32, "DS fp32", [*DS_ARGS, "fp32"], False, False),
    (4, DS_BF16, "DS bf16", [*DS_ARGS, "bf16"], False, False),
    (4, "Asteria SOAP S=5", "S=5", bound(5), False, False),
    (4, SYNC, "sync", SYNC_ARGS, False, False),
    (4, SHARDED, "sharded\nexact", [*SHARDED_ARGS], False, False),
]


def reference_env() -> dict[str, str] | None:
    """The environment in which the ranks import Distributed Shampoo, or None when they
    cannot (from its source folder in ASTERIA_DISTRIBUTED_SHAMPOO, or already importable)."""
    env = dict(os.environ)
    source = env.get(SOURCE_ENV)
    if source:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (source, env.get("PYTHONPATH")) if p)
    probe = subprocess.run([sys.executable, "-c", "import distributed_shampoo"], env=env,
                           capture_output=True, timeout=120, cwd=ROOT)
    return env if probe.returncode == 0 else None


def configs(sizes: Sizes, with_reference: bool = True) -> list[tuple]:
    return [c for c in CONFIGS if c[0] in sizes.worlds and (c[4] or not sizes.quick_configs)
            and (with_reference or "distributed_shampoo" not in c[3])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, sizes: Sizes, args: list[str], seed: int,
           env: dict[str, str] | None, prefix: tuple[str, ...] = ()) -> list[dict]:
    """One torchrun job of `world` ranks; each rank's report. `prefix` runs it inside
    something (the network suite's namespace). A port another process took between choosing
    it and binding it fails the rendezvous: one retry on a new port."""
    for attempt in range(2):
        with tempfile.TemporaryDirectory(prefix="asteria-bench-ddp-") as out:
            cmd = [*prefix, sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                   str(world), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   "-m", "asteria_bench.ddp_rank", "--out", out, *RANK_DEFAULTS,
                   "--train.out_dir", str(Path(out) / "runs"),
                   "--train.steps", str(sizes.steps),
                   "--train.eval_interval", str(min(sizes.eval_at, default=sizes.steps)),
                   "--policy.refresh_interval", str(sizes.interval),
                   "--model.n_layer", str(sizes.n_layer), "--model.n_embd", str(sizes.n_embd),
                   "--model.block_size", str(sizes.block_size),
                   "--train.seed", str(1337 + 100 * seed), *args]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=ROOT,
                                  env=env)
            if proc.returncode == 0:
                return [json.loads((Path(out) / f"rank{r}.json").read_text())
                        for r in range(world)]
            text = proc.stdout[-3000:] + proc.stderr[-3000:]
            if attempt == 0 and "address already in use" in text.lower():
                continue
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text}")
    raise AssertionError("unreachable")


def summary(label: str, world: int, seed: int, ranks: list[dict]) -> dict:
    """One job: per-rank figures, and the job's figures (bytes and state: the mean rank)."""
    def mean(key: str):
        values = [r[key] for r in ranks]
        return None if values[0] is None else statistics.fmean(values)

    return {
        "label": label, "world": world, "seed": seed,
        "step_ms": statistics.median(r["step_ms_median"] for r in ranks),
        "step_ms_mean": statistics.fmean(r["step_ms_mean"] for r in ranks),
        "sync_wait_ms_per_step": mean("sync_wait_ms_per_step"),
        "refresh_wait_ms_per_step": mean("refresh_wait_ms_per_step"),
        "staleness_max": max(r["staleness_max"] for r in ranks),
        "refreshes_per_rank": [r["refreshes"] for r in ranks],
        "refresh_seconds_per_rank": [round(r.get("refresh_seconds", 0.0), 4) for r in ranks],
        "state_bytes_per_rank": [r["state_bytes"] for r in ranks],
        "bytes_per_step_per_rank": mean("bytes_per_step"),
        "bytes_per_round_per_rank": mean("bytes_per_round"),
        "first_round_bytes_per_rank": mean("first_round_bytes"),
        "eval_loss": ranks[0]["eval_loss"],
        "eval_at": ranks[0]["eval_at"],
        "ranks": ranks,
    }


def merge(runs: list[dict]) -> dict:
    """One configuration over seeds: medians of the timed figures, means of the losses, the
    rest as the last seed measured (bytes and state do not depend on the seed)."""
    row = {k: v for k, v in runs[-1].items() if k not in ("ranks", "seed")}
    for key in ("step_ms", "step_ms_mean", "sync_wait_ms_per_step", "refresh_wait_ms_per_step"):
        values = [r[key] for r in runs if r[key] is not None]
        row[key] = statistics.median(values) if values else None
        row[f"{key}_runs"] = values
    row["staleness_max"] = max(r["staleness_max"] for r in runs)
    row["seeds"] = [r["seed"] for r in runs]
    row["eval_loss_runs"] = [r["eval_loss"] for r in runs]
    row["eval_loss"] = statistics.fmean(row["eval_loss_runs"])
    row["eval_at"] = {step: statistics.fmean(r["eval_at"][step] for r in runs)
                      for step in runs[-1]["eval_at"]}
    return row


def run(opts: BenchOptions) -> SuiteResult:
    sizes = opts.pick(QUICK, FULL)
    if opts.seeds is not None:  # `asteria bench --seeds N`
        sizes = replace(sizes, seeds=opts.seeds)
    env = reference_env()
    chosen = configs(sizes, with_reference=env is not None)
    result = SuiteResult("distributed", TITLE, opts.quick, opts.command,
                         config={**asdict(sizes), "backend": "gloo", "batch_per_rank": 8,
                                 "lr": 3e-3, "distributed_shampoo": env is not None,
                                 "configurations": [[c[0], c[1], c[3]] for c in chosen]})
    per_config: list[list[dict]] = [[] for _ in chosen]
    jobs = [(seed, i) for seed in range(sizes.seeds) for i, c in enumerate(chosen)
            if seed == 0 or c[5]]
    with progress(len(jobs), "distributed: torchrun jobs", opts) as bar:
        for seed, i in jobs:
            world, label, _, args, _, _ = chosen[i]
            s = summary(label, world, seed, launch(world, sizes, args, seed, env))
            bar.update(1)
            per_config[i].append(s)
            result.runs.append(s)
            result.save(opts.out_dir)
    rows = [merge(r) for r in per_config]
    plot(result, rows, chosen, opts)
    result.save(opts.out_dir)
    return result


def plot(result: SuiteResult, rows: list[dict], chosen: list, opts: BenchOptions) -> None:
    plt = pyplot()
    worlds = sorted({r["world"] for r in rows})
    panels = [("step_ms", "step p50 (ms)", "#3b75af"),
              ("bytes_per_step_per_rank", "bytes/step/rank", "#d9822b"),
              ("eval_loss", "eval loss", "#5b9b4a")]
    fig, axes = plt.subplots(len(panels), len(worlds), figsize=(4.2 * len(worlds) + 1, 7.5),
                             squeeze=False)
    for j, world in enumerate(worlds):
        picked = [(c[2], r) for c, r in zip(chosen, rows, strict=True) if r["world"] == world]
        names = [n for n, _ in picked]
        for i, (key, label, color) in enumerate(panels):
            ax = axes[i][j]
            ax.bar(names, [r[key] for _, r in picked], color=color)
            ax.tick_params(axis="x", labelsize=7)
            if key == "eval_loss":
                low = min(r[key] for _, r in picked)
                ax.set_ylim(low * 0.97, max(r[key] for _, r in picked) * 1.01)
            if j == 0:
                ax.set_ylabel(label)
        axes[0][j].set_title(f"world {world}")
    fig.tight_layout()
    result.plots.append(save(fig, opts.out_dir / "distributed.png", "Step time (p50), bytes "
        "per step per rank (every optimizer collective, sent + received) and eval loss at the "
        "end (mean over seeds), per configuration and world size (gloo).", dpi=120))
