"""One rank of the `distributed` suite's runs (launched by torch.distributed.run with
`-m asteria_bench.ddp_rank`): a GPT trained with DDP (or FSDP2, `--fsdp`) and either Asteria's
runtime attached or Meta's Distributed Shampoo (its source on the path, unmodified); writes
<out>/rank<r>.json with its measured figures.

Bytes follow one convention (docs/architecture.md, "One byte convention"): logical payload
bytes of every collective the optimizer posts, sent (payload x receivers) plus received, per
rank; DDP's gradient all-reduce, which every optimizer here pays alike, is not counted.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import asteria_core as asteria
from asteria_bench.slower_host import SlowerHost
from asteria_core.autopilot import AutopilotConfig
from asteria_core.telemetry.state_bytes import state_bytes
from asteria_core.train.config import ModelConfig
from asteria_core.train.data import (
    BatchLoader,
    encode,
    fixed_eval_batches,
    load_corpus,
    split_tokens,
)
from asteria_core.train.model import GPT

BATCH = 8  # sequences per rank
LR = 3e-3
AUTOPILOT = AutopilotConfig(mode="apply", window=20, settle=10, spacing=40)
"""--autopilot: the autopilot suite's scenario (d) settings (default bounds; rank 0 decides)."""
DISTRIBUTED_SHAMPOO = "distributed_shampoo"
EXCHANGE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@torch.no_grad()
def evaluate(model: GPT, tokens: torch.Tensor, block_size: int) -> float:
    """Validation loss on fixed batches (the same on every rank and every configuration)."""
    model.eval()
    losses = [model(x, y)[1] for x, y in fixed_eval_batches(tokens, block_size, 8, 8)]
    model.train()
    return torch.stack(losses).mean().item()


def distributed_shampoo(model: torch.nn.Module, args) -> torch.optim.Optimizer:
    """Distributed Shampoo in its eigenvalue-corrected (SOAP-like) configuration, QR refresh
    every `interval` steps, no grafting. Under DDP its DDP distributor (each rank computes the
    search directions of its blocks and all-gathers them every step) in the chosen exchange
    dtype; under FSDP2 its fully-shard distributor (each rank preconditions its own dim-0
    shards, nothing travels)."""
    import distributed_shampoo as ds  # on the path as the suite found it; never vendored

    if args.fsdp:
        distributed_config = ds.FullyShardDistributedConfig(
            target_parameter_dimensionality=math.inf)
    else:
        distributed_config = ds.DDPDistributedConfig(
            communication_dtype=EXCHANGE_DTYPES[args.exchange_dtype],
            num_trainers_per_group=-1, communicate_params=False,
            target_parameter_dimensionality=math.inf)
    return ds.DistributedShampoo(
        model.parameters(), lr=LR, betas=(0.95, 0.95), epsilon=1e-8, weight_decay=0.0,
        max_preconditioner_dim=10000, precondition_frequency=args.interval,
        start_preconditioning_step=args.interval, grafting_config=None,
        preconditioner_config=ds.EigenvalueCorrectedShampooPreconditionerConfig(
            amortized_computation_config=ds.QREigendecompositionConfig()),
        distributed_config=distributed_config)


def gathered_bytes_per_step(opt: torch.optim.Optimizer, world: int) -> int:
    """Distributed Shampoo's one all-gather per parameter group and step, counted as ours are:
    each rank sends its (W - 1) / W share to the others and receives theirs (its fully-shard
    distributor gathers nothing)."""
    total = 0
    for group_state in opt._per_group_state_lists:  # its distributor owns the gather buffer
        buffer = getattr(group_state["distributor"], "_global_dist_buffer", None)
        if buffer is None:
            continue
        total += buffer.numel() * buffer.element_size()
    return 2 * total * (world - 1) // world


