"""Layouts: the reference's dim rules, blocking, block-diagonal maps and factor contractions."""

from __future__ import annotations

import torch

from asteria_core.optim.layout import (
    dim_outer,
    from_basis,
    make_layout,
    map_dim,
    merge_dims,
    split_sizes,
    to_basis,
)

F64 = torch.float64


def test_merge_dims_follows_the_reference():
    assert merge_dims((128, 64, 3, 3), 10000) == (8192, 9)
    assert merge_dims((20000, 4), 10000) == (20000, 4)
    assert merge_dims((2, 3, 4), 10000) == (24,)
    assert merge_dims((1, 1), 10000) == (1,)


def test_layout_rules():
    kw = {"max_precond_dim": 100, "block_size": None, "merge": False, "precondition_1d": False}
    assert make_layout((50,), **kw).chunks == (None,)
    assert make_layout((50,), **{**kw, "precondition_1d": True}).chunks == ((50,),)
    assert make_layout((500,), **{**kw, "precondition_1d": True}).chunks == (None,)
    assert make_layout((500, 30), **kw).chunks == (None, (30,))  # vocab-sized dim: identity
    assert make_layout((), **kw).chunks == ()
    blocked = make_layout((70, 30), **{**kw, "block_size": 32})
    assert blocked.chunks == ((32, 32, 6), (30,))
    assert [(d, c) for d, c, _ in blocked.blocks()] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert split_sizes(64, 32) == (32, 32)


def test_block_diagonal_map_equals_the_dense_product():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 10, 3, generator=g, dtype=F64)
    mats = [torch.randn(4, 4, generator=g, dtype=F64), torch.randn(4, 4, generator=g, dtype=F64),
            torch.randn(2, 2, generator=g, dtype=F64)]
    dense = torch.block_diag(*mats)
    torch.testing.assert_close(map_dim(x, 1, mats, transpose=False),
                               torch.einsum("aib,ij->ajb", x, dense))
    torch.testing.assert_close(map_dim(x, 1, mats, transpose=True),
                               torch.einsum("ajb,ij->aib", x, dense))


def test_to_and_from_basis_round_trip_and_match_the_matrix_formula():
    g = torch.Generator().manual_seed(1)
    ql, _ = torch.linalg.qr(torch.randn(5, 5, generator=g, dtype=F64))
    qr, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=F64))
    x = torch.randn(5, 4, generator=g, dtype=F64)
    bases = [[ql], [qr]]
    torch.testing.assert_close(to_basis(x, bases), ql.T @ x @ qr)
    torch.testing.assert_close(from_basis(to_basis(x, bases), bases), x)
    torch.testing.assert_close(to_basis(x, bases, skip=0), x @ qr)
    torch.testing.assert_close(to_basis(x, [None, [qr]]), x @ qr)


def test_dim_outer_is_the_contraction_over_other_dims():
    x = torch.randn(3, 4, 5, dtype=F64, generator=torch.Generator().manual_seed(2))
    (full,) = dim_outer(x, 1, (4,))
    torch.testing.assert_close(full, torch.tensordot(x, x, dims=([0, 2], [0, 2])))
    parts = dim_outer(x, 1, (3, 1))
    torch.testing.assert_close(parts[0], full[:3, :3])
    torch.testing.assert_close(parts[1], full[3:, 3:])
