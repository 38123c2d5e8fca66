"""The public runtime API: any training loop drives Asteria through it (docs/architecture.md).

    import asteria_core as asteria
    opt = asteria.optimizer(model, "soap", lr=3e-3, policy=asteria.Policy(staleness_bound=5))
"""

from asteria_core.runtime.config import RuntimeConfig
from asteria_core.runtime.factory import OPTIMIZERS, build_optimizer, decay_groups, optimizer
from asteria_core.runtime.runtime import Runtime

__all__ = ["OPTIMIZERS", "Runtime", "RuntimeConfig", "build_optimizer", "decay_groups",
           "optimizer"]
