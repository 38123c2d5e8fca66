"""Config -> optimizer: the one dispatch point for the optimizer axis."""

from __future__ import annotations

import torch

from asteria_core.optim import SOAP, KLShampoo, Shampoo
from asteria_core.policy import Policy
from asteria_core.train.config import OptimConfig
from asteria_core.train.model import GPT


def build_optimizer(config: OptimConfig, model: GPT, policy: Policy) -> torch.optim.Optimizer:
    """The refresh interval comes from the live policy, which may change it mid-run."""
    groups = model.param_groups(config.weight_decay)
    blocking = {"max_precond_dim": config.max_precond_dim, "block_size": config.precond_block_size,
                "precondition_frequency": policy.refresh_interval}
    match config.name:
        case "adamw":
            return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps)
        case "soap":
            return SOAP(groups, lr=config.lr, betas=config.betas, eps=config.eps,
                        shampoo_beta=config.shampoo_beta, refresh=config.refresh_method,
                        moment_swap=config.moment_swap, **blocking)
        case "kl_shampoo":
            return KLShampoo(groups, lr=config.lr, betas=config.betas, eps=config.eps,
                             shampoo_beta=config.shampoo_beta, refresh=config.refresh_method,
                             moment_swap=config.moment_swap, **blocking)
        case "shampoo":
            return Shampoo(groups, lr=config.lr, betas=(config.betas[0], 1.0),
                           grafting_beta2=config.betas[1], grafting_eps=config.eps, **blocking)
        case _:
            raise NotImplementedError(f"optim.name {config.name!r}")
