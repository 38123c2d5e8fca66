"""Native SOAP against the peers' SOAP on the issue-19 model, whole training steps, side by side.

    .venv/bin/python benchmarks/profile_native_vs_peers.py --steps 100

AdamW, our native SOAP as it was before the speed-up (`LegacySOAP` below: first moment in the
original basis, projected every step; the refresh's three b^3 products), our native SOAP now,
pytorch-optimizer's and heavyball's SOAP: the same model, data, schedule and clipping (our
Trainer, a peer through `optimizer_factory`), 2 threads, interleaved turns of 10 steps
(asteria_bench/turns.py). Prints p50 / p99 / mean step ms over the steps after the first turn
and the final validation loss.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asteria_bench import peers  # noqa: E402
from asteria_bench.pausable import make_pausable  # noqa: E402
from asteria_bench.turns import (  # noqa: E402  # noqa: E402
    ADAMW,
    CPU_MODEL,
    INTERVAL,
    NATIVE,
    SOAP,
    Config,
    Contender,
    peer_factory,
    summary,
)
from asteria_core.cli import resolve_config  # noqa: E402
from asteria_core.optim import seam  # noqa: E402
from asteria_core.optim import soap as soap_module  # noqa: E402
from asteria_core.optim.base import BASES  # noqa: E402
from asteria_core.optim.layout import from_basis, to_basis  # noqa: E402
from asteria_core.optim.seam import RefreshResult, is_finite  # noqa: E402
from asteria_core.runtime import decay_groups  # noqa: E402
from asteria_core.train.trainer import Trainer  # noqa: E402


def _legacy_power_qr_sorted(a_bb, q_bb, dtype):
    a_bb, q_bb = a_bb.to(dtype), q_bb.to(dtype)
    est_b = torch.diag(q_bb.T @ a_bb @ q_bb)
    perm_b = torch.argsort(est_b, descending=True)
    q_new_bb, _ = torch.linalg.qr(a_bb @ q_bb[:, perm_b])
    return q_new_bb, perm_b


class LegacySOAP(soap_module.SOAP):
    """The native SOAP of commit f42e534, for a before/after in one run (same numbers)."""

    def _step_param(self, p, grad, state, layout, group):
        if "step" not in state:
            return super()._step_param(p, grad, state, layout, group)
        beta1, beta2 = group["betas"]
        shampoo_beta = group["shampoo_beta"] if group["shampoo_beta"] >= 0 else beta2
        state["step"] += 1
        step = state["step"]
        m, v, bases = state[soap_module.EXP_AVG_E], state[soap_module.EXP_AVG_SQ], state[BASES]
        grad_e = to_basis(grad, bases)
        m.mul_(beta1).add_(grad, alpha=1.0 - beta1)  # original basis
        v.mul_(beta2).add_(grad_e.square(), alpha=1.0 - beta2)
        denom = v.sqrt().add_(group["eps"])
        step_size = group["lr"] * (1.0 - beta2**step) ** 0.5 / (1.0 - beta1**step)
        p.add_(from_basis(to_basis(m, bases) / denom, bases).reshape(p.shape), alpha=-step_size)
        if group["weight_decay"] > 0.0:
            p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        self._update_factors(grad, state["factors"], layout, shampoo_beta)
        return step % group["precondition_frequency"] == 0

    def _apply_refresh(self, key, result, state, layout):  # no rotation: m is original-basis
        soap_module.BlockPreconditioner._apply_refresh(self, key, result, state, layout)

    def _refresh_inline(self, key) -> RefreshResult | None:
        # the seam's refresh with the old power iteration (three b^3 products per block)
        new, seam.power_qr_sorted = seam.power_qr_sorted, _legacy_power_qr_sorted
        try:
            result = seam.refresh_fn(self.snapshot(key, lend=True), self.refresh_config(key))
        finally:
            seam.power_qr_sorted = new
        if result is None or not is_finite(result):
            self.refresh_failures += 1
            return None
        return result


def legacy_factory(args: list[str]):
    probe = resolve_config(None, [*CPU_MODEL, *args])
    o, policy = probe.optim, probe.policy

    def build(model):
        return LegacySOAP(decay_groups(model, o.weight_decay), lr=o.lr, betas=o.betas, eps=o.eps,
                          precondition_frequency=policy.refresh_interval,
                          max_precond_dim=o.max_precond_dim, block_size=o.precond_block_size,
                          shampoo_beta=o.shampoo_beta, refresh=o.refresh_method,
                          moment_swap=o.moment_swap)
    return build


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    configs = [(Config("AdamW", ADAMW, "adamw"), None),
               (Config("native SOAP before", SOAP + NATIVE, "soap"), legacy_factory(SOAP)),
               (Config("native SOAP now", SOAP + NATIVE, "soap"), None)]
    for name in peers.available_peers("soap"):
        configs.append((Config(peers.peer_label(name), SOAP + NATIVE, "soap", peer=name),
                        peer_factory(name, SOAP + NATIVE, CPU_MODEL)))
    with tempfile.TemporaryDirectory() as tmp:
        contenders = []
        for i, (cfg, factory) in enumerate(configs):
            run = resolve_config(None, [*CPU_MODEL, "--train.steps", str(args.steps),
                                        "--train.out_dir", f"{tmp}/c{i}", *cfg.args])
            torch.set_num_threads(2)
            trainer = Trainer(run, jsonl=False, optimizer_factory=factory)
            make_pausable(trainer.runtime)  # the turns hold and release refresh jobs
            contenders.append(Contender(cfg, trainer, 2))
        for k in range(-(-args.steps // INTERVAL)):
            for c in contenders:
                c.turn(min(INTERVAL, args.steps - k * INTERVAL))
        rows = [summary(c) for c in contenders]
    base = rows[0]
    print(f"{'arm':34s} {'p50':>7s} {'p99':>7s} {'mean':>7s} {'val loss':>9s}")
    for r in rows:
        print(f"{r['label']:34s} {r['p50_ms']:7.0f} {r['p99_ms']:7.0f} {r['mean_ms']:7.0f} "
              f"{r['final_val_loss']:9.4f}")
    fast = [r for r in rows if r["peer"]]
    now = rows[2]
    for key in ("p50_ms", "p99_ms", "mean_ms"):
        best = min(fast, key=lambda r: r[key]) if fast else base
        print(f"{key}: now / before {now[key] / rows[1][key]:.3f}; now / fastest peer "
              f"({best['label']}) {now[key] / best[key]:.3f}")
    print("raw step ms:", {r["label"]: [round(x) for x in r["step_ms"]] for r in rows})


if __name__ == "__main__":
    main()
