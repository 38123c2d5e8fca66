"""Hugging Face Trainer: an Asteria optimizer for `Trainer(optimizers=...)` and a callback.

    from asteria_core.integrations import hf
    opt, scheduler = hf.optimizers(model, "soap", lr=3e-3, policy=asteria.Policy(workers=1),
                                   num_training_steps=args.max_steps, device=args.device)
    trainer = Trainer(model=model, args=args, train_dataset=data, optimizers=(opt, scheduler))
    hf.attach(trainer)   # AsteriaCallback, placed where HF's reporters see its figures
    trainer.train()      # the runtime is closed when training ends

Inside Trainer: Accelerate wraps the optimizer (AcceleratedOptimizer), whose step() calls ours
once per optimizer step (under gradient accumulation only after the last micro-batch), so the
runtime's hooks run the boundary there and there is one record per optimizer step. A step starts
at its first micro-batch's forward (Trainer fetches the step's batches before it, so data loading
is outside the step); the phases are forward, backward (backward, then gradient clipping),
optimizer and boundary; evaluation (eval mode, no grad) is outside every step.
"""

from __future__ import annotations

from typing import Any

try:
    import transformers
    from transformers import TrainerCallback
except ImportError as exc:  # an optional extra: say how to get it
    from asteria_core.extras import MissingExtra, message

    raise MissingExtra(message("asteria_core.integrations.hf", "hf",
                               [exc.name or "transformers"])) from exc

import torch

import asteria_core as asteria
from asteria_core.integrations import StepFigures, find_runtime

__all__ = ["AsteriaCallback", "attach", "optimizers"]


def optimizers(model: torch.nn.Module, name: str = "soap", *, lr: float = 3e-3,
               policy: asteria.Policy | asteria.LivePolicy | None = None,
               num_training_steps: int | None = None, num_warmup_steps: int = 0,
               lr_scheduler_type: str = "linear", device: Any = None,
               **options: Any) -> tuple[torch.optim.Optimizer, Any]:
    """(optimizer, lr scheduler) for `Trainer(optimizers=...)`: `asteria.optimizer(model, name,
    ...)` (its runtime is `opt.runtime`; `options` go to it) and transformers' scheduler
    `lr_scheduler_type` over `num_training_steps` (None: the Trainer builds one from its args).
    `device` (e.g. `args.device`): move the model there first, since the runtime reads its
    device from the parameters and Trainer would move them only later."""
    if device is not None:
        model.to(device)
    opt = asteria.optimizer(model, name, lr=lr, policy=policy, **options)
    scheduler = None
    if num_training_steps is not None:
        scheduler = transformers.get_scheduler(lr_scheduler_type, opt,
                                               num_warmup_steps=num_warmup_steps,
                                               num_training_steps=num_training_steps)
    return opt, scheduler


def attach(trainer: transformers.Trainer, runtime: asteria.Runtime | None = None
           ) -> AsteriaCallback:
    """Add an AsteriaCallback to `trainer` right after DefaultFlowCallback: before the reporting
    integrations (TensorBoard, W&B, ...), which HF runs before callbacks passed to Trainer, so
    they log the figures it adds, and after the flow callback, whose save decision it reads."""
    callback = AsteriaCallback(runtime)
    handler = trainer.callback_handler
    flow = [i for i, cb in enumerate(handler.callbacks)
            if isinstance(cb, transformers.DefaultFlowCallback)]
    handler.callbacks.insert(flow[0] + 1 if flow else 0, callback)
    return callback


class AsteriaCallback(TrainerCallback):
    """Reports the step records to HF and HF's figures to the records.

    - loss: each step's training loss, from the model's outputs over its micro-batches (summed
      when Trainer normalised them by the step's token count, `num_items_in_batch`, else their
      mean), so it is right under gradient accumulation; grad_norm from HF's logs;
    - eval_loss: from `on_evaluate`, into the record of the step evaluated after;
    - HF's logs get `asteria/...` figures (idle seconds per cause since the last log, staleness,
      policy version, energy so far) and so do HF's loggers, `attach` placing it before them;
    - `runtime.stop_requested` stops training after the step; a checkpoint first settles the
      outstanding refreshes; `on_train_end` closes the runtime (its last record completes).

    `runtime`: None finds it on the Trainer's optimizer at `on_train_begin`."""

    def __init__(self, runtime: asteria.Runtime | None = None) -> None:
        self.runtime = runtime
        self.figures: StepFigures | None = None
        self._losses: list[torch.Tensor] = []
        self._summed = False
        self._hooks: list[Any] = []
        self._open = False

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.runtime is None:
            self.runtime = find_runtime(optimizer)
        self.figures = StepFigures(self.runtime)
        watched = self.runtime.model if self.runtime.model is not None else model
        if watched is not None:
            self._hooks = [watched.register_forward_pre_hook(self._before_forward,
                                                             with_kwargs=True),
                           watched.register_forward_hook(self._after_forward)]
        self._open = True

    def _before_forward(self, module, args, kwargs) -> None:
        # Trainer passes num_items_in_batch when the model's loss is already divided by the
        # whole step's token count: then the step's loss is the sum over micro-batches.
        self._summed = kwargs.get("num_items_in_batch") is not None

    def _after_forward(self, module, args, output) -> None:
        loss = getattr(output, "loss", None)
        if module.training and torch.is_grad_enabled() and isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach().float().mean())

    def on_step_end(self, args, state, control, **kwargs):
        runtime = self.runtime
        record = runtime.last_record  # open until the next step starts: figures still land
        if record is not None:
            if self._losses:
                losses = torch.stack(self._losses)
                runtime.log(loss=losses.sum() if self._summed else losses.mean())
            self.figures.add(record)
        self._losses = []
        self._before_save(control)
        if runtime.stop_requested:
            control.should_training_stop = True

    def on_epoch_end(self, args, state, control, **kwargs):
        self._before_save(control)

    def _before_save(self, control) -> None:
        if control.should_save:  # the checkpoint then holds the outstanding refreshes
            assert self.runtime is not None  # set by on_train_begin
            self.runtime.settle()

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not self._open or logs is None or "loss" not in logs:
            return  # only training logs, not eval metrics or the end-of-training summary
        if "grad_norm" in logs:
            self.runtime.log(grad_norm=logs["grad_norm"])
        figures = self.figures.flush()
        logs.update(figures)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(figures)  # Trainer appended a copy before on_log

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self._open and metrics and "eval_loss" in metrics:
            self.runtime.log(eval_loss=metrics["eval_loss"])

    def on_train_end(self, args, state, control, **kwargs):
        if not self._open:
            return
        self._open = False
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.runtime.close()
