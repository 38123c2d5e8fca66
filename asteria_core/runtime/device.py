"""Where the optimizer's parameters train: read when the runtime is built and again at the first
step, since an optimizer may be built before `model.cuda()`. If they moved in between, the parts
that depend on the device follow (the timer's events, the meter's GPU, the tier store's homes:
host copies exist on a GPU only)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)


class ParameterDevice:
    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer
        self.device = self.now()
        self.found = False
        """Whether the first step read it again (`find`)."""

    def now(self) -> torch.device:
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return params[0].device if params else torch.device("cpu")

    def find(self, *followers: Callable[[torch.device], None]) -> torch.device:
        """At the first step: the device the parameters are on now; each follower is told when
        it is another than the one read at the start."""
        self.found = True
        device = self.now()
        if device != self.device:
            log.debug("the parameters moved from %s to %s before the first step", self.device,
                      device)
            self.device = device
            for follow in followers:
                follow(device)
        return self.device
