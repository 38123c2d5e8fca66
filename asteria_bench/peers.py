"""The peers' optimizers (the `bench` extra), built with hyperparameters mapped from ours.

`asteria bench` trains a peer on our model, data, schedule and clipping by handing
`build_peer(...)` to `Trainer(config, optimizer_factory=...)`; the peer gets our param groups
(`decay_groups`: matrices decay, gains and biases do not) with their own weight_decay.

What each peer is given, and what it does differently that cannot be mapped:

heavyball-soap (`heavyball.SOAP`)
    Mapped: lr, betas, eps, weight_decay (decoupled, per group), precondition_frequency =
    refresh_interval, max_precond_dim, shampoo_beta (ours: < 0 means betas[1]; heavyball takes
    the number), merge_dims=False and precondition_1d=False (our defaults; heavyball's are True
    and False), 1-D parameters take Adam (as ours). Set to the SOAP reference: caution=False,
    mars=False, palm=False, warmup_steps=0, use_precond_schedule=False (a fixed interval, not its
    schedule), no gradient or update clipping (the Trainer clips), storage_dtype=float32.
    Left as heavyball ships them: multi_tensor=True (foreach: speed only) and its torch.compile of
    the inner functions (`heavyball.utils.compile_mode`, a module-wide setting; the first steps
    pay the compilation). Not mappable: (1) its step counter counts the initialising call, so its
    refreshes fall one step before ours (calls f, 2f, ... against ours after f + 1, 2f + 1, ...);
    (2) its power iteration adds a lift (max(eps, 64 b eps_float32) * max |eigenvalue| * Q) before
    the QR and fixes column signs; (3) decay is applied before the update (ours and the
    reference: after), a difference of lr * wd relative per step; (4) bias correction is folded
    into the EMAs (eps is added to the bias-corrected sqrt(v): ours adds it to sqrt(v)); (5) its
    first moment lives in the eigenbasis and is rotated at a refresh (the reference's, in exact
    arithmetic the same as ours in the original basis). The updates before its first refresh
    equal ours (tests/bench/test_peers.py).
pytorch-optimizer-soap (`pytorch_optimizer.SOAP`)
    A port of the reference: every argument maps one to one (max_precondition_dim,
    shampoo_beta None for betas[1], correct_bias=True, normalize_gradient=False,
    merge_dims=False, precondition_1d=False); it follows ours update for update, refreshes
    included (float32 rounding apart). Its step counter is per group, not per parameter (the
    same when every parameter has a gradient every step, as here).
heavyball-kl-shampoo (`heavyball.KLShampoo`)
    Mapped as heavyball-soap. Not mappable: it seeds the factors with init_factor * I (0.1) and
    balances the factor scales each step and applies dampening (1e-9) to the gradient that
    enters the factors, where the KL-Shampoo reference does neither; so its updates are not
    compared with ours.
pytorch-optimizer-shampoo (`pytorch_optimizer.ScalableShampoo`, Google's scalable Shampoo)
    Mapped: lr, betas[0] as momentum (moving average), statistics decay = shampoo_beta (< 0:
    betas[1]), weight_decay decoupled, preconditioning_compute_steps = refresh_interval,
    no_preconditioning_for_layers_with_dim_gt = max_precond_dim, block_size (ours, default
    1024), RMSProp grafting with eps as diagonal_eps (ours grafts Adam), inverse roots by SVD,
    start_preconditioning_step=1, nesterov=False. Not mappable: its RMSProp grafting is not our
    Adam grafting (moments, bias correction), and its matrix_eps (1e-6) is its own default.
    Its plain `Shampoo` (no grafting, an SVD root every step) is left out.

`block_size` has no counterpart in either SOAP (neither blocks factors): compare on models whose
dims fit one block (the benchmark's do).
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

KINDS = ("soap", "shampoo", "kl_shampoo")


@dataclass(frozen=True)
class PeerSpec:
    """One peer optimizer: where it comes from and how it is built from our hyperparameters."""

    package: str        # import name
    distribution: str   # name in importlib.metadata (its version goes into the label)
    kind: str           # soap | shampoo | kl_shampoo: which of ours it stands beside
    title: str          # the algorithm's name in a label
    build: Callable[..., torch.optim.Optimizer]
    follows_reference: bool
    """Its updates follow the SOAP reference's (the tests compare its first ones with ours)."""


def _stats_beta(shampoo_beta: float, betas: tuple[float, float]) -> float:
    return betas[1] if shampoo_beta < 0 else shampoo_beta  # ours: < 0 means betas[1]


def _heavyball(cls_name: str) -> Callable[..., torch.optim.Optimizer]:
    def build(param_groups, *, lr, betas, eps, weight_decay, refresh_interval, max_precond_dim,
              shampoo_beta, block_size):
        import heavyball

        cls = getattr(heavyball, cls_name)
        return cls(param_groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                   shampoo_beta=_stats_beta(shampoo_beta, betas),
                   precondition_frequency=refresh_interval, max_precond_dim=max_precond_dim,
                   merge_dims=False, precondition_1d=False, warmup_steps=0, caution=False,
                   mars=False, palm=False, use_precond_schedule=False, gradient_clipping=None,
                   update_clipping=None, storage_dtype="float32")

    return build


