"""Config -> optimizer: the trainer's `optim` section in the runtime's terms."""

from __future__ import annotations

import torch

from asteria_core.optim.registry import spec_of
from asteria_core.policy import Policy
from asteria_core.runtime import build_optimizer, decay_groups
from asteria_core.train.config import OptimConfig


def optimizer_from_config(config: OptimConfig, model: torch.nn.Module,
                          policy: Policy) -> torch.optim.Optimizer:
    """The refresh interval comes from the live policy, which may change it mid-run."""
    settings = {"max_precond_dim": config.max_precond_dim,
                "block_size": config.precond_block_size, "shampoo_beta": config.shampoo_beta,
                "refresh": config.refresh_method, "moment_swap": config.moment_swap,
                "adjust_lr_fn": config.muon_scale, "pack_factors": config.pack_factors,
                "adamw_lr": None if config.adamw_lr < 0 else config.adamw_lr}
    spec = spec_of(config.name)
    options = {key: settings[key] for key in spec.config_options}
    return build_optimizer(config.name, decay_groups(model, config.weight_decay), lr=config.lr,
                           betas=config.betas, eps=config.eps,
                           refresh_interval=policy.refresh_interval,
                           **spec.model_options(model), **options)
