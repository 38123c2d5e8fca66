"""One rank of a small FSDP2 (`fully_shard`) SOAP run, for the tests: launched by
torch.distributed.run, or alone with --single (the single-process blocked reference).

Under FSDP2 every rank holds rows [r * n / world, (r + 1) * n / world) of every parameter and
preconditions that shard as a tensor of its own. The reference is the same model with each
parameter stored as `world` such row pieces (separate parameters, concatenated in forward), on
the whole global batch, with the same policy: the same blocks, the same swap schedule.

Writes <out>/rank<r>.pt (the full parameters, gathered) and <out>/rank<r>.json (factor bytes,
blocks, refreshes). With --checkpoint-at K it saves a checkpoint at step K (the model's sharded
state through torch.distributed.checkpoint, each rank's optimizer and runtime state in a file of
its own); launched again on a folder holding that checkpoint, it resumes from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import ddp_train  # this script's folder
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ddp_train import GLOBAL_BATCH, POLICY
from torch import nn

import asteria_core as asteria
from asteria_core.distributed import init_process_group

IN, HIDDEN, OUT = 12, 24, 48


def make_net() -> ddp_train.Net:
    """ddp_train's regression MLP, shaped so that every shard of a weight on 2 ranks is square
    ((12, 12) and (24, 24)): both factors of a shard have full rank from the first step. (A
    rank-deficient factor ties eigenvalues at zero, and there the eigenvectors follow rounding
    noise, so runs that differ by rounding, as a reduce-scatter and one process do, part ways.)"""
    return ddp_train.Net((IN, HIDDEN, OUT))


def global_batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return ddp_train.global_batches(steps, IN, OUT)


class SplitLinear(nn.Module):
    """nn.Linear whose weight and bias are kept as `pieces` row blocks (separate parameters)."""

    def __init__(self, full: nn.Linear, pieces: int) -> None:
        super().__init__()
        self.weights = nn.ParameterList(p.detach().clone() for p in full.weight.chunk(pieces))
        self.biases = nn.ParameterList(p.detach().clone() for p in full.bias.chunk(pieces))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, torch.cat(list(self.weights)), torch.cat(list(self.biases)))


class SplitNet(nn.Module):
    """Net with every parameter split into the row pieces FSDP2 gives `world` ranks."""

    def __init__(self, net: nn.Module, world: int) -> None:
        super().__init__()
        self.hidden, self.out = SplitLinear(net.hidden, world), SplitLinear(net.out, world)

    forward = ddp_train.Net.forward

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return {f"{name}.{kind}": torch.cat([p.detach() for p in getattr(layer, pieces)])
                for name, layer in (("hidden", self.hidden), ("out", self.out))
                for kind, pieces in (("weight", "weights"), ("bias", "biases"))}


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--steps", type=int, default=30)
    cli.add_argument("--out", required=True)
    cli.add_argument("--single", type=int, default=0, metavar="WORLD",
                     help="the single-process reference for a run of WORLD ranks")
    cli.add_argument("--checkpoint-at", type=int, default=0)
    args = cli.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float64)  # as ddp_train: rounding stays far below 1e-5
    rank, world = 0, args.single
    if not args.single:
        init_process_group("gloo")  # restartable in place
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    if args.single:
        model = SplitNet(make_net(), world)
    else:
        from torch.distributed.fsdp import fully_shard

        model = make_net()
        for layer in (model.hidden, model.out):
            fully_shard(layer)
        fully_shard(model)
    opt = asteria.build_optimizer("soap", model.parameters(), lr=1e-2, refresh_dtype="float64",
                                  refresh_interval=POLICY.refresh_interval)
    ckpt = Path(args.out) / "ckpt"
    start, policy = 0, POLICY
    if (ckpt / f"rank{rank}.pt").is_file():  # launched again: resume the checkpoint
        model_state = {"model": model.state_dict()}
        dcp.load(model_state, checkpoint_id=str(ckpt / "model"))
        model.load_state_dict(model_state["model"])
        state = torch.load(ckpt / f"rank{rank}.pt", weights_only=True)  # our own file
        opt.load_state_dict(state["optimizer"])
        start = state["runtime"]["step"]
        live = state["runtime"]["policy"]
        policy = asteria.LivePolicy(asteria.Policy(**live["current"]), version=live["version"],
                                    start_step=start)
    runtime = asteria.Runtime(opt, model=model, config=asteria.RuntimeConfig(
        policy=policy, start_step=start,
        telemetry=asteria.TelemetryConfig(nvml=False, rapl=False), run_id=f"fsdp-rank{rank}"))
    records = []
    runtime.add_listener(records.append)
    share = GLOBAL_BATCH // world
    for step, (x, y) in enumerate(global_batches(args.steps)):
        if step < start:
            continue
        if step and step == args.checkpoint_at:
            runtime.settle()  # refreshes in flight go into the optimizer's state
            ckpt.mkdir(parents=True, exist_ok=True)
            dcp.save({"model": model.state_dict()}, checkpoint_id=str(ckpt / "model"))
            scratch = ckpt / f"rank{rank}.tmp"
            torch.save({"optimizer": opt.state_dict(), "runtime": runtime.state_dict()}, scratch)
            os.replace(scratch, ckpt / f"rank{rank}.pt")
        if args.single:
            _, loss = model(x, y)
        else:
            _, loss = model(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    factor_bytes = sum(f.numel() * f.element_size() for state in opt.state.values()
                       for dims in state.get("factors", []) if dims is not None for f in dims)
    engine = runtime.refresh
    runtime.close()
    if args.single:
        params = model.full_parameters()
    else:
        params = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(params, out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world": world, "factor_bytes": factor_bytes,
        "refreshes": engine.refreshes, "blocks": len(opt.refresh_blocks()),
        "exchange": runtime.exchange is not None, "first_step": records[0].step,
        "distributed": None if records[-1].distributed is None else
        dataclasses.asdict(records[-1].distributed),
        "staleness_max": max(r.refresh.staleness_max for r in records),
        "boundaries": len(records),
    }))
    if not args.single:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