def _po_soap(param_groups, *, lr, betas, eps, weight_decay, refresh_interval, max_precond_dim,
             shampoo_beta, block_size):
    import pytorch_optimizer

    return pytorch_optimizer.SOAP(
        param_groups, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
        shampoo_beta=None if shampoo_beta < 0 else shampoo_beta,
        precondition_frequency=refresh_interval, max_precondition_dim=max_precond_dim,
        merge_dims=False, precondition_1d=False, correct_bias=True, normalize_gradient=False)


def _po_shampoo(param_groups, *, lr, betas, eps, weight_decay, refresh_interval,
                max_precond_dim, shampoo_beta, block_size):
    import pytorch_optimizer
    from pytorch_optimizer.optimizer.utils.graft import LayerWiseGrafting

    return pytorch_optimizer.ScalableShampoo(
        param_groups, lr=lr, betas=(betas[0], _stats_beta(shampoo_beta, betas)),
        moving_average_for_momentum=True, weight_decay=weight_decay,
        decoupled_weight_decay=True, start_preconditioning_step=1,
        preconditioning_compute_steps=refresh_interval, block_size=block_size or 1024,
        no_preconditioning_for_layers_with_dim_gt=max_precond_dim,
        graft_type=LayerWiseGrafting.RMSPROP, nesterov=False, diagonal_eps=eps, use_svd=True)


PEERS: dict[str, PeerSpec] = {
    "heavyball-soap": PeerSpec("heavyball", "heavyball", "soap", "SOAP",
                               _heavyball("SOAP"), True),
    "pytorch-optimizer-soap": PeerSpec("pytorch_optimizer", "pytorch-optimizer", "soap", "SOAP",
                                       _po_soap, True),
    "heavyball-kl-shampoo": PeerSpec("heavyball", "heavyball", "kl_shampoo", "KL-Shampoo",
                                     _heavyball("KLShampoo"), False),
    "pytorch-optimizer-shampoo": PeerSpec("pytorch_optimizer", "pytorch-optimizer", "shampoo",
                                          "Shampoo (ScalableShampoo)", _po_shampoo, False),
}


def _importable(package: str) -> bool:
    try:
        importlib.import_module(package)
    except ImportError:
        return False
    return True


def available_peers(kind: str = "soap") -> list[str]:
    """The peers of `kind` (soap | shampoo | kl_shampoo) whose package imports here."""
    if kind not in KINDS:
        raise ValueError(f"kind: got {kind!r}; allowed: {' | '.join(KINDS)}")
    return [name for name, spec in PEERS.items()
            if spec.kind == kind and _importable(spec.package)]


def _spec(name: str) -> PeerSpec:
    if name not in PEERS:
        raise ValueError(f"peer: got {name!r}; allowed: {' | '.join(PEERS)}")
    return PEERS[name]


def build_peer(name: str, param_groups, *, lr: float, betas: tuple[float, float], eps: float,
               weight_decay: float, refresh_interval: int, max_precond_dim: int,
               shampoo_beta: float, block_size: int | None = None) -> torch.optim.Optimizer:
    """Peer `name` over `param_groups` (groups' own weight_decay wins over `weight_decay`), with
    our hyperparameters mapped as the module docstring says. ImportError when not installed."""
    spec = _spec(name)
    options: dict[str, Any] = {
        "lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
        "refresh_interval": refresh_interval, "max_precond_dim": max_precond_dim,
        "shampoo_beta": shampoo_beta, "block_size": block_size}
    return spec.build(param_groups, **options)


def peer_label(name: str) -> str:
    """e.g. "heavyball 3.2.1 SOAP": the package, its installed version, the algorithm."""
    spec = _spec(name)
    try:
        version = importlib.metadata.version(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "(not installed)"
    return f"{spec.distribution} {version} {spec.title}"


def factory_from_config(name: str, config) -> Callable[[torch.nn.Module], torch.optim.Optimizer]:
    """Peer `name` with a run config's optim and policy settings (lr, betas, eps, weight decay,
    refresh interval, max precond dim, shampoo beta) on the model's decay groups: what
    `Trainer(optimizer_factory=...)` takes."""
    from asteria_core.runtime import decay_groups

    optim, policy = config.optim, config.policy

    def build(model: torch.nn.Module) -> torch.optim.Optimizer:
        return build_peer(
            name, decay_groups(model, optim.weight_decay), lr=optim.lr, betas=optim.betas,
            eps=optim.eps, weight_decay=optim.weight_decay,
            refresh_interval=policy.refresh_interval, max_precond_dim=optim.max_precond_dim,
            shampoo_beta=optim.shampoo_beta)

    return build
