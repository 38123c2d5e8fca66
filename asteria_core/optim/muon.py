"""Muon for the hidden matrices, AdamW for the rest, in one torch optimizer.

Muon (Keller Jordan's reference, `torch.optim.Muon` since torch 2.9) steps a 2-D weight by the
orthogonalized Nesterov momentum of its gradient: B <- mu B + g, U = g + mu B, O = NS_5(U) (a
quintic Newton-Schulz iteration towards U's polar factor, coefficients (3.4445, -4.7750,
2.0315), in bfloat16), W <- W (1 - lr wd) - lr s(W) O, with s the shape scaling. It is meant for
hidden matrices only: embeddings, the output head, gains and biases go to AdamW, as the reference
and torch's documentation do. Here both live in one optimizer (the reference's MuonWithAuxAdam
arrangement): each parameter group carries `use_muon`, and the AdamW groups run
`torch.optim.AdamW`'s own arithmetic (its functional form), so a run, a checkpoint and the
runtime see one optimizer.

Shape scaling (`adjust_lr_fn`), torch's two choices:
- "original" (the default, torch's and the reference's): s = sqrt(max(1, rows / cols)), which
  keeps the update's RMS alike across rectangular matrices; Muon's lr is then its own (about
  0.02 in the reference) and the AdamW part takes its own lr (`adamw_lr`).
- "match_rms_adamw" (Moonshot's): s = 0.2 sqrt(max(rows, cols)), which matches AdamW's update
  RMS, so AdamW's lr and weight decay carry over and one lr serves both parts.
The default is torch's, so `asteria.optimizer(model, "muon")` and `torch.optim.Muon` agree on the
same arguments.

Muon keeps one buffer per hidden matrix (its momentum) and refreshes nothing: to the runtime it
is a first-order optimizer, like AdamW.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim.adamw import adamw

from asteria_core.compat import Choice

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""The reference's quintic Newton-Schulz coefficients (maximal slope at zero)."""


class MuonScale(Choice):
    """Muon's shape scaling (torch.optim.Muon's `adjust_lr_fn`)."""

    ORIGINAL = "original"  # sqrt(max(1, rows / cols)): the reference's, torch's default
    MATCH_RMS_ADAMW = "match_rms_adamw"  # 0.2 sqrt(max(rows, cols)): Moonshot's


ADJUST_LR_FNS = tuple(m.value for m in MuonScale)
NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
"""The dtype Newton-Schulz runs in: bfloat16 as the reference and torch do; the others for study."""
MAX_NS_STEPS = 99  # torch's bound: more steps than this buy nothing


