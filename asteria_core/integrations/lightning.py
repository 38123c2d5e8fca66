"""Lightning: a `configure_optimizers` helper and a callback.

    from asteria_core.integrations import lightning as asteria_pl

    class Model(L.LightningModule):
        def configure_optimizers(self):
            return asteria_pl.configure_optimizers(self, "soap", lr=3e-3, policy=policy)

    trainer = L.Trainer(callbacks=[asteria_pl.AsteriaCallback()], ...)

Inside Lightning: automatic optimization calls `optimizer.step(closure=...)`, through its
LightningOptimizer wrapper and precision plugin, with forward and backward inside the closure;
the runtime's pre-hook starts the step there (or at the first micro-batch's forward under
gradient accumulation) and times the closure, so the phases are forward, backward, optimizer and
boundary and there is one record per optimizer step. Manual optimization (`self.optimizers()
.step()`) reaches the same hooks. Validation (eval mode, no grad) is outside every step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as exc:  # an optional extra: say how to get it
    from asteria_core.extras import MissingExtra, message

    raise MissingExtra(message("asteria_core.integrations.lightning", "lightning",
                               [exc.name or "lightning"])) from exc

import torch

import asteria_core as asteria
from asteria_core.integrations import StepFigures, find_runtime

__all__ = ["AsteriaCallback", "configure_optimizers"]


def configure_optimizers(model: torch.nn.Module, name: str = "soap", *, lr: float = 3e-3,
                         policy: asteria.Policy | asteria.LivePolicy | None = None,
                         scheduler: Callable[[torch.optim.Optimizer], Any] | None = None,
                         **options: Any) -> Any:
    """What `LightningModule.configure_optimizers` returns: `asteria.optimizer(model, name, ...)`
    (`options` go to it), with `scheduler(optimizer)` stepped every optimizer step when given.

    `model` is the module whose forward `training_step` calls, usually the LightningModule
    itself (`self(x)`): its parameters are trained, and its forward starts a step, counts tokens
    and carries the loss. Lightning has put it on its device by then."""
    opt = asteria.optimizer(model, name, lr=lr, policy=policy, **options)
    if scheduler is None:
        return opt
    return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler(opt), "interval": "step"}}


class AsteriaCallback(pl.Callback):
    """Reports the step records to Lightning and Lightning's figures to the records.

    - loss: the model's own output (see `configure_optimizers`), else what `training_step`
      returned (Lightning divides it by the accumulation count, so the micro-batches sum);
    - eval_loss: the `eval_metric` Lightning holds after validation;
    - `pl_module.log_dict` gets `asteria/...` figures every optimizer step (idle seconds per
      cause, staleness, policy version, energy so far), so Lightning's loggers have them;
    - `runtime.stop_requested` sets `trainer.should_stop`; a checkpoint settles the outstanding
      refreshes first (its `state_dict`, which Lightning takes before the optimizer's state);
      the runtime is closed when training ends or fails.

    `runtime`: None finds it on the trainer's optimizers at `on_train_start`."""

    def __init__(self, runtime: asteria.Runtime | None = None, *,
                 eval_metric: str = "val_loss") -> None:
        self.runtime = runtime
        self.eval_metric = eval_metric
        self.figures: StepFigures | None = None
        self._losses: list[torch.Tensor] = []
        self._step = 0
        self._open = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.runtime is None:
            found = [o for o in trainer.optimizers if getattr(o, "runtime", None) is not None]
            self.runtime = find_runtime(found[0] if found else None)
        self.figures = StepFigures(self.runtime)
        self._step = self.runtime.step
        self._open = True

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        runtime, figures = self.runtime, self.figures
        assert runtime is not None and figures is not None  # set by on_train_start
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach().float().mean())
        if runtime.step == self._step:
            return  # a micro-batch of gradient accumulation: no optimizer step yet
        self._step = runtime.step
        record = runtime.last_record  # open until the next step starts: figures still land
        if record is not None:
            if record.loss is None and self._losses:
                runtime.log(loss=torch.stack(self._losses).sum())
            figures.add(record)
            pl_module.log_dict(figures.flush(), on_step=True, on_epoch=False)
        self._losses = []
        if runtime.stop_requested:
            trainer.should_stop = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        value = trainer.callback_metrics.get(self.eval_metric)
        if self._open and not trainer.sanity_checking and value is not None:
            assert self.runtime is not None  # open: set by on_train_start
            self.runtime.log(eval_loss=value)

    def state_dict(self) -> dict[str, Any]:
        if not self._open:
            return {}
        assert self.runtime is not None  # open: set by on_train_start
        self.runtime.settle()  # so the optimizer state saved next holds outstanding refreshes
        return self.runtime.state_dict()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._close()  # joins the refresh workers

    def _close(self) -> None:
        if self._open:
            self._open = False
            assert self.runtime is not None  # open: set by on_train_start
            self.runtime.close()
