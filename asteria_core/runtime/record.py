"""The step record's room in the runtime: what a loop logs, the loss a model returns and the
tokens it read, written into a `StepRecord` (asteria_core/telemetry/records.py)."""

from __future__ import annotations

import time
from typing import Any

import torch

from asteria_core.telemetry.records import StepRecord, TimingFigures

RECORD_FIELDS = ("loss", "eval_loss", "grad_norm", "tokens", "lr")
"""Figures `log()` puts in the record's own fields; any other name goes to `extra`."""


def _scalar(value: Any) -> Any:
    return value.detach().float().mean().item() if isinstance(value, torch.Tensor) else value


def loss_of(output: Any) -> torch.Tensor | None:
    """The scalar loss in a model's output, if it carries one."""
    if isinstance(output, torch.Tensor):
        return output if output.dim() == 0 else None
    loss = getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    if isinstance(output, tuple | list):
        for item in output:
            if isinstance(item, torch.Tensor) and item.dim() == 0 and item.is_floating_point():
                return item
    return None


def put(record: StepRecord, figures: dict[str, Any], *, keep_tensors: bool = False) -> None:
    """Write logged figures into the record (tensors read now unless `keep_tensors`)."""
    read = (lambda v: v) if keep_tensors else _scalar
    for name, value in figures.items():
        if name in RECORD_FIELDS:
            setattr(record, name, read(value))
        else:
            record.extra[name] = read(value)
    if not keep_tensors:
        for name in RECORD_FIELDS:
            setattr(record, name, _scalar(getattr(record, name)))
        record.extra = {k: _scalar(v) for k, v in record.extra.items()}


class StepInProgress:
    """The figures of the step in progress, then its record until it is complete.

    A record is built at the step's boundary (`build`) and stays open (`pending`) until the
    next step starts, so figures the loop logs after `optimizer.step()` still land in it."""

    def __init__(self) -> None:
        self.pending: StepRecord | None = None
        """The record of the step just finished, still open."""
        self._figures: dict[str, Any] = {}
        self._losses: list[torch.Tensor] = []
        self._tokens = 0
        self._lr = 0.0
        self._version = 0

    def start(self, policy_version: int) -> None:
        """A step starts (figures logged since the last record stay)."""
        self._losses, self._tokens, self._version = [], 0, policy_version

    def read_input(self, args: tuple, kwargs: dict) -> None:
        """Tokens: the integer input's elements (the first positional tensor or input_ids)."""
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor) and not ids.is_floating_point():
            self._tokens += ids.numel()

    def read_output(self, output: Any) -> None:
        loss = loss_of(output)
        if loss is not None:
            self._losses.append(loss.detach())

    def read_lr(self, optimizer: torch.optim.Optimizer) -> None:
        self._lr = float(optimizer.param_groups[0]["lr"])

    def log(self, figures: dict[str, Any], *, in_step: bool) -> None:
        """Into the open record between steps, else into the step in progress."""
        if self.pending is not None and not in_step:
            put(self.pending, figures)
        else:
            self._figures.update(figures)

    def build(self, step: int, phases: dict[str, float], wall: float,
              timing: TimingFigures | None, sections: dict[str, Any]) -> StepRecord:
        """The step's record, from its figures and the boundary's sections; it stays open."""
        record = StepRecord(step=step, time=time.time(), loss=None, lr=self._lr,
                            tokens=self._tokens, step_seconds=wall, phase_seconds=phases,
                            policy_version=self._version, timing=timing, **sections)
        if self._losses:  # the mean over the step's forwards, a tensor until `complete`
            losses = self._losses
            put(record, {"loss": losses[0] if len(losses) == 1 else torch.stack(losses).mean()},
                keep_tensors=True)
        put(record, self._figures, keep_tensors=True)
        self._figures = {}
        self.pending = record
        return record

    def complete(self) -> StepRecord | None:
        """Close the open record (tensors logged after step() become numbers now)."""
        record, self.pending = self.pending, None
        if record is not None:
            put(record, {})
        return record