def zeropower_via_newtonschulz(g: torch.Tensor, coefficients: tuple[float, float, float],
                               steps: int, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """The reference's orthogonalization of a (rows, cols) matrix, in `dtype`: scaled to
    Frobenius norm 1 (so spectral norm <= 1), then `steps` quintic iterations
    X <- a X + (b A + c A^2) X with A = X X^T, on the wide orientation (A is the small side)."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    return x.T if tall else x


def shape_scale(adjust_lr_fn: str, shape: torch.Size) -> float:
    """The lr multiplier of a (rows, cols) matrix (see the module's note)."""
    rows, cols = shape[:2]
    if adjust_lr_fn == MuonScale.MATCH_RMS_ADAMW:
        return 0.2 * math.sqrt(max(rows, cols))
    return math.sqrt(max(1, rows / cols))


def hidden_matrices(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The matrices Muon steps in `model`: every trainable 2-D parameter except the input
    embeddings (nn.Embedding weights) and the output head (`get_output_embeddings()` where the
    model has it, as Hugging Face models do; else its last nn.Linear). A tied head is the
    embedding's own tensor, so it is left out either way."""
    skip = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    # Hugging Face's method; torch's stubs type an unknown Module attribute as Tensor | Module.
    output_embeddings = getattr(model, "get_output_embeddings", None)
    head = output_embeddings() if output_embeddings is not None else None
    if head is None:
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        head = linears[-1] if linears else None
    if head is not None:
        skip.add(id(head.weight))
    return [p for p in model.parameters()
            if p.requires_grad and p.dim() == 2 and id(p) not in skip]


def _check(name: str, value: object, ok: bool, allowed: str) -> None:
    if not ok:
        raise ValueError(f"{name}: got {value!r}; allowed: {allowed}")


def _is_shard(p: torch.Tensor) -> bool:
    return type(p).__name__ == "DTensor" or type(getattr(p, "data", p)).__name__ == "DTensor"


class Muon(torch.optim.Optimizer):
    """Muon on the hidden matrices, AdamW on every other parameter (see the module's note).

    Args:
        params: parameters or groups. A group's `use_muon` says which part steps it; in a group
            without it, the parameters in `hidden` (default: every 2-D parameter, torch's rule)
            go to Muon and the rest to AdamW (the group is split in two, Muon's first).
        lr: Muon's learning rate (before the shape scaling).
        weight_decay: decoupled, both parts (torch.optim.Muon's default 0.1).
        momentum, nesterov: Muon's momentum (0.95) and Nesterov's form (on).
        ns_coefficients, ns_steps, eps: the Newton-Schulz iteration (the reference's).
        adjust_lr_fn: "original" (default) | "match_rms_adamw": the shape scaling.
        ns_dtype: "bfloat16" (default, the reference's) | "float32" | "float64".
        hidden: the parameters Muon steps, where a group does not say (`hidden_matrices(model)`
            picks a model's).
        adamw_lr: the AdamW part's learning rate; None: `lr`.
        adamw_betas, adamw_eps: the AdamW part's moments and epsilon.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True,
                 ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                 eps: float = 1e-7, ns_steps: int = 5,
                 adjust_lr_fn: str | None = MuonScale.ORIGINAL,
                 ns_dtype: str = "bfloat16", hidden: Iterable[torch.Tensor] | None = None,
                 adamw_lr: float | None = None, adamw_betas: tuple[float, float] = (0.9, 0.95),
                 adamw_eps: float = 1e-8) -> None:
        adjust_lr_fn = adjust_lr_fn or MuonScale.ORIGINAL  # torch's None means "original"
        _check("lr", lr, lr >= 0, "a number >= 0")
        _check("weight_decay", weight_decay, weight_decay >= 0, "a number >= 0")
        _check("momentum", momentum, 0 <= momentum < 1, "a number in [0, 1)")
        _check("ns_steps", ns_steps, isinstance(ns_steps, int) and 1 <= ns_steps <= MAX_NS_STEPS,
               f"an integer in [1, {MAX_NS_STEPS}]")
        _check("ns_coefficients", ns_coefficients, len(tuple(ns_coefficients)) == 3,
               "three numbers (a, b, c)")
        _check("eps", eps, eps > 0, "a number > 0")
        _check("adjust_lr_fn", adjust_lr_fn, adjust_lr_fn in ADJUST_LR_FNS,
               " | ".join(ADJUST_LR_FNS))
        _check("ns_dtype", ns_dtype, ns_dtype in NS_DTYPES, " | ".join(NS_DTYPES))
        _check("adamw_lr", adamw_lr, adamw_lr is None or adamw_lr >= 0, "None or a number >= 0")
        _check("adamw_betas", adamw_betas,
               len(adamw_betas) == 2 and all(0 <= b < 1 for b in adamw_betas),
               "two numbers in [0, 1)")
        _check("adamw_eps", adamw_eps, adamw_eps > 0, "a number > 0")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                    "nesterov": nesterov, "ns_coefficients": tuple(ns_coefficients),
                    "eps": eps, "ns_steps": ns_steps, "adjust_lr_fn": adjust_lr_fn,
                    "ns_dtype": ns_dtype, "betas": tuple(adamw_betas), "adamw_eps": adamw_eps}
        groups = _split(params, None if hidden is None else {id(p) for p in hidden},
                        lr if adamw_lr is None else adamw_lr)
        super().__init__(groups, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                if group["use_muon"] and p.dim() != 2:
                    raise ValueError(f"params: Muon steps 2-D matrices, got a parameter of "
                                     f"shape {tuple(p.shape)} in a use_muon group; allowed: "
                                     "2-D parameters (give others use_muon=False: AdamW)")
                if group["use_muon"] and _is_shard(p):
                    raise ValueError("params: Muon orthogonalizes whole matrices, got an FSDP2 "
                                     "shard; allowed: whole parameters (replicated, or "
                                     "distributed_state='sharded', whose owners hold them)")

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["use_muon"]:
                self._muon_step(group)
            else:
                self._adamw_step(group)
        return loss

    def _muon_step(self, group: dict) -> None:
        lr, momentum = group["lr"], group["momentum"]
        dtype = NS_DTYPES[group["ns_dtype"]]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad,
                                                            memory_format=torch.preserve_format)
            buf = state["momentum_buffer"]
            buf.lerp_(grad, 1 - momentum)  # torch's form of B <- mu B + (1 - mu) g
            update = grad.lerp(buf, momentum) if group["nesterov"] else buf
            update = zeropower_via_newtonschulz(update, group["ns_coefficients"],
                                                group["ns_steps"], group["eps"], dtype)
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(update, alpha=-lr * shape_scale(group["adjust_lr_fn"], p.shape))

    def _adamw_step(self, group: dict) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self.state[p]
            if not state:  # torch.optim.AdamW's state, as it makes it
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            params.append(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        if params:
            beta1, beta2 = group["betas"]
            adamw(params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, beta1=beta1,
                  beta2=beta2, lr=group["lr"], weight_decay=group["weight_decay"],
                  eps=group["adamw_eps"], maximize=False)


def _split(params: Iterable, hidden: set[int] | None, adamw_lr: float) -> list[dict]:
    """The groups with `use_muon` set: a group that does not say is split in two (Muon's part
    first, so param_groups[0] is Muon's where there is one)."""
    given = list(params)
    groups: list[dict[str, Any]] = \
        given if given and isinstance(given[0], dict) else [{"params": given}]
    muon: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for group in groups:
        group = dict(group)
        members = [group["params"]] if isinstance(group["params"], torch.Tensor) \
            else list(group["params"])
        if "use_muon" in group:
            group["params"] = members
            if not group["use_muon"]:
                group.setdefault("lr", adamw_lr)
            (muon if group["use_muon"] else rest).append(group)
            continue
        chosen = [p for p in members
                  if (p.dim() == 2 if hidden is None else id(p) in hidden)]
        others = [p for p in members if not any(p is q for q in chosen)]
        if chosen:
            muon.append({**group, "params": chosen, "use_muon": True})
        if others:
            rest.append({"lr": adamw_lr, **group, "params": others, "use_muon": False})
    return muon + rest
