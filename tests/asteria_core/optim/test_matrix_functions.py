"""Matrix functions against closed forms: identity, diagonal, tridiagonal, rank-deficient."""

from __future__ import annotations

import math

import pytest
import torch

from asteria_core.optim.matrix_functions import (
    diag_in_basis,
    eigh_descending,
    inverse_root,
    off_diagonal_ratio,
    overlap_transport,
    power_qr,
    power_qr_sorted,
)

F64 = torch.float64


def tridiagonal(n: int) -> torch.Tensor:
    """tridiag(-1, 2, -1): eigenvalues 2 - 2 cos(k pi / (n + 1)), k = 1..n."""
    return 2 * torch.eye(n, dtype=F64) - torch.diag(torch.ones(n - 1, dtype=F64), 1) \
        - torch.diag(torch.ones(n - 1, dtype=F64), -1)


def tridiagonal_eigenvalues(n: int) -> torch.Tensor:
    k = torch.arange(1, n + 1, dtype=F64)
    return (2 - 2 * torch.cos(k * math.pi / (n + 1))).flip(0)  # descending


def rank_deficient(n: int, rank: int) -> torch.Tensor:
    b = torch.randn(n, rank, dtype=F64, generator=torch.Generator().manual_seed(0))
    return b @ b.T


def _orthogonal(q):
    torch.testing.assert_close(q.T @ q, torch.eye(q.shape[0], dtype=q.dtype), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_eigh_identity(dtype):
    vals, q = eigh_descending(torch.eye(5, dtype=dtype), dtype)
    torch.testing.assert_close(vals, torch.ones(5, dtype=dtype))
    torch.testing.assert_close(q.T @ q, torch.eye(5, dtype=dtype))


def test_eigh_diagonal_is_a_sorted_permutation():
    d = torch.tensor([3.0, 7.0, 1.0, 5.0], dtype=F64)
    vals, q = eigh_descending(torch.diag(d), F64)
    torch.testing.assert_close(vals, torch.tensor([7.0, 5.0, 3.0, 1.0], dtype=F64))
    torch.testing.assert_close(q.abs(), torch.eye(4, dtype=F64)[:, [1, 3, 0, 2]])


def test_eigh_tridiagonal_known_eigenvalues():
    vals, q = eigh_descending(tridiagonal(12), F64)
    torch.testing.assert_close(vals, tridiagonal_eigenvalues(12), atol=1e-12, rtol=0)
    _orthogonal(q)
    torch.testing.assert_close((q * vals) @ q.T, tridiagonal(12), atol=1e-12, rtol=0)


def test_eigh_rank_deficient_has_zero_tail():
    a = rank_deficient(8, 3)
    vals, q = eigh_descending(a, F64)
    assert (vals[:3] > 1e-3).all() and vals[3:].abs().max() < 1e-12
    torch.testing.assert_close((q * vals) @ q.T, a, atol=1e-12, rtol=0)


def test_inverse_root_closed_forms():
    eye = torch.eye(4, dtype=F64)
    torch.testing.assert_close(inverse_root(eye, 4.0, 1e-3, F64), eye * 1.001 ** -0.25)
    d = torch.tensor([16.0, 81.0, 1.0], dtype=F64)
    torch.testing.assert_close(inverse_root(torch.diag(d), 4.0, 0.0, F64), torch.diag(d**-0.25))
    t = tridiagonal(9)
    x = inverse_root(t, 2.0, 0.0, F64)  # T^(-1/2): x @ x @ T = I
    torch.testing.assert_close(x @ x @ t, torch.eye(9, dtype=F64), atol=1e-10, rtol=0)


def test_inverse_root_of_a_rank_deficient_factor_is_finite_and_damped():
    a = rank_deficient(6, 2)
    a[0, 0] -= 1e-14  # rounding can leave tiny negative eigenvalues; they are clamped to 0
    root = inverse_root(a, 4.0, 1e-6, F64)
    assert torch.isfinite(root).all()
    vals = torch.linalg.eigvalsh(root)
    torch.testing.assert_close(vals.max(), torch.tensor(1e-6, dtype=F64) ** -0.25, rtol=1e-6,
                               atol=0)


def test_power_qr_sorted_on_a_shuffled_eigenbasis_sorts_and_keeps_it():
    t = tridiagonal(7)
    _, q = eigh_descending(t, F64)
    shuffle = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    q_new, perm = power_qr_sorted(t, q[:, shuffle], F64)
    assert torch.equal(shuffle[perm], torch.arange(7))
    torch.testing.assert_close(q_new.abs(), q.abs(), atol=1e-12, rtol=0)
    torch.testing.assert_close(diag_in_basis(t, q_new), tridiagonal_eigenvalues(7), atol=1e-12,
                               rtol=0)


def test_power_qr_iterations_converge_to_the_eigenbasis():
    t = tridiagonal(6) + torch.diag(torch.arange(6, dtype=F64))  # well separated spectrum
    q = torch.eye(6, dtype=F64)
    ratios = []
    for _ in range(300):
        q = power_qr(t, q, F64)
        ratios.append(off_diagonal_ratio(t, q).item())
    assert ratios[-1] < 1e-8 < ratios[0]
    _orthogonal(q)


def test_overlap_transport_is_doubly_stochastic_and_exact_on_the_diagonal():
    g = torch.Generator().manual_seed(1)
    q_old, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=F64))
    q_new, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=F64))
    p = overlap_transport(q_old, q_new)
    ones = torch.ones(6, dtype=F64)
    torch.testing.assert_close(p.sum(0), ones)
    torch.testing.assert_close(p.sum(1), ones)
    v = torch.rand(6, generator=g, dtype=F64)
    covariance = (q_old * v) @ q_old.T
    torch.testing.assert_close(torch.diagonal(q_new.T @ covariance @ q_new), v @ p)
    signs = torch.tensor([1.0, -1, 1, -1, -1, 1], dtype=F64)
    torch.testing.assert_close(overlap_transport(q_old, q_old * signs), torch.eye(6, dtype=F64))


def test_off_diagonal_ratio():
    t = tridiagonal(5)
    _, q = eigh_descending(t, F64)
    assert off_diagonal_ratio(t, q).item() < 1e-14
    assert off_diagonal_ratio(t, torch.eye(5, dtype=F64)).item() > 0.3
    zero = torch.zeros(3, 3, dtype=F64)
    assert off_diagonal_ratio(zero, torch.eye(3, dtype=F64)).item() == 0.0
