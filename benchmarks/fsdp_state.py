"""Optimizer state per rank under FSDP2, by kind: Asteria SOAP (factors as full squares or
packed) against Distributed Shampoo's fully-shard distributor (issue 27: why the distributed
suite's FSDP2 row kept 1.23x its state with full-square factors).

The distributed suite's FSDP2 model (2 layers, n_embd 128), 12 steps on random tokens (state
sizes do not depend on the data); rank 0 prints one JSON line: KiB by state kind and in all.

    .venv/bin/torchrun --nproc-per-node 2 benchmarks/fsdp_state.py soap|packed|ds

`ds` needs Distributed Shampoo's source on PYTHONPATH (or ASTERIA_DISTRIBUTED_SHAMPOO, as the
suite takes it).
"""

import collections
import dataclasses
import json
import os
import sys
import types

import torch
import torch.distributed as dist

import asteria_core as asteria
from asteria_bench import ddp_rank
from asteria_core.train.config import ModelConfig
from asteria_core.train.model import GPT

STEPS = 12


def by_kind(obj, kind: str, out: collections.Counter, seen: set) -> None:
    """Bytes of this rank's tensors under each innermost named field (each tensor once)."""
    if isinstance(obj, torch.Tensor):
        out[kind] += ddp_rank.state_bytes(obj, seen)  # the suite's count: this rank's, once
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            by_kind(getattr(obj, f.name), f.name, out, seen)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            by_kind(v, k.rsplit(".", 1)[-1] if isinstance(k, str) else kind, out, seen)
    elif isinstance(obj, list | tuple):
        for v in obj:
            by_kind(v, kind, out, seen)


def main() -> None:
    which = sys.argv[1]
    if which == "ds" and (path := os.environ.get("ASTERIA_DISTRIBUTED_SHAMPOO")):
        sys.path.insert(0, path)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=4, n_embd=128, block_size=64))
    net = ddp_rank.shard(model)
    if which == "ds":
        opt = ddp_rank.distributed_shampoo(model, types.SimpleNamespace(interval=10, fsdp=True))
    else:
        opt = asteria.optimizer(model, "soap", lr=ddp_rank.LR,
                                policy=asteria.Policy(refresh_interval=10, staleness_bound=5),
                                telemetry=asteria.TelemetryConfig(nvml=False, rapl=False),
                                pack_factors=which == "packed")
    for _ in range(STEPS):
        x = torch.randint(0, model.lm_head.out_features, (8, 64))
        net(x, x)[1].backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if which != "ds":
            opt.runtime.end_step()
    kinds: collections.Counter = collections.Counter()
    by_kind(list(opt.state.values()), "state", kinds, set())
    if dist.get_rank() == 0:
        print(json.dumps({"optimizer": which, "state_kib": sum(kinds.values()) // 1024,
                          "by_kind_kib": {k: v // 1024 for k, v in kinds.most_common()}}))
    if which != "ds":
        opt.runtime.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
