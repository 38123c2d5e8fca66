"""Name -> optimizer: the one dispatch point for the optimizer axis, and `optimizer()`, the
public way in.

    opt = asteria.optimizer(model, "soap", lr=3e-3, policy=asteria.Policy(staleness_bound=5))

`build_optimizer` makes the bare torch optimizer; `optimizer` also attaches a `Runtime` to it
(`opt.runtime`), which runs the step boundary inside every `opt.step()`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from asteria_core.optim.registry import OPTIMIZERS, spec_of
from asteria_core.optim.seam import refresh_fn as default_refresh_fn
from asteria_core.policy import LivePolicy, Policy
from asteria_core.runtime.config import RefreshFn, RuntimeConfig
from asteria_core.runtime.runtime import Runtime
from asteria_core.runtime.section import DEFAULTS, option
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.reporter import RunReporter

__all__ = ["OPTIMIZERS", "build_optimizer", "decay_groups", "optimizer"]


def build_optimizer(name: str, params: Iterable, *, lr: float = 3e-3,
                    betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8,
                    refresh_interval: int = 10, **options: Any) -> torch.optim.Optimizer:
    """The torch optimizer `name` over `params` (tensors or parameter groups). `betas` and `eps`
    mean the same for every name (for Shampoo: its momentum and its grafting AdamW's second
    moment and eps); second-order options (`block_size`, `max_precond_dim`, `shampoo_beta`,
    `refresh`, `moment_swap`, ...) go to the optimizer's own constructor."""
    return spec_of(name).build(list(params), lr=lr, betas=betas, eps=eps,
                               refresh_interval=refresh_interval, **options)


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Matrices (dim >= 2) decay; gains and biases do not (nanoGPT's rule)."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def optimizer(model: torch.nn.Module | Iterable, name: str = "soap", *, lr: float = 3e-3,
              policy: Policy | LivePolicy | None = None, weight_decay: float = 0.0,
              telemetry: TelemetryConfig | None = None, reporter: RunReporter | None = None,
              run_id: str | None = None, run_dir: str | Path | None = None,
              records: str | Path | None = None,
              coherence_threshold: float = DEFAULTS.coherence_threshold,
              distributed_state: str = DEFAULTS.distributed_state,
              update_dtype: str = DEFAULTS.update_dtype,
              rebalance_rounds: int = DEFAULTS.rebalance_rounds,
              refresh_fn: RefreshFn = default_refresh_fn,
              trackers: str | Sequence[str] = "", **options: Any) -> torch.optim.Optimizer:
    """A torch optimizer with Asteria's runtime attached (`opt.runtime`).

    `model` is the module being trained (its forward tells the runtime when a step starts, its
    phases and its tokens, and the tier store what to prefetch), or an iterable of parameters or
    groups (then mark phases with `opt.runtime.phase(...)`). The refresh interval comes from the
    policy, which may change it mid-run. `weight_decay` (default 0, whatever the optimizer
    class's own default) applies to matrices only when a module is given. See `RuntimeConfig` for
    `telemetry`, `reporter`, `run_id`, `run_dir`, `records`, `coherence_threshold`,
    `distributed_state`, `update_dtype`, `rebalance_rounds` and `refresh_fn`. `trackers`
    ("tensorboard", ["mlflow", "wandb"]) also logs every step record there (telemetry's
    `trackers`, under the run's folder).
    """
    if trackers:
        names = trackers if isinstance(trackers, str) else ",".join(trackers)
        telemetry = dataclasses.replace(telemetry or TelemetryConfig(), trackers=names)
    live = policy if isinstance(policy, LivePolicy) else LivePolicy(policy or Policy())
    module: torch.nn.Module | None = None
    params: Iterable[Any]
    if isinstance(model, torch.nn.Module):
        module = model
        params = decay_groups(module, weight_decay)
        options = {**spec_of(name).model_options(module), **options}
    else:  # the groups' own weight_decay, where given, wins over this default
        params, options["weight_decay"] = model, weight_decay
    opt = build_optimizer(name, params, lr=lr, refresh_interval=live.current.refresh_interval,
                          **options)
    Runtime(opt, model=module,
            config=RuntimeConfig(policy=live, telemetry=telemetry, reporter=reporter,
                                 run_id=run_id, run_dir=run_dir, records=records,
                                 optimizer_name=name, coherence_threshold=coherence_threshold,
                                 distributed_state=option("distributed_state",
                                                          distributed_state),
                                 update_dtype=option("update_dtype", update_dtype),
                                 rebalance_rounds=rebalance_rounds, refresh_fn=refresh_fn))
    return opt
