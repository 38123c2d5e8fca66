"""Refresh functions with injected faults (picklable, so process workers can run them too)."""

from __future__ import annotations

import threading
import time

import torch

from asteria_core.optim.seam import refresh_fn


class SlowRefresh:
    """The real refresh, after sleeping `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __call__(self, snapshot, config):
        time.sleep(self.seconds)
        return refresh_fn(snapshot, config)


RELEASE_HANGS = threading.Event()
"""Set by a test when it is done, so a hung worker thread of this process can end."""


class FaultyRefresh:
    """Fails the refreshes of statistics steps in `steps`: by raising, returning NaN, or hanging."""

    def __init__(self, steps: set[int], how: str) -> None:
        self.steps, self.how = steps, how

    def __call__(self, snapshot, config):
        result = refresh_fn(snapshot, config)
        if snapshot.stats_step not in self.steps:
            return result
        match self.how:
            case "raise":
                raise torch.linalg.LinAlgError("injected: the decomposition did not converge")
            case "nan":
                result.basis.fill_(float("nan"))
                return result
            case "hang":
                RELEASE_HANGS.wait(120)
        return result
