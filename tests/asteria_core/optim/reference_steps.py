"""Test oracles: the reference SOAP, KL-Shampoo and Shampoo steps for one 2-D parameter
(KL-Shampoo: also one 3-D parameter).

Written from the published algorithms in the references' own structure, not ours: SOAP keeps its
first moment in the eigenbasis and round-trips it through the original basis every step, and
permutes its second moment on the QR path (nikhilvyas/SOAP soap.py); KL-Shampoo follows the
explicit left/right formulas of yorkerlin/KL-Methods kl_opt.py, and for a 3-D tensor that
file's own order of updates, in which some factor and eigenvalue updates read eigenvalue
estimates updated earlier in the same step; Shampoo is the textbook formula L^(-1/4) M R^(-1/4)
with Adam norm grafting. Explicit products, no blocking.

Legend: G_mn gradient, L_mm / R_nn factors, Ql_mm / Qr_nn eigenbases.
"""

from __future__ import annotations

import math

import torch


def _eigh_desc(a):
    eye = torch.eye(a.shape[0], dtype=a.dtype)
    _, q = torch.linalg.eigh(a + 1e-30 * eye)
    return torch.flip(q, [1])


class ReferenceSOAP:
    def __init__(self, p, lr, betas, eps, weight_decay, freq, shampoo_beta=-1.0, right=True):
        self.right = right  # False: the column dim is above max_precond_dim (Q_nn = I)
        self.p, self.lr, self.betas, self.eps = p, lr, betas, eps
        self.wd, self.freq = weight_decay, freq
        self.sb = shampoo_beta if shampoo_beta >= 0 else betas[1]
        self.step_count = 0
        self.first = True
        self.m = torch.zeros_like(p)  # eigenbasis
        self.v = torch.zeros_like(p)  # eigenbasis
        self.L = torch.zeros(p.shape[0], p.shape[0], dtype=p.dtype)
        self.R = torch.zeros(p.shape[1], p.shape[1], dtype=p.dtype)

    def _factors(self, g):
        self.L = torch.lerp(self.L, g @ g.T, 1 - self.sb)
        self.R = torch.lerp(self.R, g.T @ g, 1 - self.sb)

    def step(self, g):
        if self.first:
            self.first = False
            self._factors(g)
            self.Ql = _eigh_desc(self.L)
            self.Qr = _eigh_desc(self.R) if self.right else torch.eye(g.shape[1], dtype=g.dtype)
            return
        b1, b2 = self.betas
        g_e = self.Ql.T @ g @ self.Qr
        self.step_count += 1
        t = self.step_count
        self.m = b1 * self.m + (1 - b1) * g_e
        self.v = b2 * self.v + (1 - b2) * g_e**2
        step_size = self.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        u = self.Ql @ (self.m / (self.v.sqrt() + self.eps)) @ self.Qr.T
        self.p -= step_size * u
        self.p -= self.lr * self.wd * self.p
        # update_preconditioner: m back to the original basis, factors, maybe QR, m forward
        m_orig = self.Ql @ self.m @ self.Qr.T
        self._factors(g)
        if t % self.freq == 0:
            self.Ql, self.v = self._qr(self.L, self.Ql, self.v, 0)
            if self.right:
                self.Qr, self.v = self._qr(self.R, self.Qr, self.v, 1)
        self.m = self.Ql.T @ m_orig @ self.Qr

    @staticmethod
    def _qr(a, q, v, dim):
        est = torch.diag(q.T @ a @ q)
        idx = torch.argsort(est, descending=True)
        v = v.index_select(dim, idx)
        q_new, _ = torch.linalg.qr(a @ q[:, idx])
        return q_new, v


