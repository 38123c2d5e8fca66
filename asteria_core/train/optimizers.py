"""Config -> optimizer: the one dispatch point for the optimizer axis."""

from __future__ import annotations

import torch

from asteria_core.train.config import OptimConfig
from asteria_core.train.model import GPT


def build_optimizer(config: OptimConfig, model: GPT) -> torch.optim.Optimizer:
    groups = model.param_groups(config.weight_decay)
    match config.name:
        case "adamw":
            return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps)
        case _:
            raise NotImplementedError(f"optim.name {config.name!r} is not built yet")
