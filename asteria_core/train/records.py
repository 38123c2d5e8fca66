"""The step record: every figure of one step as a plain object.

Later parts (telemetry, refresh engine, tiers, control plane) extend a record through `extra`
and read it through `to_dict`; the JSONL writer appends one record per line for offline runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class StepRecord:
    step: int
    """1-based index of the optimizer step this record describes."""
    time: float
    """Unix time at the end of the step."""
    loss: float
    """Training loss of this step's batch."""
    lr: float
    """Learning rate used by this step."""
    tokens: int
    """Tokens processed by this step."""
    step_seconds: float
    """Wall time of the step, host side."""
    phase_seconds: dict[str, float]
    """Seconds per phase (data, forward, backward, optimizer, boundary)."""
    eval_loss: float | None = None
    """Validation loss, on steps where one was computed."""
    grad_norm: float | None = None
    """Global gradient norm before clipping."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Figures added by other parts of the runtime (staleness, tiers, energy, ...)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.step_seconds if self.step_seconds > 0 else 0.0


class JsonlWriter:
    """Appends step records to a file, one JSON object per line, flushed per write."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def __call__(self, record: StepRecord) -> None:
        self._file.write(json.dumps(record.to_dict()) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
