"""Test oracles: the reference SOAP, KL-Shampoo and Shampoo steps for one 2-D parameter.

Written from the published algorithms in the references' own structure, not ours: SOAP keeps its
first moment in the eigenbasis and round-trips it through the original basis every step, and
permutes its second moment on the QR path (nikhilvyas/SOAP soap.py); KL-Shampoo follows the
explicit left/right formulas of yorkerlin/KL-Methods kl_opt.py; Shampoo is the textbook formula
L^(-1/4) M R^(-1/4) with Adam norm grafting. Matrices only, explicit products, no blocking.

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
        m, n = p.shape
        self.S = [torch.zeros(m, m, dtype=p.dtype), torch.zeros(n, n, dtype=p.dtype)]

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
            self._update_s(0, g @ g.T)
            self._update_s(1, g.T @ g)
            self.Q = [_eigh_desc(self.S[0]), _eigh_desc(self.S[1])]
            self.e = [1.0 / torch.full((s,), self.init_factor, dtype=g.dtype).sqrt()
                      for s in g.shape]
            return
        self.step_count += 1
        self.m = torch.lerp(self.m, g, 1 - self.betas[0])
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
