"""The peers' optimizers (asteria_bench/peers.py): built from our decay groups, they train, and
those that follow the SOAP reference take the updates ours takes.

Without the `bench` extra the tests skip, naming what is missing; under CI=true (the dev extra
installs the peers) a missing peer fails.
"""

from __future__ import annotations

import pytest
import torch

from asteria_bench import peers
from asteria_core import SOAP
from asteria_core.runtime.factory import decay_groups
from asteria_core.train.config import ModelConfig
from asteria_core.train.model import GPT
from tests.components import missing

HP = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "refresh_interval": 4,
      "max_precond_dim": 10000, "shampoo_beta": -1.0}


def require(name: str) -> None:
    spec = peers.PEERS[name]
    if name in peers.available_peers(spec.kind):
        return
    message = (f"{spec.package} is not installed; install it: pip install -e \".[bench]\"")
    missing(message)


@pytest.fixture(autouse=True)
def _eager_heavyball(monkeypatch):
    """heavyball compiles its inner functions (a minute of compilation on a CPU); eager runs the
    same arithmetic, and these tests check the arithmetic, not the speed."""
    try:
        import heavyball.utils
    except ImportError:
        return
    monkeypatch.setattr(heavyball.utils, "compile_mode", None)


def test_registry_and_labels():
    assert {"heavyball-soap", "pytorch-optimizer-soap"} <= set(peers.PEERS)
    for kind in peers.KINDS:
        assert all(peers.PEERS[n].kind == kind for n in peers.available_peers(kind))
    with pytest.raises(ValueError, match="kind"):
        peers.available_peers("adamw")
    with pytest.raises(ValueError, match="peer"):
        peers.build_peer("nope", [], **HP)
    for name, spec in peers.PEERS.items():
        label = peers.peer_label(name)
        assert label.startswith(spec.distribution + " ") and label.endswith(spec.title)


@pytest.mark.parametrize("name", sorted(peers.PEERS))
def test_peer_trains_a_tiny_gpt(name):
    require(name)
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16))
    opt = peers.build_peer(name, decay_groups(model, 0.1), **{**HP, "lr": 3e-3,
                                                               "weight_decay": 0.1})
    assert isinstance(opt, torch.optim.Optimizer)
    # our groups, their own weight decay: matrices decay, gains do not
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
    data = torch.randint(0, 256, (8, 17), generator=torch.Generator().manual_seed(1))
    x, y = data[:, :-1], data[:, 1:]
    losses = []
    for _ in range(12):  # the same batch: the loss must fall
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert losses[-1] < losses[0] - 0.1, losses


def _updates(make, steps: int, wd: float) -> list[torch.Tensor]:
    """The per-step changes of one square 2-D parameter under fixed gradients."""
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(8, 8, generator=gen)
    grads = [torch.randn(8, 8, generator=gen) * (1 + 0.1 * i) for i in range(steps)]
    p = torch.nn.Parameter(p0.clone())
    opt = make([{"params": [p], "weight_decay": wd}])
    out, prev = [], p0.clone()
    for g in grads:
        p.grad = g.clone()
        opt.step()
        out.append(p.detach() - prev)
        prev = p.detach().clone()
    return out


# Tolerance: relative 1e-4 per update. The peers compute in float32 like ours, in another order
# (lerp_ against mul_/add_, tensordot against matmul, their own einsum paths); float32 rounding
# (1e-7) passes through eigh, QR and the 1/sqrt(v) of small second moments, which amplify it
# 10-100x; measured 4e-6 for both. A square parameter keeps both factors full rank, so the
# eigenbasis is unique up to signs (which the update does not see); a rank-deficient factor's
# null-space basis is LAPACK's free choice and may differ between implementations.
RTOL = 1e-4


@pytest.mark.parametrize("name", [n for n, s in peers.PEERS.items() if s.follows_reference])
def test_reference_peer_takes_our_updates(name):
    require(name)
    steps = 14  # pytorch-optimizer: refreshes at 4, 8, 12 included
    hp = {k: v for k, v in HP.items() if k not in ("refresh_interval", "max_precond_dim")}
    ours = _updates(lambda groups: SOAP(groups, precondition_frequency=HP["refresh_interval"],
                                        max_precond_dim=HP["max_precond_dim"], **hp), steps, 0.1)
    theirs = _updates(lambda groups: peers.build_peer(name, groups, **HP), steps, 0.1)
    assert ours[0].abs().max() == 0 and theirs[0].abs().max() == 0  # first call: statistics only
    # heavyball: its refresh comes one step earlier (docstring), so compare the updates before
    # it; its decay comes before the update, a difference of lr * wd relative, added to RTOL.
    compared = range(1, steps) if name == "pytorch-optimizer-soap" else \
        range(1, HP["refresh_interval"])
    tol = RTOL if name == "pytorch-optimizer-soap" else RTOL + 2 * HP["lr"] * 0.1
    for i in compared:
        err = float((ours[i] - theirs[i]).norm() / ours[i].norm())
        assert err < tol, (i, err)
    if name == "heavyball-soap":  # and without decay, to RTOL
        ours = _updates(lambda groups: SOAP(groups, precondition_frequency=4, **hp), 4, 0.0)
        theirs = _updates(lambda groups: peers.build_peer(name, groups, **HP), 4, 0.0)
        for i in range(1, 4):
            assert float((ours[i] - theirs[i]).norm() / ours[i].norm()) < RTOL