def shard(model: GPT) -> torch.nn.Module:
    """FSDP2 as examples/ddp_loop.py does it: each transformer block a unit of its own, the rest
    (the tied embedding included) the root's."""
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    return fully_shard(model)


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--out", required=True)
    cli.add_argument("--optimizer", default="soap",
                     help=f"soap | adamw | {DISTRIBUTED_SHAMPOO}")
    cli.add_argument("--exchange-dtype", choices=sorted(EXCHANGE_DTYPES), default="fp32",
                     help="Distributed Shampoo's all-gather dtype")
    cli.add_argument("--steps", type=int, default=40)
    cli.add_argument("--eval-at", type=int, nargs="*", default=[],
                     help="also evaluate after these steps")
    cli.add_argument("--interval", type=int, default=10)
    cli.add_argument("--bound", type=int, default=5)
    cli.add_argument("--delay", default="auto")
    cli.add_argument("--workers", type=int, default=1)
    cli.add_argument("--state", default="replicated", help="replicated | sharded (Asteria)")
    cli.add_argument("--update-dtype", default="exact", help="the sharded mode's: exact | bf16")
    cli.add_argument("--rebalance-rounds", type=int, default=0,
                     help="share refresh speeds every N rounds; owners move off a straggler")
    cli.add_argument("--pin", action="store_true",
                     help="pin rank r (and its refresh worker) to CPU r of this machine")
    cli.add_argument("--pack-factors", action="store_true",
                     help="SOAP keeps each factor block's upper triangle only")
    cli.add_argument("--coherence", type=float, default=0.0,
                     help="skip (and send no) refresh whose basis moved less than this")
    cli.add_argument("--seed", type=int, default=0,
                     help="model initialisation seed; rank r reads batches with seed 1337 + "
                          "100 * seed + r")
    cli.add_argument("--n-layer", type=int, default=2)
    cli.add_argument("--n-embd", type=int, default=128)
    cli.add_argument("--block-size", type=int, default=64)
    cli.add_argument("--slower", type=float, default=1.0,
                     help="refreshes emulated this many times slower (slower_host.py)")
    cli.add_argument("--slower-rank", type=int, default=None,
                     help="only this rank's refreshes are slower (default: every rank's)")
    cli.add_argument("--fsdp", action="store_true",
                     help="shard the model with FSDP2 (fully_shard) instead of DDP")
    cli.add_argument("--autopilot", action="store_true",
                     help="the autopilot applies its changes (the autopilot suite's settings)")
    args = cli.parse_args()
    model_config = ModelConfig(n_layer=args.n_layer, n_head=4, n_embd=args.n_embd,
                               block_size=args.block_size)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.pin:  # before the runtime: its workers take the CPUs of the thread that builds it
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    torch.manual_seed(args.seed)
    model = GPT(model_config)
    net = shard(model) if args.fsdp else DistributedDataParallel(model)
    runtime, records = None, []
    if args.optimizer == DISTRIBUTED_SHAMPOO:
        opt = distributed_shampoo(model, args)
    else:
        delay = args.delay if args.delay == "auto" else int(args.delay)
        policy = asteria.Policy(refresh_interval=args.interval, staleness_bound=args.bound,
                                swap_delay=delay, workers=args.workers)
        extra = {"coherence_threshold": args.coherence} if args.coherence else {}
        if args.pack_factors:
            extra["pack_factors"] = True
        if args.slower > 1 and args.slower_rank in (None, rank):
            extra["refresh_fn"] = SlowerHost(args.slower)
        opt = asteria.optimizer(model, args.optimizer, lr=LR, policy=policy,
                                telemetry=asteria.TelemetryConfig(nvml=False, rapl=False),
                                distributed_state=args.state, update_dtype=args.update_dtype,
                                rebalance_rounds=args.rebalance_rounds, **extra)
        runtime = opt.runtime
        runtime.add_listener(records.append)
        if args.autopilot:
            runtime.autopilot.configure(AUTOPILOT)
    tokens, tokens_val = split_tokens(encode(load_corpus("")), 0.1, model_config.block_size)
    loader = BatchLoader(tokens, model_config.block_size, BATCH,
                         seed=1337 + 100 * args.seed + rank)
    n_params = sum(p.numel() for p in model.parameters())
    step_seconds, losses, evals = [], [], {}
    first_round_bytes = 0
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        x, y = loader.next_batch()
        _, loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if runtime is not None:
            runtime.end_step()
        step_seconds.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if step == 1 and runtime is not None and runtime.data_parallel is not None:
            moved = runtime.data_parallel.figures()  # the first bases, swapped in at step 1
            first_round_bytes = moved.bytes_sent + moved.bytes_received
        if step in args.eval_at:
            evals[step] = evaluate(model, tokens_val, model_config.block_size)
    skip = args.interval  # the first round holds every block's first eigendecomposition
    report = {
        "rank": rank, "world": world, "optimizer": args.optimizer, "params": n_params,
        "seed": args.seed,
        "step_ms_median": 1e3 * statistics.median(step_seconds[skip:]),
        "step_ms_mean": 1e3 * statistics.fmean(step_seconds[skip:]),
        "final_loss": losses[-1],
        "eval_loss": evaluate(model, tokens_val, model_config.block_size),
        "eval_at": {str(k): v for k, v in evals.items()},
        "state_bytes": sum(state_bytes(opt).values()),
        "step_seconds": step_seconds,
        "losses": losses,
    }
    if runtime is None:  # Distributed Shampoo: its all-gather, every step
        per_step = gathered_bytes_per_step(opt, world)
        report |= {"bytes_per_step": per_step, "first_round_bytes": per_step,
                   "bytes_per_round": per_step * args.interval, "sync_wait_ms_per_step": None,
                   "refresh_wait_ms_per_step": None, "staleness_max": 0, "refreshes": 0,
                   "factor_bytes": None}
    else:
        report |= runtime_figures(runtime, opt, records, args, first_round_bytes)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    if runtime is not None:
        # Join the refresh workers and the version exchange and release the runtime's groups
        # before the default group goes.
        runtime.close()
    dist.destroy_process_group()


