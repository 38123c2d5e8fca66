"""The runtime's torch hooks: what a training loop does, seen from the optimizer and the model.

A step starts at the first training forward (or `optimizer.step()`) after the previous boundary.
The hooks infer the phases: `forward` (the model's forward), `backward` (from the end of the
forward to `optimizer.step()`), `optimizer`; a phase the loop marked itself
(`runtime.phase(name)`) wins over them. Evaluation forwards (eval mode or no grad) are no part
of a step. What the hooks see goes to a `StepEvents` (the runtime), which owns the step.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from asteria_core.telemetry.labels import Phase
from asteria_core.telemetry.timing import PhaseTimer, PhaseToken


class StepEvents(Protocol):
    """What the hooks tell the runtime, in the order a step runs them."""

    def begin(self) -> None:
        """A step starts now, unless one is in progress."""

    def forward_input(self, args: tuple, kwargs: dict) -> None:
        """A training forward is about to run on these inputs."""

    def forward_output(self, output: Any) -> None:
        """A training forward returned `output`."""

    def optimizer_begins(self, optimizer: torch.optim.Optimizer) -> None:
        """`optimizer.step()` is about to update the parameters."""

    def optimizer_done(self) -> None:
        """The update is done: the step boundary runs, the step ends."""


class TorchHooks:
    """Step pre/post hooks on the optimizer and forward pre/post hooks on the model (if any)."""

    def __init__(self, timer: PhaseTimer, events: StepEvents,
                 optimizer: torch.optim.Optimizer, model: torch.nn.Module | None) -> None:
        self.timer = timer
        self.events = events
        self._auto: dict[str, PhaseToken] = {}
        """Phases the hooks opened themselves (and may close)."""
        self._handles = [optimizer.register_step_pre_hook(self.before_optimizer),
                         optimizer.register_step_post_hook(self.after_optimizer)]
        if model is not None:
            self._handles += [model.register_forward_pre_hook(self.before_forward,
                                                              with_kwargs=True),
                              model.register_forward_hook(self.after_forward)]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    # -------------------------------------------------------------- what torch calls
    def before_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # an evaluation forward is no part of a step
        self.events.begin()
        self.events.forward_input(args, kwargs)
        self._open(Phase.FORWARD)

    def after_forward(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if not (module.training and torch.is_grad_enabled()) or not self.timer.in_step:
            return
        self.events.forward_output(output)
        if Phase.FORWARD in self._auto:
            self._close(Phase.FORWARD)
            self._open(Phase.BACKWARD)

    def before_optimizer(self, optimizer: torch.optim.Optimizer, args: tuple,
                         kwargs: dict) -> tuple[tuple, dict] | None:
        self.events.begin()
        self._close(Phase.BACKWARD)
        self._open(Phase.OPTIMIZER)
        self.events.optimizer_begins(optimizer)
        # torch passes step()'s own args, the optimizer first: a closure is args[1] or a kwarg.
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            return None

        def timed_closure():  # Lightning runs forward and backward inside step(closure)
            try:
                return closure()
            finally:
                self._close(Phase.BACKWARD)
                self._open(Phase.OPTIMIZER)

        if "closure" in kwargs:
            return args, {**kwargs, "closure": timed_closure}
        return (args[0], timed_closure, *args[2:]), kwargs

    def after_optimizer(self, optimizer: torch.optim.Optimizer, args: tuple,
                        kwargs: dict) -> None:
        self._close(Phase.OPTIMIZER)
        self._auto = {}  # the boundary is timed by the runtime; the step ends in it
        self.events.optimizer_done()

    # -------------------------------------------------------------- inferred phases
    def _open(self, name: str) -> None:
        """A phase the hooks infer; a phase the loop marked itself is left alone."""
        current = self.timer.current_phase
        if current is None or self._auto.get(current) is not None:
            self._close(current)
            self._auto[name] = self.timer.enter(name)

    def _close(self, name: str | None) -> None:
        token = self._auto.pop(name, None) if name is not None else None
        if token is not None:
            self.timer.leave(token)
