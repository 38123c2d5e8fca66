"""One rank of a small data-parallel SOAP run, for the tests: launched by torch.distributed.run
(or alone with --single, the single-process reference on the same global batch).

Writes <out>/rank<r>.pt (the parameters) and <out>/rank<r>.json (per-step staleness and waits,
bytes exchanged, blocks owned). With --checkpoint-every, a rank that finds its checkpoint resumes
from it: after a relaunch of the job, or after torchrun restarted it in place (--max-restarts).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import asteria_core as asteria
from asteria_core.autopilot import AutopilotConfig
from asteria_core.distributed import init_process_group, serve_rank_metrics
from asteria_core.optim.seam import refresh_fn
from asteria_core.tiers.lifecycle import leaves

GLOBAL_BATCH, IN, HIDDEN, OUT = 64, 24, 24, 24
POLICY = asteria.Policy(refresh_interval=3, staleness_bound=2, swap_delay=2, workers=1)


class Net(nn.Module):
    """A small regression MLP: its factor statistics have full rank from the first step (a
    GPT's embedding factor does not: rows of unseen tokens make eigenvalues tie at zero, and
    the eigenvectors there follow rounding noise, so runs that differ by rounding part ways)."""

    def __init__(self, dims: tuple[int, int, int] = (IN, HIDDEN, OUT)) -> None:
        super().__init__()
        n_in, hidden, n_out = dims
        self.hidden, self.out = nn.Linear(n_in, hidden), nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pred = self.out(torch.tanh(self.hidden(x)))
        return pred, nn.functional.mse_loss(pred, y)


def global_batches(steps: int, n_in: int = IN,
                   n_out: int = OUT) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1234)
    teacher = torch.randn(n_in, n_out, generator=g)
    batches = []
    for _ in range(steps):
        x = torch.randn(GLOBAL_BATCH, n_in, generator=g)
        batches.append((x, torch.sin(x @ teacher)))
    return batches


def slow(seconds: float):
    def refresh(snapshot, config):
        time.sleep(seconds)
        return refresh_fn(snapshot, config)
    return refresh


def main() -> None:
    cli = argparse.ArgumentParser()
    cli.add_argument("--steps", type=int, default=30)
    cli.add_argument("--out", required=True)
    cli.add_argument("--single", action="store_true")
    cli.add_argument("--slow-rank", type=int, default=-1)
    cli.add_argument("--slow-seconds", type=float, default=0.0)
    cli.add_argument("--optimizer", default="soap")
    cli.add_argument("--metrics-port", type=int, default=-1,
                     help="serve /metrics on PORT + rank (0: any free port; -1: none)")
    cli.add_argument("--every-rank-refreshes", action="store_true",
                     help="no owner ranks: each rank refreshes every block (a reference)")
    cli.add_argument("--coherence", type=float, default=0.0,
                     help="skip (and send no) refresh whose basis moved less than this")
    cli.add_argument("--checkpoint-every", type=int, default=0,
                     help="every N steps each rank writes its checkpoint under <out>/ckpt")
    cli.add_argument("--state", default="replicated", help="replicated | sharded")
    cli.add_argument("--rebalance-rounds", type=int, default=0,
                     help="share refresh speeds every N rounds; owners move off a straggler")
    cli.add_argument("--update-dtype", default="exact", help="the sharded mode's: exact | bf16")
    cli.add_argument("--die-at-step", type=int, default=0,
                     help="rank 1 kills itself (SIGKILL) at this step, in the first attempt")
    cli.add_argument("--autopilot", action="store_true",
                     help="the autopilot applies its changes (rank 0 decides)")
    args = cli.parse_args()
    torch.set_num_threads(1)
    # float64 throughout: DDP's averaged gradient and the single process's differ by rounding,
    # and eigenvectors amplify it; at 1e-16 it stays far below the 1e-5 the test allows.
    torch.set_default_dtype(torch.float64)
    rank, world = 0, 1
    if not args.single:
        init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Net()
    net = DistributedDataParallel(model) if world > 1 else model
    options = {} if args.optimizer == "adamw" else {"refresh_interval": POLICY.refresh_interval,
                                                     "refresh_dtype": "float64"}
    opt = asteria.build_optimizer(args.optimizer, model.parameters(), lr=1e-2, **options)
    fn = slow(args.slow_seconds) if rank == args.slow_rank else refresh_fn
    ckpt = Path(args.out) / "ckpt" / f"rank{rank}.pt"
    start, policy = 0, POLICY
    if ckpt.is_file():  # a restart (torchrun --max-restarts): resume this rank's checkpoint
        state = torch.load(ckpt, weights_only=False)  # our own file, written below
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["runtime"]["step"]
        live = state["runtime"]["policy"]
        policy = asteria.LivePolicy(asteria.Policy(**live["current"]), version=live["version"],
                                    start_step=start)
    threads_before = threads()  # the runtime's own threads, gloo's included, end at its close
    runtime = asteria.Runtime(opt, model=model, config=asteria.RuntimeConfig(
        policy=policy, refresh_fn=fn, start_step=start, coherence_threshold=args.coherence,
        telemetry=asteria.TelemetryConfig(nvml=False, rapl=False), run_id=f"ddp-rank{rank}",
        distributed=False if args.every_rank_refreshes else None,
        distributed_state=args.state, update_dtype=args.update_dtype,
        rebalance_rounds=args.rebalance_rounds,
        autopilot=AutopilotConfig(mode="apply", window=5, settle=1, spacing=6, guard_steps=5,
                                  bounds={"refresh_interval": (3, 24)})
        if args.autopilot else None))
    records = []
    runtime.add_listener(records.append)
    metrics_port, server_threads = None, threads()
    if args.metrics_port >= 0 and world > 1:
        metrics_port = serve_rank_metrics(runtime.telemetry, rank, base_port=args.metrics_port,
                                          targets_dir=Path(args.out) / "targets")
    server_threads = threads() - server_threads  # the /metrics server outlives the runtime
    share = GLOBAL_BATCH // world
    change, refused = None, None
    for step, (x, y) in enumerate(global_batches(args.steps)):
        if step < start:
            continue
        if args.die_at_step and step == args.die_at_step and rank == 1 and \
                os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        if step and args.checkpoint_every and step % args.checkpoint_every == 0:
            runtime.settle()  # refreshes in flight go into the optimizer's state, on every rank
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                        "runtime": runtime.state_dict()}, ckpt.with_suffix(".tmp"))
            os.replace(ckpt.with_suffix(".tmp"), ckpt)
        if step == 5 and world > 1 and not args.autopilot:  # the same swaps: d stays 2
            try:
                change = runtime.policy.propose({"staleness_bound": 3}).effective_step
            except asteria.PolicyError as err:  # on the ranks other than 0
                refused = str(err)
        _, loss = net(x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    exchange, engine = runtime.exchange, runtime.refresh
    policy_sync = None if runtime.data_parallel is None else runtime.data_parallel.policy_sync
    scraped = "" if metrics_port is None else urllib.request.urlopen(
        f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    factor_bytes = sum(f.numel() * f.element_size() for state in opt.state.values()
                       for dims in state.get("factors", []) if dims is not None for f in dims)
    runtime.close()
    threads_left = threads() - threads_before - server_threads
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save({n: p.detach().clone() for n, p in model.named_parameters()}, out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world": world, "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
        "attempt": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0)),
        "steps": [{"step": r.step, "loss": r.loss, "policy_version": r.policy_version,
                   "sync_wait": r.timing.idle_seconds["sync_wait"],
                   "refresh_wait": r.timing.idle_seconds["refresh_wait"],
                   "owned_blocks": None if r.distributed is None else
                   r.distributed.owned_blocks,
                   **({} if r.refresh is None else {
                       "staleness_max": r.refresh.staleness_max,
                       "staleness_bound": r.refresh.staleness_bound,
                       "failures": r.refresh.failures})} for r in records],
        "run_id": runtime.run_id, "metrics": scraped, "metrics_port": metrics_port,
        "distributed": None if records[-1].distributed is None else
        dataclasses.asdict(records[-1].distributed),
        "policy_change_effective_step": change, "policy_change_refused": refused,
        "history": [[c.version, c.effective_step] for c in runtime.policy.history()],
        "changes": [[c.version, c.effective_step, c.client, c.reason, {k: list(v) for k, v in
                                                                       c.diff.items()}]
                    for c in runtime.policy.history()],
        "factor_bytes": factor_bytes, "refreshes": engine.refreshes,
        "unchanged": engine.unchanged,
        "refresh_seconds": engine.work_seconds,
        "owned": None if exchange is None else sum(exchange.owns(k) for k in exchange.owners),
        "blocks": None if exchange is None else len(exchange.owners),
        "bytes_sent": None if exchange is None else exchange.bytes_sent,
        "bytes_received": None if exchange is None else exchange.bytes_received,
        "policy_bytes": None if policy_sync is None else
        [policy_sync.bytes_sent, policy_sync.bytes_received],
        "boundaries": len(records), "threads_left": threads_left,
        "state_bytes": sum(t.numel() * t.element_size() for state in opt.state.values()
                           for _, t in leaves(state)),
        "stateful_params": sorted(i for i, p in enumerate(model.parameters())
                                  if opt.state.get(p)),
    }))
    if world > 1:
        dist.destroy_process_group()


def threads() -> int:
    """This process's threads, those of C++ (gloo's) included."""
    return len(os.listdir("/proc/self/task"))


if __name__ == "__main__":
    main()
