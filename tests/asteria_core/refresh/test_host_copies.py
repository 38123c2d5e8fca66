"""CUDA only: a refresh reaches the host workers as a pinned copy of its step's statistics, made
off the training stream, and its result is swapped back in on the device.

There is no GPU on the development machine or in CI, so these skip there (loudly, with the
reason); `benchmarks/gpu_check.sh` runs them on a CUDA machine.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from asteria_core.optim import SOAP
from asteria_core.optim.base import BASES, FACTORS
from asteria_core.optim.seam import refresh_fn
from asteria_core.policy import LivePolicy, Policy
from asteria_core.refresh import RefreshEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA device: snapshots are copied to the host only from one "
           "(run benchmarks/gpu_check.sh on a GPU machine)")]


class Recording:
    """The real refresh, recording where each snapshot lives and what it holds."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def __call__(self, snapshot, config):
        self.seen.append((snapshot.stats_step, snapshot.key, snapshot.factor.device.type,
                          snapshot.factor.is_pinned(), snapshot.factor.clone()))
        return refresh_fn(snapshot, config)


def test_cuda_snapshots_reach_the_workers_as_host_copies_of_their_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 6)).cuda()
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=3)
    record = Recording()
    engine = RefreshEngine(opt, LivePolicy(Policy(refresh_interval=3, swap_delay=1)),
                           fn=record)
    expected = {}
    try:
        for _ in range(12):
            x = torch.randn(32, 12, device="cuda")
            nn.functional.mse_loss(model(x), x[:, :6]).backward()
            opt.step()
            opt.zero_grad()
            for key in opt.due_blocks():  # the statistics the refresh must see, read here
                p = opt._locate(key)[0]
                expected[opt.num_steps, key] = \
                    opt.state[p][FACTORS][key.dim][key.chunk].cpu()
            engine.on_boundary(opt.num_steps)
    finally:
        engine.close()
    assert len(record.seen) == len(expected) > 0
    for step, key, device, pinned, factor in record.seen:
        assert device == "cpu" and pinned
        assert torch.equal(factor, expected[step, key])
    assert engine.failures == 0
    for p in model.parameters():
        if p.dim() == 2:
            assert all(b.device.type == "cuda" for b in opt.state[p][BASES][0])
            assert torch.isfinite(p).all()
    assert all(opt.basis_version(key) >= 3 for key in {k for _, k, *_ in record.seen})