class ReferenceKLShampoo:
    def __init__(self, p, lr, betas, eps, weight_decay, freq, init_factor=0.1, clamp=4000):
        self.p, self.lr, self.betas, self.eps = p, lr, betas, eps
        self.wd, self.freq = weight_decay, freq
        self.beta = betas[1]
        self.init_factor, self.clamp = init_factor, clamp
        self.first, self.step_count = True, 0
        self.m = torch.zeros_like(p)
        self.S = [torch.zeros(d, d, dtype=p.dtype) for d in p.shape]

    def _update_s(self, idx, mat):
        other = self.p.numel() / self.p.shape[idx]
        self.S[idx] = self.S[idx] * self.beta + mat * ((1 - self.beta) / other)

    def _update_e(self, idx, diag):
        lam = (1.0 / self.e[idx] ** 2).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        lam = torch.lerp(lam, diag, 1 - self.beta)
        e = (1.0 / lam.sqrt()).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
        self.e[idx] = e.clamp(max=max(10, min(lam.shape[0], self.clamp)))

    def step(self, g):
        if self.first:
            self.first = False
            for k in range(g.dim()):
                self._update_s(k, _gram(g, k))
            self.Q = [_eigh_desc(s) for s in self.S]
            self.e = [1.0 / torch.full((s,), self.init_factor, dtype=g.dtype).sqrt()
                      for s in g.shape]
            return
        self.step_count += 1
        self.m = torch.lerp(self.m, g, 1 - self.betas[0])
        if g.dim() == 3:
            self._step_3d(g)
            return
        ql, qr = self.Q
        scale = self.e[0][:, None] * self.e[1][None, :]
        scale = scale / (1 + scale * self.eps)
        u = ql @ ((ql.T @ self.m @ qr) * scale) @ qr.T
        lhalf = (qr.T @ g.T) * self.e[1][:, None]          # (n, m)
        self._update_s(0, lhalf.T @ lhalf)                  # G Qr diag(e_r^2) Qr^T G^T
        step1 = ql.T @ g
        rhalf = step1 * self.e[0][:, None]                  # (m, n)
        self._update_s(1, rhalf.T @ rhalf)
        diag_half = step1 @ qr
        ldiag = torch.mean((diag_half * self.e[1][None, :]) ** 2, 1)
        rdiag = torch.mean((diag_half * self.e[0][:, None]) ** 2, 0)
        self._update_e(0, ldiag)
        self._update_e(1, rdiag)
        if self.step_count % self.freq == 0:
            self.Q = [torch.linalg.qr(s @ q)[0] for s, q in zip(self.S, self.Q, strict=True)]
        self.p -= self.lr * u
        self.p -= self.lr * self.wd * self.p

    def _step_3d(self, g):
        """Dims 0, 1, 2 (the reference's 1, 2, 3), in the reference's order: S_2 and S_1 from G
        mapped by Q_0 e_0; e_2, then e_1 reading the new e_2; then S_0 and e_0 from G mapped by
        Q_2 e_2 as it was at the start of the step, reading the new e_1."""
        q, e_start = self.Q, list(self.e)
        scale = _along(e_start[0], 0) * _along(e_start[1], 1) * _along(e_start[2], 2)
        scale = scale / (1 + scale * self.eps)
        m_e = _mode(_mode(_mode(self.m, q[0], 0), q[1], 1), q[2], 2)
        u = _mode(_mode(_mode(m_e * scale, q[0].T, 0), q[1].T, 1), q[2].T, 2)

        g0 = _mode(g, q[0] * e_start[0][None, :], 0)   # G x_0 (Q_0 diag(e_0))
        g01 = _mode(g0, q[1], 1)
        g012 = _mode(g01, q[2], 2)
        self._update_s(2, _gram(g01 * _along(e_start[1], 1), 2))
        self._update_s(1, _gram(_mode(g0, q[2], 2) * _along(e_start[2], 2), 1))
        self._update_e(2, torch.mean((g012 * _along(self.e[1], 1)) ** 2, dim=(0, 1)))
        self._update_e(1, torch.mean((g012 * _along(self.e[2], 2)) ** 2, dim=(0, 2)))  # new e_2
        g2 = _mode(g, q[2] * e_start[2][None, :], 2)   # G x_2 (Q_2 diag(e_2 at the start))
        g21 = _mode(g2, q[1], 1)
        g210 = _mode(g21, q[0], 0)
        self._update_s(0, _gram(g21 * _along(self.e[1], 1), 0))                        # new e_1
        self._update_e(0, torch.mean((g210 * _along(self.e[1], 1)) ** 2, dim=(1, 2)))
        if self.step_count % self.freq == 0:
            self.Q = [torch.linalg.qr(s @ q_dd)[0] for s, q_dd in zip(self.S, self.Q, strict=True)]
        self.p -= self.lr * u
        self.p -= self.lr * self.wd * self.p


def _mode(x, mat, k):
    """x with dim k contracted against mat's rows: y[.., j, ..] = sum_i x[.., i, ..] mat[i, j]."""
    return torch.movedim(torch.tensordot(x, mat, dims=([k], [0])), -1, k)


def _gram(x, k):
    """The (d_k, d_k) statistic: x times itself, summed over every dim but k."""
    other = [d for d in range(x.dim()) if d != k]
    return torch.tensordot(x, x, dims=(other, other))


def _along(v, k):
    """v shaped to broadcast along dim k of a 3-D tensor."""
    shape = [1, 1, 1]
    shape[k] = -1
    return v.reshape(shape)


def _inv_root(a, root, eps):
    vals, vecs = torch.linalg.eigh(a)
    return vecs @ torch.diag((vals.clamp_min(0) + eps) ** (-1.0 / root)) @ vecs.T


class ReferenceShampoo:
    """Adam-grafted Shampoo, running-sum factors (beta2 = 1), roots refreshed after the step."""

    def __init__(self, p, lr, beta1, graft_beta2, graft_eps, eps, freq):
        self.p, self.lr, self.b1, self.eps = p, lr, beta1, eps
        self.gb2, self.geps = graft_beta2, graft_eps
        self.freq, self.t = freq, 0
        self.m, self.v = torch.zeros_like(p), torch.zeros_like(p)
        self.L = torch.zeros(p.shape[0], p.shape[0], dtype=p.dtype)
        self.R = torch.zeros(p.shape[1], p.shape[1], dtype=p.dtype)
        self.roots = None

    def step(self, g):
        self.t += 1
        self.m = torch.lerp(self.m, g, 1 - self.b1)
        self.v = self.gb2 * self.v + (1 - self.gb2) * g * g
        bc1, bc2 = 1 - self.b1**self.t, 1 - self.gb2**self.t
        adam = (self.m / bc1) / ((self.v / bc2).sqrt() + self.geps)
        if self.roots is None:
            direction = adam
        else:
            s = self.roots[0] @ (self.m / bc1) @ self.roots[1]
            direction = s * (adam.norm() / s.norm())
        self.p -= self.lr * direction
        self.L = self.L + g @ g.T
        self.R = self.R + g.T @ g
        if self.t % self.freq == 0:
            self.roots = (_inv_root(self.L, 4.0, self.eps), _inv_root(self.R, 4.0, self.eps))
