"""The step record's room in the runtime: what a loop logs, and the loss a model returns,
written into a `StepRecord` (asteria_core/telemetry/records.py)."""

from __future__ import annotations

from typing import Any

import torch

from asteria_core.telemetry.records import StepRecord

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
