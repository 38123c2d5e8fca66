"""One rank of the data-parallel suites' torchrun jobs (distributed, straggler, network,
autopilot; launched with `-m asteria_bench.ddp_rank`): `asteria train`'s own trainer, built from
the same `--section.key value` arguments, with what only a benchmark adds: Meta's Distributed
Shampoo as the optimizer (`--peer distributed_shampoo`, its source on the path, unmodified) and
refreshes emulated slower on one rank (`--slower`, slower_host.py). After the run, this rank's
measured figures go to <out>/rank<r>.json.

Bytes follow one convention (docs/architecture.md, "One byte convention"): logical payload
bytes of every collective the optimizer posts, sent (payload x receivers) plus received, per
rank; the gradients' all-reduce (or FSDP2's gathers), which every optimizer here pays alike, is
not counted.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch

from asteria_bench.slower_host import SlowerHost
from asteria_core.cli import resolve_config
from asteria_core.optim.seam import refresh_fn as default_refresh_fn
from asteria_core.telemetry.records import StepRecord
from asteria_core.telemetry.state_bytes import state_bytes
from asteria_core.train.config import DataParallelKind, RunConfig
from asteria_core.train.parallel import job_ranks
from asteria_core.train.trainer import Trainer

DISTRIBUTED_SHAMPOO = "distributed_shampoo"
EXCHANGE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def distributed_shampoo(model: torch.nn.Module, config: RunConfig,
                        exchange_dtype: str) -> torch.optim.Optimizer:
    """Distributed Shampoo in its eigenvalue-corrected (SOAP-like) configuration with the run's
    optim section (lr, betas, eps, weight decay, largest preconditioned dim), QR refresh every
    policy.refresh_interval steps, no grafting. Under DDP its DDP distributor (each rank
    computes the search directions of its blocks and all-gathers them every step) in the chosen
    exchange dtype; under FSDP2 its fully-shard distributor (each rank preconditions its own dim-0
    shards, nothing travels)."""
    import distributed_shampoo as ds  # on the path as the suite found it; never vendored

    optim, interval = config.optim, config.policy.refresh_interval

    if config.train.data_parallel == DataParallelKind.FSDP2:
        distributed_config = ds.FullyShardDistributedConfig(
            target_parameter_dimensionality=math.inf)
    else:
        distributed_config = ds.DDPDistributedConfig(
            communication_dtype=EXCHANGE_DTYPES[exchange_dtype],
            num_trainers_per_group=-1, communicate_params=False,
            target_parameter_dimensionality=math.inf)
    return ds.DistributedShampoo(
        model.parameters(), lr=optim.lr, betas=optim.betas, epsilon=optim.eps,
        weight_decay=optim.weight_decay, max_preconditioner_dim=optim.max_precond_dim,
        precondition_frequency=interval, start_preconditioning_step=interval,
        grafting_config=None,
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


def main() -> None:
    cli = argparse.ArgumentParser(epilog="Every other argument is `asteria train`'s "
                                  "(--section.key value).")
    cli.add_argument("--out", required=True, help="where rank<r>.json goes")
    cli.add_argument("--peer", choices=[DISTRIBUTED_SHAMPOO], default=None,
                     help="train this optimizer instead of optim.name's")
    cli.add_argument("--exchange-dtype", choices=sorted(EXCHANGE_DTYPES), default="fp32",
                     help="Distributed Shampoo's all-gather dtype")
    cli.add_argument("--slower", type=float, default=1.0,
                     help="refreshes emulated this many times slower (slower_host.py)")
    cli.add_argument("--slower-rank", type=int, default=None,
                     help="only this rank's refreshes are slower (default: every rank's)")
    args, rest = cli.parse_known_args()
    config = resolve_config(None, rest)
    rank = job_ranks().rank
    slower = args.slower > 1 and args.slower_rank in (None, rank)
    factory = None
    if args.peer == DISTRIBUTED_SHAMPOO:
        def factory(model: torch.nn.Module) -> torch.optim.Optimizer:
            return distributed_shampoo(model, config, args.exchange_dtype)
    trainer = Trainer(config, jsonl=False, optimizer_factory=factory,
                      refresh_fn=SlowerHost(args.slower) if slower else default_refresh_fn)
    records: list[StepRecord] = []
    trainer.runtime.add_listener(records.append)
    try:
        result = trainer.train(progress=False)
        report = figures(trainer, config, records, result.eval_losses,
                         peer=args.peer is not None)
    finally:
        trainer.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{trainer.ranks.rank}.json").write_text(json.dumps(report))


def figures(trainer: Trainer, config: RunConfig, records: list[StepRecord],
            evals: dict[int, float], peer: bool) -> dict:
    """This rank's figures; per-step ones after the first round (it holds every block's first
    eigendecomposition)."""
    skip = config.policy.refresh_interval
    step_seconds = [r.step_seconds for r in records]
    last = max(evals)
    report = {
        "rank": trainer.ranks.rank, "world": trainer.ranks.world,
        "optimizer": DISTRIBUTED_SHAMPOO if peer else config.optim.name,
        "params": trainer.model_params, "seed": config.train.seed,
        "step_ms_median": 1e3 * statistics.median(step_seconds[skip:]),
        "step_ms_mean": 1e3 * statistics.fmean(step_seconds[skip:]),
        "final_loss": records[-1].loss,
        "eval_loss": evals[last],
        "eval_at": {str(k): v for k, v in evals.items() if k != last},
        "state_bytes": sum(state_bytes(trainer.optimizer).values()),
        "step_seconds": step_seconds,
        "losses": [r.loss for r in records],
    }
    if peer:  # Distributed Shampoo: its all-gather, every step
        per_step = gathered_bytes_per_step(trainer.optimizer, trainer.ranks.world)
        return report | {"bytes_per_step": per_step, "first_round_bytes": per_step,
                         "bytes_per_round": per_step * skip, "sync_wait_ms_per_step": None,
                         "refresh_wait_ms_per_step": None, "staleness_max": 0, "refreshes": 0,
                         "factor_bytes": None}
    return report | runtime_figures(trainer, config, records)


def runtime_figures(trainer: Trainer, config: RunConfig, records: list[StepRecord]) -> dict:
    """Asteria's own figures, read after the run (close settles the exchange: every byte of
    the last round is counted). Rounds after the first fall due every `interval` steps."""
    runtime, opt = trainer.runtime, trainer.optimizer
    interval, steps = config.policy.refresh_interval, config.train.steps
    first = records[0].distributed  # the first bases, swapped in at step 1
    first_round_bytes = 0 if first is None else first.bytes_sent + first.bytes_received
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
    rounds = (steps - 1) // interval if refresh else 0
    steady_records = records[interval:]
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
        "bytes_per_step": steady / (steps - 1),
        "bytes_per_round": steady / rounds if rounds else None,
    }


if __name__ == "__main__":
    main()
