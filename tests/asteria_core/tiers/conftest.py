"""A small MLP trained by SOAP, with or without a tier store, on fixed data (CPU, 1 thread)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asteria_core.optim import SOAP
from asteria_core.policy import LivePolicy, Policy
from asteria_core.tiers import TierStore

NUM_LAYERS, WIDTH = 12, 64


@pytest.fixture(autouse=True)
def _every_test_here_on_one_thread(one_thread):
    """Bit-exact comparisons across placements need one intra-op thread throughout."""


class Run:
    """Model, SOAP (refresh every 5 steps) and optionally a tier store under a live policy."""

    def __init__(self, policy: Policy | None, run_dir: Path, seed: int = 0,
                 copies=None, cuda: bool = False) -> None:
        """`copies`: the tier store's host-copy maker (a fake CUDA's, where a test gives one);
        `cuda`: train on the GPU."""
        torch.manual_seed(seed)
        layers = []
        for _ in range(NUM_LAYERS):
            layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
        self.model = torch.nn.Sequential(*layers)
        if cuda:
            self.model.cuda()
        self.opt = SOAP(self.model.parameters(), lr=1e-2, precondition_frequency=5)
        self.live = LivePolicy(policy) if policy is not None else None
        seams = {"copies": copies} if copies is not None else {}
        self.store = None if policy is None else TierStore(self.opt, self.live, run_dir,
                                                           **seams)
        self.data = torch.Generator().manual_seed(1)
        self.steps = 0

    def train(self, steps: int) -> None:
        for _ in range(steps):
            x = torch.randn(8, WIDTH, generator=self.data).to(self.model[0].weight.device)
            self.model(x).square().mean().backward()
            self.opt.step()
            self.opt.zero_grad()
            self.steps += 1
            if self.store is not None:
                self.live.apply_pending(self.steps)
                self.store.on_boundary(self.steps)

    def params(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.model.parameters()])

    def close(self) -> None:
        if self.store is not None:
            self.store.close()


def state_bytes(run_dir: Path) -> tuple[int, int]:
    """(total SOAP state bytes, minimum working set) of the test model."""
    run = Run(Policy(), run_dir)
    total = sum(e.nbytes for e in run.store.entries)
    w = run.store.plan.slot_bytes
    run.close()
    return total, w
