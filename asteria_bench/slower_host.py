"""An emulated slower host: every refresh takes `factor` times its own measured time.

On a GPU the training step shrinks many-fold while a refresh on the host's CPU does not, so the
refresh work weighs far more against an interval of training than on this CPU, where SOAP's own
per-step rotations keep every model's refresh duty under about 0.5. A benchmark that needs the
GPU's proportions emulates them here, and says so: the real refresh runs, then the worker sleeps
(factor - 1) times as long. The sleep holds the worker as the longer refresh would, and leaves
the CPU to training, as a host's own cores would; anything that slows the real refresh (a CPU
hog on the workers' core) slows the emulated one in proportion.
"""

from __future__ import annotations

import time

from asteria_core.optim.seam import FactorSnapshot, RefreshConfig, RefreshResult, refresh_fn


class SlowerHost:
    def __init__(self, factor: float) -> None:
        if factor < 1:
            raise ValueError(f"factor: got {factor}; allowed: >= 1")
        self.factor = factor

    def __call__(self, snapshot: FactorSnapshot, config: RefreshConfig) -> RefreshResult:
        start = time.perf_counter()
        result = refresh_fn(snapshot, config)
        time.sleep((self.factor - 1) * (time.perf_counter() - start))
        return result

    def describe(self) -> str:
        return f"refreshes emulated {self.factor:g}x slower than measured (asteria_bench/" \
               "slower_host.py: a GPU's step against a host's refresh)"
