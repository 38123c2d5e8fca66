"""Data-parallel Asteria: DDP for the gradients, owner ranks for the refreshes, the control plane
on rank 0 and every rank's /metrics for Prometheus. With --fsdp, FSDP2 (`fully_shard`) instead:
every rank holds and preconditions its own shards of the parameters.

    torchrun --nproc-per-node 2 examples/ddp_loop.py --steps 300
    torchrun --nproc-per-node 2 examples/ddp_loop.py --fsdp
    # two machines: on each, with its --node-rank
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 examples/ddp_loop.py
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import asteria_core as asteria
import backend
from asteria_core.distributed import init_process_group, serve_rank_metrics
from asteria_core.train.data import BatchLoader, encode, load_corpus, split_tokens
from asteria_core.train.model import GPT, ModelConfig


def main(argv: list[str] | None = None) -> list[float]:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--steps", type=int, default=300)
    cli.add_argument("--port", type=int, default=int(os.environ.get("ASTERIA_PORT", "8000")),
                     help="rank 0's control plane (default ASTERIA_PORT or 8000); 0: any free "
                     "port; -1: none")
    cli.add_argument("--metrics-port", type=int, default=9400,
                     help="rank r > 0 serves /metrics on PORT + r; 0: any free port; -1: none")
    cli.add_argument("--data-dir", default="asteria-data")
    cli.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2")
    args = cli.parse_args(argv)
    # torchrun --max-restarts can restart the ranks in place: a fresh store prefix per attempt
    init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device("cpu")
    if torch.cuda.is_available():  # one GPU per rank
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    torch.manual_seed(1337)  # the same initial model on every rank
    train, _ = split_tokens(encode(load_corpus("")), 0.1, 64)
    loader = BatchLoader(train, block_size=64, batch_size=8, seed=1337 + rank)  # own batches
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=64, block_size=64)).to(device)
    if args.fsdp:  # each block a unit of its own, the rest (tied embedding included) the root's
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6

        for block in model.blocks:
            fully_shard(block)
        net = fully_shard(model)
    else:
        net = DistributedDataParallel(model)
    opt = asteria.optimizer(model, "soap", lr=3e-3, policy=asteria.Policy(staleness_bound=5))
    plane = None
    if rank == 0 and args.port >= 0:  # its PATCHes reach every rank at one step
        plane = backend.serve(opt.runtime, port=args.port, data_dir=args.data_dir)
        print(f"asteria: control plane on {plane.url} (token in {args.data_dir}/token)",
              flush=True)
    elif rank > 0 and args.metrics_port >= 0:
        serve_rank_metrics(opt.runtime.telemetry, rank, base_port=args.metrics_port,
                           targets_dir=f"{args.data_dir}/targets")
    losses = []
    with opt.runtime:
        for _ in range(args.steps):
            _, loss = net(*(t.to(device) for t in loader.next_batch()))
            loss.backward()
            opt.step()  # owners refresh their blocks; every rank swaps new bases at one step
            opt.zero_grad()
            losses.append(loss.item())
    if plane is not None:
        plane.close()
    dist.destroy_process_group()
    print(f"rank {rank}: final loss {losses[-1]:.4f}")
    return losses


if __name__ == "__main__":
    main()
