"""Optional adapters for training frameworks: `hf` (Hugging Face Trainer) and `lightning`
(Lightning). Each needs its framework (`pip install "asteria[hf]"` / `"asteria[lightning]"`) and
uses only the public runtime API; importing this package imports neither framework.

Inside a framework the runtime works as in a plain loop: its hooks on the optimizer and the model
run the step boundary inside every optimizer step, so there is one step record per optimizer
step. The callbacks add what the hooks cannot see (the framework's loss under gradient
accumulation, eval loss), put the runtime's figures in the framework's logs, stop training on
`runtime.stop_requested` and close the runtime when training ends.
"""

from __future__ import annotations

from typing import Any

from asteria_core import Runtime, StepRecord

__all__ = ["StepFigures", "find_runtime"]


def find_runtime(optimizer: Any) -> Runtime:
    """The runtime attached to `optimizer`, through a framework's wrapper (Accelerate's
    AcceleratedOptimizer holds the optimizer as `.optimizer`)."""
    for candidate in (optimizer, getattr(optimizer, "optimizer", None)):
        runtime = getattr(candidate, "runtime", None)
        if isinstance(runtime, Runtime):
            return runtime
    raise ValueError("this optimizer has no Asteria runtime attached: build it with "
                     "asteria_core.optimizer(...) or the integration's helper")


class StepFigures:
    """The runtime's figures of the steps since a framework last logged, flat for its loggers:
    idle seconds per cause (summed over the steps), the largest staleness over the steps (the
    value at the logging step alone would be a refresh step's 0 whenever the logging interval
    is a multiple of the refresh interval), the latest policy version, energy so far per source
    (joules)."""

    def __init__(self, runtime: Runtime, prefix: str = "asteria/") -> None:
        self.prefix = prefix
        self._idle: dict[str, float] = {}
        self._latest: dict[str, float] = {}
        self._staleness: int | None = None
        self._energy: dict[str, float] = {}
        # energy is added when a record completes (at the next step's start), so it comes from
        # the newest completed record, one step behind the rest
        runtime.add_listener(self._completed)

    def _completed(self, record: StepRecord) -> None:
        if record.energy is not None:
            self._energy = dict(record.energy.joules)

    def add(self, record: StepRecord) -> None:
        """A step's record, at the step's end (still open: timing and refresh are final)."""
        if record.timing is not None:
            for cause, seconds in record.timing.idle_seconds.items():
                self._idle[cause] = self._idle.get(cause, 0.0) + seconds
        self._latest["policy_version"] = record.policy_version
        if record.refresh is not None:
            self._staleness = max(self._staleness or 0, record.refresh.staleness_max)

    def flush(self) -> dict[str, float]:
        """The figures for one log entry; the idle sums start again."""
        figures = {f"idle_seconds/{cause}": s for cause, s in self._idle.items()}
        figures.update(self._latest)
        if self._staleness is not None:
            figures["staleness_max"] = self._staleness
        figures.update({f"energy_joules/{source}": j for source, j in self._energy.items()})
        self._idle, self._staleness = {}, None
        return {self.prefix + name: float(value) for name, value in figures.items()}