def runtime_figures(runtime, opt, records: list, args, first_round_bytes: int) -> dict:
    """Asteria's own figures, read after the run (close settles the exchange: every byte of
    the last round is counted). Rounds after the first fall due every `interval` steps."""
    refresh = runtime.refresh
    factor_bytes = sum(f.numel() * f.element_size() for state in opt.state.values()
                       for dims in state.get("factors", []) if dims is not None for f in dims)
    data_parallel = runtime.data_parallel
    runtime.close()
    moved = data_parallel.figures() if data_parallel is not None else None
    total = 0 if moved is None else moved.bytes_sent + moved.bytes_received
    # After step 1 (the first bases, a one-off): the mean per step, and per round (rounds fall
    # due at 1 + k * interval; a round's figure includes the policy headers of its steps).
    steady = total - first_round_bytes
    rounds = (args.steps - 1) // args.interval if refresh else 0
    steady_records = records[args.interval:]
    changes = [{"version": c.version, "effective_step": c.effective_step,
                "diff": {k: list(v) for k, v in c.diff.items()}, "client": c.client,
                "reason": c.reason} for c in runtime.policy.history()]
    return {
        "policy_changes": changes,
        "sync_wait_ms_per_step": 1e3 * statistics.fmean(
            r.timing.idle_seconds["sync_wait"] for r in steady_records),
        "refresh_wait_ms_per_step": 1e3 * statistics.fmean(
            r.timing.idle_seconds["refresh_wait"] for r in steady_records),
        "staleness_max": max((r.refresh.staleness_max for r in records if r.refresh),
                             default=0),
        "refreshes": refresh.refreshes if refresh else 0,
        "unchanged": refresh.unchanged if refresh else 0,
        "refresh_seconds": refresh.work_seconds if refresh else 0.0,
        "owned_blocks": [None if r.distributed is None else r.distributed.owned_blocks
                         for r in records],
        "blocks_moved": data_parallel.rebalancer.moves
        if data_parallel is not None and data_parallel.rebalancer is not None else 0,
        "factor_bytes": factor_bytes,
        "bytes_sent": 0 if moved is None else moved.bytes_sent,
        "bytes_received": 0 if moved is None else moved.bytes_received,
        "first_round_bytes": first_round_bytes,
        "bytes_per_step": steady / (args.steps - 1),
        "bytes_per_round": steady / rounds if rounds else None,
    }


if __name__ == "__main__":
    main()
