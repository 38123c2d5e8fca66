"""The first basis replaces the initial identity: statistics gathered in identity coordinates
(delayed or external mode trains with the identity until then) are carried over by transport,
and the product's default run trains without the loss spike that reading them index-aligned in
the new basis caused (docs/optimizers.md, "The first swap")."""

from __future__ import annotations

import copy

import torch

from asteria_core.optim import SOAP, refresh_fn
from asteria_core.optim.soap import EXP_AVG_SQ
from asteria_core.train.config_io import config_from_dict
from asteria_core.train.trainer import Trainer
from backend.commands import SERVED_RUN
from tests.asteria_core.optim.problems import structured_grads


def test_the_first_swap_transports_the_identity_phase_second_moment():
    grads = structured_grads((6, 4), 6, seed=41)
    p = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    opt = SOAP([p], refresh_dtype="float64")
    opt.external_refresh = True
    p.grad = grads[0].clone()
    opt.step()  # the first call: statistics and due blocks, no update
    results = [refresh_fn(opt.snapshot(k), opt.refresh_config(k)) for k in opt.due_blocks()]
    for grad in grads[1:]:  # Adam in the identity basis until the swap
        p.grad = grad.clone()
        opt.step()
    v_identity = opt.state[p][EXP_AVG_SQ].clone()
    assert v_identity.abs().min() > 0
    for result in results:
        assert result.base_version == 0 and result.perm is None
        torch.testing.assert_close(result.transport, result.basis.square())
        opt.apply_refresh(result.key, result)
    q_rows, q_cols = (r.basis for r in sorted(results, key=lambda r: r.key.dim))
    # v'[a, b] = sum_ij v[i, j] Q_rows[i, a]^2 Q_cols[j, b]^2: the diagonal of the identity-basis
    # second moment seen in the eigenbasis; the old rule left v as it was, index-aligned.
    expected = q_rows.square().T @ v_identity @ q_cols.square()
    torch.testing.assert_close(opt.state[p][EXP_AVG_SQ], expected)
    torch.testing.assert_close(expected.sum(), v_identity.sum())  # mass kept


def test_the_default_run_has_no_loss_spike_at_its_first_swap(tmp_path):
    # asteria start's run (SOAP, lr 1e-2, refresh on a worker, d = S = 10): its first basis is
    # swapped in at steps 7-11. Its loss used to go 3.55 -> 7.22 (2.03x) -> 3.49 at step 14.
    # A smaller jump at step 14 remains with any delayed first swap: measured 2026-12-02 on an
    # AMD EPYC, the largest jump of 40 steps over seeds 1337, 1, 2, 3 was 1.50, 1.18, 1.66,
    # 1.07 (swap window auto), 1.09, 1.14, 1.51, 1.07 (window 1), 1.09, 1.13, 1.05, 1.05 for
    # native SOAP (S = 0); 1.5025 at this seed on that machine, under 1.5 on others. The bound
    # holds the 2x bug out without failing on the float noise of one machine.
    config = copy.deepcopy(SERVED_RUN)
    config["train"].update(out_dir=str(tmp_path), checkpoint_interval=0)
    config["telemetry"] = {"model_cpu_watts": 0.0}
    trainer = Trainer(config_from_dict(config), jsonl=False)
    try:
        losses = trainer.train(stop_at=30, progress=False).train_losses
    finally:
        trainer.close()
    assert len(losses) == 30
    jumps = [(step, later / before) for step, (before, later)
             in enumerate(zip(losses, losses[1:], strict=False), start=2)]
    assert max(ratio for _, ratio in jumps) <= 1.75, max(jumps, key=lambda j: j[1])
