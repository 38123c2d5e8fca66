"""Where a SOAP optimizer step spends its time: ours (native, refresh inline) against the peers.

    .venv/bin/python benchmarks/profile_soap.py --steps 40            # optimizer-step times
    .venv/bin/python benchmarks/profile_soap.py --steps 20 --profile  # + torch.profiler tables

The issue-19 model (GPT d=256, 4 layers, batch 16 x 128, refresh every 10 steps, 2 threads); one
forward/backward gives fixed gradients, then each optimizer steps on them in interleaved turns of
10 steps (machine drift falls on all alike). Reports optimizer-step ms: p50 over the steps that do
not refresh, the mean, and the mean of the refresh steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asteria_bench import peers  # noqa: E402
from asteria_core.optim import SOAP  # noqa: E402
from asteria_core.runtime.factory import decay_groups  # noqa: E402
from asteria_core.train.config import ModelConfig  # noqa: E402
from asteria_core.train.model import GPT  # noqa: E402

HP = {"lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
      "refresh_interval": 10, "max_precond_dim": 10000, "shampoo_beta": -1.0}


def make(name: str):
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=128))
    groups = decay_groups(model, HP["weight_decay"])
    if name == "ours":
        opt = SOAP(groups, lr=HP["lr"], betas=HP["betas"], eps=HP["eps"],
                   precondition_frequency=HP["refresh_interval"], block_size=1024)
    elif name == "adamw":
        opt = torch.optim.AdamW(groups, lr=HP["lr"], betas=HP["betas"], eps=HP["eps"])
    else:
        opt = peers.build_peer(name, groups, **HP)
    x = torch.randint(0, 256, (16, 129), generator=torch.Generator().manual_seed(1))
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    grads = [(p, p.grad.detach().clone()) for p in model.parameters()]
    return opt, grads


def step(run) -> float:
    """One optimizer step on the fixed gradients (set afresh: heavyball consumes them)."""
    opt, grads = run
    for p, g in grads:
        p.grad = g.clone()
    t = time.perf_counter()
    opt.step()
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--names", default="adamw,ours,pytorch-optimizer-soap,heavyball-soap")
    args = parser.parse_args()
    torch.set_num_threads(2)
    names = args.names.split(",")
    runs = {n: make(n) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    for n in names:  # warm-up turn: first calls, heavyball's compilation
        for _ in range(10):
            step(runs[n])
    for _ in range(args.steps // 10):
        for n in names:
            for _ in range(10):
                times[n].append(step(runs[n]))
    print(f"{'optimizer':28s} {'p50 ms':>8s} {'mean ms':>8s} {'refresh-step ms':>16s}")
    for n in names:
        ts = times[n]
        slow = max(range(10), key=lambda i: statistics.fmean(ts[i::10]))  # the refresh slot
        rest = [t for i, t in enumerate(ts) if i % 10 != slow]
        print(f"{n:28s} {1e3 * statistics.median(rest):8.1f} {1e3 * statistics.fmean(ts):8.1f} "
              f"{1e3 * statistics.fmean(ts[slow::10]):16.1f}")
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        for n in names:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    step(runs[n])
            print(f"== {n}: 10 steps (one refresh)")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    main()
