"""One rank of the `distributed` suite's runs (launched by torch.distributed.run with
`-m asteria_bench.ddp_rank`): a GPT trained with DDP and the runtime attached; writes
<out>/rank<r>.json with its measured figures."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import asteria_core as asteria
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


@torch.no_grad()
def evaluate(model: GPT, tokens: torch.Tensor, block_size: int) -> float:
    """Validation loss on fixed batches (the same on every rank and every configuration)."""
    model.eval()
    losses = [model(x, y)[1] for x, y in fixed_eval_batches(tokens, block_size, 8, 8)]
    model.train()
    return torch.stack(losses).mean().item()


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--out", required=True)
    cli.add_argument("--optimizer", default="soap")
    cli.add_argument("--steps", type=int, default=40)
    cli.add_argument("--interval", type=int, default=10)
    cli.add_argument("--bound", type=int, default=5)
    cli.add_argument("--delay", default="auto")
    cli.add_argument("--workers", type=int, default=1)
    cli.add_argument("--coherence", type=float, default=0.0,
                     help="skip (and send no) refresh whose basis moved less than this")
    cli.add_argument("--allgather", action="store_true",
                     help="also all-gather a parameter-sized buffer every step (Distributed "
                          "Shampoo's search-direction exchange), to time it here")
    cli.add_argument("--seed", type=int, default=0,
                     help="model initialisation seed; rank r reads batches with seed 1337 + "
                          "100 * seed + r")
    cli.add_argument("--n-layer", type=int, default=2)
    cli.add_argument("--n-embd", type=int, default=128)
    cli.add_argument("--block-size", type=int, default=64)
    args = cli.parse_args()
    model_config = ModelConfig(n_layer=args.n_layer, n_head=4, n_embd=args.n_embd,
                               block_size=args.block_size)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = GPT(model_config)
    net = DistributedDataParallel(model)
    delay = args.delay if args.delay == "auto" else int(args.delay)
    policy = asteria.Policy(refresh_interval=args.interval, staleness_bound=args.bound,
                            swap_delay=delay, workers=args.workers)
    opt = asteria.optimizer(model, args.optimizer, lr=3e-3, policy=policy,
                            telemetry=asteria.TelemetryConfig(nvml=False, rapl=False),
                            **({"coherence_threshold": args.coherence} if args.coherence else {}))
    runtime = opt.runtime
    records = []
    runtime.add_listener(records.append)
    tokens, tokens_val = split_tokens(encode(load_corpus("")), 0.1, model_config.block_size)
    loader = BatchLoader(tokens, model_config.block_size, BATCH, seed=1337 + 100 * args.seed + rank)
    n_params = sum(p.numel() for p in model.parameters())
    gather_in = torch.zeros(n_params // world + 1)
    gather_out = [torch.zeros_like(gather_in) for _ in range(world)]
    gather_seconds = []
    step_seconds = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        x, y = loader.next_batch()
        _, loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.allgather:
            t1 = time.perf_counter()
            dist.all_gather(gather_out, gather_in)
            gather_seconds.append(time.perf_counter() - t1)
        runtime.end_step()
        step_seconds.append(time.perf_counter() - t0)
    refresh, exchange = runtime.refresh, runtime.exchange
    factor_bytes = sum(f.numel() * f.element_size() for state in opt.state.values()
                       for dims in state.get("factors", []) if dims is not None for f in dims)
    runtime.close()
    skip = args.interval  # the first round holds every block's first eigendecomposition
    steady = records[skip:]
    report = {
        "rank": rank, "world": world, "optimizer": args.optimizer, "params": n_params,
        "step_ms_median": 1e3 * statistics.median(step_seconds[skip:]),
        "step_ms_mean": 1e3 * statistics.fmean(step_seconds[skip:]),
        "sync_wait_ms_per_step": 1e3 * statistics.fmean(
            r.timing.idle_seconds["sync_wait"] for r in steady),
        "refresh_wait_ms_per_step": 1e3 * statistics.fmean(
            r.timing.idle_seconds["refresh_wait"] for r in steady),
        "staleness_max": max((r.refresh.staleness_max for r in records if r.refresh), default=0),
        "refreshes": refresh.refreshes if refresh else 0,
        "unchanged": refresh.unchanged if refresh else 0,
        "final_loss": records[-1].loss,
        "eval_loss": evaluate(model, tokens_val, model_config.block_size),
        "refresh_seconds": refresh.work_seconds if refresh else 0.0,
        "factor_bytes": factor_bytes,
        "bytes_sent": exchange.bytes_sent if exchange else 0,
        "bytes_received": exchange.bytes_received if exchange else 0,
        "allgather_ms_per_step": 1e3 * statistics.fmean(gather_seconds) if gather_seconds
        else None,
        "allgather_bytes_per_step": (world - 1) * gather_in.numel() * 4 if gather_seconds
        else None,
        "step_seconds": step_seconds,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
