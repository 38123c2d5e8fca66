"""Pure matrix functions behind every preconditioner refresh.

Each function maps tensors to new tensors and touches no optimizer state, so a refresh can run
inline, on a host worker or on another rank and give the same bits for the same inputs.

Legend: A_bb is a symmetric positive semi-definite factor block of side b (a diagonal block of a
Kronecker factor L or R), Q_bb an orthogonal basis whose columns are eigenvector estimates, ordered
by descending eigenvalue (the SOAP reference's order), v_b a vector of eigenvalue estimates.
"""

from __future__ import annotations

import torch

# The SOAP reference adds 1e-30 * I before eigh; kept so the first basis matches it.
_EIGH_JITTER = 1e-30
_TRIU: dict[tuple[int, torch.device], torch.Tensor] = {}


def _triu(b: int, device: torch.device) -> torch.Tensor:
    """Indices of the upper triangle of a (b, b) matrix, row by row (cached per side)."""
    key = (b, device)
    if key not in _TRIU:
        _TRIU[key] = torch.triu_indices(b, b, device=device)
    return _TRIU[key]


def pack_symmetric(a_bb: torch.Tensor) -> torch.Tensor:
    """The upper triangle of a symmetric matrix, row by row: b (b + 1) / 2 values."""
    rows, cols = _triu(a_bb.shape[0], a_bb.device)
    return a_bb[rows, cols]


def packed_side(n: int) -> int:
    """b such that b (b + 1) / 2 = n."""
    b = int(((8 * n + 1) ** 0.5 - 1) / 2)
    if b * (b + 1) // 2 != n:
        raise ValueError(f"{n} values are not the upper triangle of a square matrix")
    return b


def unpack_symmetric(a_p: torch.Tensor) -> torch.Tensor:
    """The symmetric matrix whose upper triangle `pack_symmetric` gave."""
    b = packed_side(a_p.numel())
    rows, cols = _triu(b, a_p.device)
    a_bb = torch.empty(b, b, dtype=a_p.dtype, device=a_p.device)
    a_bb[rows, cols] = a_p
    a_bb[cols, rows] = a_p
    return a_bb


def eigh_descending(a_bb: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (descending) and eigenvectors of a symmetric matrix, computed in `dtype`.

    Mirrors the SOAP reference's `get_orthogonal_matrix`: eigh of A + 1e-30 I, retried in float64
    when the solver fails in a narrower dtype, columns flipped so eigenvalues descend. Results are
    returned in `dtype`. A failure in float64 propagates (torch.linalg.LinAlgError).
    """
    a_bb = a_bb.to(dtype)
    eye_bb = torch.eye(a_bb.shape[0], dtype=dtype, device=a_bb.device)
    try:
        vals_b, vecs_bb = torch.linalg.eigh(a_bb + _EIGH_JITTER * eye_bb)
    except torch.linalg.LinAlgError:
        if dtype == torch.float64:
            raise
        vals_b, vecs_bb = torch.linalg.eigh(a_bb.double() + _EIGH_JITTER * eye_bb.double())
        vals_b, vecs_bb = vals_b.to(dtype), vecs_bb.to(dtype)
    return vals_b.flip(0), vecs_bb.flip(1)


def diag_in_basis(a_bb: torch.Tensor, q_bb: torch.Tensor) -> torch.Tensor:
    """diag(Q^T A Q): the eigenvalue estimates of A in the basis Q, shape (b,)."""
    return torch.einsum("ij,ij->j", q_bb, a_bb @ q_bb)


def power_qr_sorted(a_bb: torch.Tensor, q_bb: torch.Tensor,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One power iteration + QR from Q, after sorting Q's columns by descending diag(Q^T A Q).

    The SOAP reference's `get_orthogonal_matrix_QR`. Returns (Q_new_bb, perm_b) where perm says
    which old column seeded each new one: new column j started from old column perm[j]. The caller
    re-indexes the Adam second moment with the same perm (the reference behaviour at a swap).
    """
    a_bb, q_bb = a_bb.to(dtype), q_bb.to(dtype)
    # One b^3 product serves both: diag(Q^T A Q)_j = <q_j, (A Q)_j>, and A Q[:, perm] is
    # (A Q)[:, perm]. The reference writes three products (Q^T A Q, then A Q[:, perm]).
    aq_bb = a_bb @ q_bb
    est_b = torch.einsum("ij,ij->j", q_bb, aq_bb)
    perm_b = torch.argsort(est_b, descending=True)
    q_new_bb, _ = torch.linalg.qr(aq_bb[:, perm_b])
    return q_new_bb, perm_b


def power_qr(a_bb: torch.Tensor, q_bb: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One power iteration + QR from Q, without sorting (the KL-Shampoo reference's refresh)."""
    q_new_bb, _ = torch.linalg.qr(a_bb.to(dtype) @ q_bb.to(dtype))
    return q_new_bb


def inverse_root(a_bb: torch.Tensor, root: float, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """(A + eps I)^(-1/root) for a symmetric PSD A, by eigendecomposition in `dtype`.

    Eigenvalues are clamped at 0 before eps is added: a PSD factor can only have tiny negative
    eigenvalues from rounding, and the clamp keeps them from turning into huge or NaN roots.
    """
    vals_b, vecs_bb = eigh_descending(a_bb, dtype)
    scale_b = (vals_b.clamp_min(0.0) + eps).pow(-1.0 / root)
    return (vecs_bb * scale_b) @ vecs_bb.T


def overlap_transport(q_old_bb: torch.Tensor, q_new_bb: torch.Tensor) -> torch.Tensor:
    """P[i, j] = <q_old_i, q_new_j>^2: the second-moment transport between two bases (HeavyBall).

    For a diagonal second moment v in the old basis (a covariance Q_old diag(v) Q_old^T),
    diag(Q_new^T Q_old diag(v) Q_old^T Q_new) = P^T v exactly. P is doubly stochastic, so the
    transport keeps total mass and never produces negative entries; P = I when the bases agree
    (up to column signs).
    """
    overlap_bb = q_old_bb.T @ q_new_bb.to(q_old_bb.dtype)
    return overlap_bb.square()


def off_diagonal_ratio(a_bb: torch.Tensor, q_bb: torch.Tensor) -> torch.Tensor:
    """||B - diag(B)||_F / ||B||_F with B = Q^T A Q: how far Q is from diagonalising A.

    Zero for an exact eigenbasis; a cheap staleness signal a runtime can log or prioritise on.
    """
    b_bb = q_bb.T @ a_bb @ q_bb
    total = torch.linalg.matrix_norm(b_bb)
    off = torch.linalg.matrix_norm(b_bb - torch.diag_embed(torch.diagonal(b_bb)))
    return torch.where(total > 0, off / total, torch.zeros_like(total))


def basis_change(old_bb: torch.Tensor, result) -> float:
    """How far a refresh moved a block's basis: 1 - mean_j |<q_new_j, q_old_perm(j)>| (0 when
    every new vector continues its old one; a `perm` maps new coordinates to the old ones they
    continue, none means in order). The mean, not the worst vector: inside a near-degenerate
    eigenspace vectors turn freely, which moves the preconditioner little. In [0, 1]."""
    new_bb = result.basis.to(old_bb.dtype)
    old_cols = old_bb if result.perm is None else old_bb[:, result.perm.to(old_bb.device)]
    cosines = (new_bb.to(old_bb.device) * old_cols).sum(dim=0).abs()
    return float(1.0 - cosines.mean())
