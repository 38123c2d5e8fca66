"""The GPT trainer: config, model, data, loop, checkpoints."""

from asteria_core.train.config import (
    ConfigError,
    DataConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
)
from asteria_core.train.model import GPT
from asteria_core.train.trainer import Trainer, TrainResult

__all__ = [
    "GPT",
    "ConfigError",
    "DataConfig",
    "ModelConfig",
    "OptimConfig",
    "RunConfig",
    "TrainConfig",
    "TrainResult",
    "Trainer",
]
