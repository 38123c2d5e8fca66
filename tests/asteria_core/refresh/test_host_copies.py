"""CUDA only: a refresh reaches the host workers as a pinned copy of its step's statistics, made
off the training stream, and its result is swapped back in on the device.

There is no GPU on the development machine or in CI, so they are deselected there (the test
summary says so); `benchmarks/gpu_check.sh` runs them on a CUDA machine.
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

pytestmark = pytest.mark.gpu  # deselected without a CUDA device (tests/conftest.py)


class Recording:
    """The real refresh, recording where each snapshot lives and what it holds."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def __call__(self, snapshot, config):
        basis = None if snapshot.basis is None else snapshot.basis.clone()
        self.seen.append((snapshot.stats_step, snapshot.key, snapshot.factor.device.type,
                          snapshot.factor.is_pinned(), snapshot.factor.clone(), basis))
        return refresh_fn(snapshot, config)


SLEEP_CYCLES = 50_000_000  # ~25 ms of GPU time: keeps work queued while the host moves on


def test_cuda_snapshots_reach_the_workers_as_host_copies_of_their_step():
    """The device is kept busy on purpose (torch.cuda._sleep): the step's factor update is still
    queued when the boundary enqueues the copies (a copy that did not wait for it would read old
    statistics), and the copies are still queued when the next step replaces and frees the lent
    tensors (memory reused before the copy ran would corrupt it)."""
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
            torch.cuda._sleep(SLEEP_CYCLES)
            opt.step()
            opt.zero_grad()
            for key in opt.due_blocks():  # what the refresh must see: device clones, no sync
                state = opt.state[opt._locate(key)[0]]
                expected[opt.num_steps, key] = (state[FACTORS][key.dim][key.chunk].clone(),
                                                state[BASES][key.dim][key.chunk].clone())
            with torch.cuda.stream(engine._host.stream):
                torch.cuda._sleep(SLEEP_CYCLES)
            engine.on_boundary(opt.num_steps)
    finally:
        engine.close()
    torch.cuda.synchronize()
    assert len(record.seen) == len(expected) > 0
    for step, key, device, pinned, factor, basis in record.seen:
        assert device == "cpu" and pinned
        want_factor, want_basis = expected[step, key]
        assert torch.equal(factor, want_factor.cpu())
        assert basis is not None and torch.equal(basis, want_basis.cpu())  # power_qr reads it
    assert engine.failures == 0
    for p in model.parameters():
        if p.dim() == 2:
            assert all(b.device.type == "cuda" for b in opt.state[p][BASES][0])
            assert torch.isfinite(p).all()
    assert all(opt.basis_version(key) >= 3 for key in {k for _, k, *_ in record.seen})
