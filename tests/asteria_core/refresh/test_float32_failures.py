"""float32 decompositions that fail on ill-conditioned factors (the failure most
reported by Shampoo and SOAP users at large dims).

A refresh whose float32 computation fails (the solver raises, or a finite factor gives NaN or
infinite values) is computed again in float64. A factor no dtype can help (NaN or infinite
entries) is a failure: the engine keeps the basis in use and counts it; nothing non-finite is
ever swapped in.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from asteria_core.optim import SOAP
from asteria_core.optim.seam import (
    BlockKey,
    FactorSnapshot,
    NonFiniteResult,
    RefreshConfig,
    checked_refresh,
    is_finite,
    refresh_fn,
)
from asteria_core.policy import LivePolicy, Policy
from asteria_core.refresh import RefreshEngine

pytestmark = pytest.mark.usefixtures("one_thread")

B = 64


def _overflowing_factor(b: int = B) -> torch.Tensor:
    """Finite and PSD, entries near float32's largest: the power iteration's A Q sums b of them
    and overflows in float32 (its eigh rescales and survives); float64 has room to spare."""
    g = torch.Generator().manual_seed(0)
    v = 1.0 + 0.01 * torch.randn(b, 1, generator=g, dtype=torch.float64)
    a = v @ v.T + 1e-3 * torch.eye(b, dtype=torch.float64)
    return (a * (1e38 / a.max())).float()


def _constant_column_basis(b: int = B) -> torch.Tensor:
    """An orthogonal basis whose first column is constant (the factor's leading direction)."""
    g = torch.Generator().manual_seed(1)
    m = torch.randn(b, b, generator=g, dtype=torch.float64)
    m[:, 0] = 1.0
    q, _ = torch.linalg.qr(m)
    return q.float()


def _snapshot(factor: torch.Tensor, version: int = 1) -> FactorSnapshot:
    return FactorSnapshot(key=BlockKey(0, 0, 0), stats_step=5, base_version=version,
                          factor=factor, basis=_constant_column_basis(factor.shape[0]))


@pytest.mark.parametrize("moment_swap", ["reference", "transport"])
def test_a_float32_overflow_is_computed_again_in_float64(moment_swap):
    snapshot = _snapshot(_overflowing_factor())
    config = RefreshConfig(method="power_qr", moment_swap=moment_swap, rotate=True)
    assert torch.isfinite(snapshot.factor).all()
    result = refresh_fn(snapshot, config)
    assert is_finite(result) and result.basis.dtype == torch.float32
    wide = refresh_fn(snapshot, dataclasses.replace(config, dtype="float64"))
    assert torch.equal(result.basis, wide.basis)  # the float64 refresh, cast back
    eye = torch.eye(B)
    assert torch.allclose(result.basis.T @ result.basis, eye, atol=1e-4)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("method", ["eigh", "power_qr"])
def test_a_non_finite_factor_is_a_failure_never_a_basis(bad, method):
    factor = _overflowing_factor() / 1e37
    factor[3, 3] = bad
    snapshot = _snapshot(factor, version=1)
    with pytest.raises((torch.linalg.LinAlgError, NonFiniteResult)):
        checked_refresh(refresh_fn, snapshot, RefreshConfig(method=method, rotate=True))


class IllConditioned:
    """The real refresh of the real snapshot, except that the statistics of `steps` are
    replaced by a factor built to break float32 (`overflow`) or any dtype (`nan`)."""

    def __init__(self, steps: set[int], how: str) -> None:
        self.steps, self.how = steps, how

    def __call__(self, snapshot, config):
        if snapshot.stats_step in self.steps and snapshot.factor.shape[0] == B:
            factor = _overflowing_factor()
            if self.how == "nan":
                factor = factor / 1e37
                factor[0, 0] = float("nan")
            snapshot = dataclasses.replace(snapshot, factor=factor)
        return refresh_fn(snapshot, config)


@pytest.mark.parametrize("how", ["overflow", "nan"])
def test_the_engine_keeps_the_basis_and_counts_only_real_failures(how):
    torch.manual_seed(0)
    model = nn.Linear(8, B, bias=False)  # weight (B, 8): a B-wide factor on dim 0
    opt = SOAP(model.parameters(), lr=1e-2, precondition_frequency=2)
    bad_step = 5  # refreshes fall due at steps 1, 3, 5, 7
    engine = RefreshEngine(opt, LivePolicy(Policy(refresh_interval=2, staleness_bound=1,
                                                  workers=1, failure_limit=5)),
                           fn=IllConditioned({bad_step}, how))
    key = BlockKey(0, 0, 0)
    bases = {}
    try:
        for _ in range(8):
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            engine.on_boundary(opt.num_steps)
            bases[opt.num_steps] = (opt.basis_version(key), opt.state[model.weight]["bases"][0][0])
    finally:
        engine.close()
    swap_step = bad_step + 1  # d = S = 1
    version_before, basis_before = bases[swap_step - 1]
    version_after, basis_after = bases[swap_step]
    assert all(torch.isfinite(b).all() for _, b in bases.values())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    if how == "overflow":
        assert engine.failures == 0
        assert version_after == version_before + 1
    else:
        assert engine.failures == 1
        assert version_after == version_before and basis_after is basis_before
