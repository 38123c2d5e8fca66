"""The runtime: what Asteria adds to a torch optimizer, driven by any training loop.

    opt = asteria.optimizer(model, "soap", policy=asteria.Policy(staleness_bound=5))
    for x, y in loader:
        loss = model(x, y)
        loss.backward()
        opt.step(); opt.zero_grad()      # the step boundary runs inside step()
    opt.runtime.close()

`Runtime(optimizer, model=...)` hooks into the optimizer (step pre/post hooks) and, when given,
the model (forward pre/post hooks), so a loop needs no other call. What it sees:

- a step starts at the first training forward (or `phase()`, or `optimizer.step()`) after the
  previous boundary; time before that (data loading the loop did not mark, evaluation) is
  outside any step. Phases: `forward` (the model's forward), `backward` (from the end of the
  forward to `optimizer.step()`), `optimizer` and `boundary`, or whatever the loop marks itself
  with `runtime.phase(name)` (a marked phase wins over the hooks);
- the step boundary runs at the end of every `optimizer.step()`, in a fixed order (see
  `_boundary` and docs/architecture.md): policy, tiers, refresh, boundary hooks; then the step's
  record is built (`timing` from telemetry, `refresh`, `tiers`);
- the record is complete when the next step starts (or at `end_step()` / `close()`), so figures
  the loop logs after `step()` (`runtime.log(loss=..., eval_loss=...)`) still land in it; then
  telemetry observes it and every listener gets it.

The loss of a step is what the loop logs, or else the model's output when it is a scalar
tensor, has a `.loss` (Hugging Face), or is a tuple holding one (the mean over the step's
forwards). Tokens are the integer input's elements (the first positional tensor or
`input_ids`), unless logged.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from asteria_core.distributed import VersionExchange
from asteria_core.distributed.attach import DataParallel, attach, data_parallel, shared_run_id
from asteria_core.optim.base import BlockPreconditioner
from asteria_core.optim.seam import refresh_fn as default_refresh_fn
from asteria_core.policy import LivePolicy, Policy
from asteria_core.refresh import RefreshEngine
from asteria_core.runtime.record import loss_of, put
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.labels import Phase
from asteria_core.telemetry.records import JsonlWriter, StepRecord
from asteria_core.telemetry.reporter import NullReporter, RunReporter, make_reporter
from asteria_core.telemetry.timing import PhaseTimer, PhaseToken
from asteria_core.tiers import TierStore

log = logging.getLogger(__name__)

Listener = Callable[[StepRecord], None]
StepHook = Callable[[int], None]


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Runtime:
    """Refresh engine, tier store, telemetry and live policy around one torch optimizer."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, model: torch.nn.Module | None = None,
                 policy: Policy | LivePolicy | None = None,
                 telemetry: TelemetryConfig | None = None, reporter: RunReporter | None = None,
                 run_id: str | None = None, run_dir: str | Path | None = None,
                 records: str | Path | None = None, optimizer_name: str | None = None,
                 start_step: int = 0, distributed: bool | None = None,
                 refresh_fn=default_refresh_fn, coherence_threshold: float = 0.0,
                 worker_cpus: frozenset[int] | None = None) -> None:
        """`policy`: the live policy (a `LivePolicy` to share one with a control plane).
        `telemetry`: its config (default: metrics on, no energy estimate); `reporter` replaces
        telemetry altogether (`NullReporter()` turns it off). `run_dir`: where the disk tier
        lives unless the policy names a folder (default runs/<run_id>). `records`: a JSONL file
        that gets every step record. `start_step`: steps already trained (a resumed run).
        `distributed`: refresh as one rank of a data-parallel job (owner ranks, bases sent to
        every rank); None decides by whether torch.distributed is initialized with more than
        one rank. `refresh_fn`: the refresh math (the seam; a test may slow it down).
        `coherence_threshold`: skip (and in a data-parallel run, do not send) a refresh whose
        basis moved less than this (1 - the mean |cosine| between new and old basis
        vectors; 0, the default, swaps every refresh). `worker_cpus`: the CPUs the refresh
        workers run on (threads and processes; None: those of the thread that builds this)."""
        if getattr(optimizer, "runtime", None) is not None:
            raise ValueError("this optimizer already has a runtime attached")
        self.optimizer = optimizer
        self.model = model
        parallel = data_parallel(distributed)
        self.run_id = run_id or new_run_id()
        if parallel:  # one run: rank 0's id on every rank
            self.run_id = shared_run_id(self.run_id)
        self.run_dir = Path(run_dir) if run_dir is not None else Path("runs") / self.run_id
        self.optimizer_name = optimizer_name or type(optimizer).__name__.lower()
        self.policy = policy if isinstance(policy, LivePolicy) else \
            LivePolicy(policy or Policy(), start_step=start_step)
        self.step = start_step
        """Optimizer steps done (including those of a run this one resumes)."""
        params = [p for g in optimizer.param_groups for p in g["params"]]
        self.device = params[0].device if params else torch.device("cpu")
        self.timer = PhaseTimer(self.device)
        self.reporter: RunReporter = reporter if reporter is not None else \
            make_reporter(telemetry or TelemetryConfig())
        self.telemetry = None if isinstance(self.reporter, NullReporter) else self.reporter
        """The reporter when it exports metrics (`.exposition()`, `.serve()`), else None."""
        self.reporter.bind(self.timer, device=self.device, run_id=self.run_id,
                           optimizer=self.optimizer_name)
        self.refresh: RefreshEngine | None = None
        self.tiers: TierStore | None = None
        self.data_parallel: DataParallel | None = \
            attach(optimizer, self.policy, self.reporter) if parallel else None
        """This rank's part of a data-parallel job (distributed/attach.py), None alone."""
        if isinstance(optimizer, BlockPreconditioner):
            # Refreshes run off the critical path under the policy; state has a home tier.
            self.refresh = RefreshEngine(optimizer, self.policy, self.reporter, fn=refresh_fn,
                                         exchange=self.exchange,
                                         skip_below=coherence_threshold,
                                         worker_cpus=worker_cpus)
            self.tiers = TierStore(optimizer, self.policy, self.run_dir, self.reporter)
        self._listeners: list[Listener] = []
        self._boundary_hooks: list[StepHook] = []
        self._between_hooks: list[StepHook] = []
        self._jsonl = JsonlWriter(Path(records)) if records is not None else None
        if self._jsonl is not None:
            self._listeners.append(self._jsonl)
        self._stop_requested = False
        self._closed = False
        self._figures: dict[str, Any] = {}
        self._losses: list[torch.Tensor] = []
        self._tokens = 0
        self._lr = 0.0
        self._version_in_step = self.policy.version
        self._pending: StepRecord | None = None
        self._auto: dict[str, PhaseToken] = {}
        self._handles = [optimizer.register_step_pre_hook(self._before_optimizer),
                         optimizer.register_step_post_hook(self._after_optimizer)]
        if model is not None:
            self._handles += [model.register_forward_pre_hook(self._before_forward,
                                                              with_kwargs=True),
                              model.register_forward_hook(self._after_forward)]
        optimizer.runtime = self

    # ----------------------------------------------------------------- what a loop calls
    def phase(self, name: str) -> AbstractContextManager[None]:
        """Time a block as phase `name` (data, forward, backward, optimizer, boundary)."""
        self._begin()
        return self.timer.phase(name)

    def wait(self, cause: str) -> AbstractContextManager[None]:
        """Time a block in which training waits, for a cause (data_wait, sync_wait, ...)."""
        return self.reporter.wait(cause)

    def log(self, **figures: Any) -> None:
        """Figures of the step in progress, or of the step just finished while its record is
        still open (before `end_step`); after `end_step`, of the next step. Names: loss,
        eval_loss, grad_norm, tokens, lr, or any of your own (numbers or scalar tensors; a
        tensor is read when the record is complete, not now)."""
        if self._pending is not None and not self.timer.in_step:
            put(self._pending, figures)
        else:
            self._figures.update(figures)

    def end_step(self) -> StepRecord | None:
        """Complete the record of the step just finished (telemetry, then every listener) and
        run the between-steps hooks; the next step's start does this by itself."""
        record, self._pending = self._pending, None
        if record is not None:
            put(record, {})  # tensors logged after step() become numbers now
            self.reporter.observe(record)
            for listener in list(self._listeners):
                listener(record)
        for hook in list(self._between_hooks):
            hook(self.step)
        return record

    @property
    def last_record(self) -> StepRecord | None:
        """The record of the step just finished while it is still open (before `end_step`)."""
        return self._pending

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(record)` with every completed step record; returns the remover."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener)

    def at_boundary(self, hook: StepHook) -> Callable[[], None]:
        """Run `hook(step)` at every step boundary, after the refresh engine (inside the step's
        timing, as part of the boundary); returns the remover."""
        self._boundary_hooks.append(hook)
        return lambda: self._boundary_hooks.remove(hook)

    def between_steps(self, hook: StepHook) -> Callable[[], None]:
        """Run `hook(step)` after each completed record, outside any step's timing (commands
        such as pause may block here); returns the remover."""
        self._between_hooks.append(hook)
        return lambda: self._between_hooks.remove(hook)

    def request_stop(self) -> None:
        """Ask the loop to stop (thread-safe: a flag the loop, or an integration, reads)."""
        self._stop_requested = True

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    @property
    def closed(self) -> bool:
        return self._closed

    def settle(self) -> None:
        """Before a checkpoint: outstanding refreshes go into the optimizer's state, with their
        swap steps, so the checkpoint holds them and a resumed run swaps them in on time."""
        if self.refresh is not None:
            self.refresh.settle()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs besides the optimizer's own state: steps and the policy."""
        return {"step": self.step, "policy": {"current": self.policy.current.to_dict(),
                                              "version": self.policy.version}}

    def close(self) -> None:
        """Complete the last record, join the refresh workers, finish tier writes, release
        meters and files, detach the hooks. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.end_step()
            if self.exchange is not None:
                # Every rank posted the same transfers: complete them all (the workers would
                # drop what is queued), so no rank's exchange is left inside a collective.
                self.refresh.settle()
        finally:
            for handle in self._handles:
                handle.remove()
            if self.refresh is not None:
                self.refresh.close()
            if self.data_parallel is not None:
                self.data_parallel.close()
            if self.tiers is not None:
                self.tiers.close()
            self.reporter.close()
            if self._jsonl is not None:
                self._jsonl.close()
            self.optimizer.runtime = None

    @property
    def world(self) -> int:
        """Ranks of the data-parallel run this runtime is one of (1: a single process)."""
        return self.data_parallel.world if self.data_parallel is not None else 1

    @property
    def exchange(self) -> VersionExchange | None:
        """The version exchange of this rank (None alone, for AdamW, or under FSDP2)."""
        return self.data_parallel.exchange if self.data_parallel is not None else None

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- the step, from hooks
    def _begin(self) -> None:
        if self.timer.in_step:
            return
        if self._closed:
            raise RuntimeError("this runtime is closed")
        self.end_step()
        self._losses, self._tokens = [], 0  # figures logged since the last record stay
        self._version_in_step = self.policy.version
        self.timer.start_step()

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

    def _before_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # an evaluation forward is no part of a step
        self._begin()
        if self.tiers is not None:
            self.tiers.announce()  # the optimizer's state is prefetched while forward runs
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor) and not ids.is_floating_point():
            self._tokens += ids.numel()
        self._open(Phase.FORWARD)

    def _after_forward(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if not (module.training and torch.is_grad_enabled()) or not self.timer.in_step:
            return
        loss = loss_of(output)
        if loss is not None:
            self._losses.append(loss.detach())
        if Phase.FORWARD in self._auto:
            self._close(Phase.FORWARD)
            self._open(Phase.BACKWARD)

    def _before_optimizer(self, optimizer: torch.optim.Optimizer, args: tuple,
                          kwargs: dict) -> tuple[tuple, dict] | None:
        self._begin()
        self._close(Phase.BACKWARD)
        self._open(Phase.OPTIMIZER)
        self._lr = float(optimizer.param_groups[0]["lr"])
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

    def _after_optimizer(self, optimizer: torch.optim.Optimizer, args: tuple,
                         kwargs: dict) -> None:
        self._close(Phase.OPTIMIZER)
        self.step += 1
        with self.timer.phase(Phase.BOUNDARY):
            figures = self._boundary()
        self._auto = {}
        phases, wall = self.timer.finish()
        losses = self._losses
        record = StepRecord(step=self.step, time=time.time(), loss=None, lr=self._lr,
                            tokens=self._tokens, step_seconds=wall, phase_seconds=phases,
                            policy_version=self._version_in_step,
                            timing=self.reporter.split_step(phases, wall), **figures)
        if losses:
            record.loss = losses[0] if len(losses) == 1 else torch.stack(losses).mean()
        put(record, self._figures, keep_tensors=True)
        self._figures = {}
        self._pending = record

    def _boundary(self) -> dict[str, Any]:
        """The step boundary, in order (docs/architecture.md, "The step boundary"):
        1. policy: changes queued since the last boundary take effect from the next step (in a
           data-parallel run, those rank 0 sent at the last boundary, on every rank);
        2. tiers: re-plan and migrate state after a budget change;
        3. refresh: swap in due bases (waiting only at the bound), snapshot and queue the
           blocks due a refresh;
        4. boundary hooks (e.g. distributed version exchange).
        Returns the record sections of the parts that have figures."""
        parallel = self.data_parallel
        if parallel is not None:
            parallel.policy_sync.at_boundary(self.step)
        else:
            self.policy.apply_pending(self.step)
        sections: dict[str, Any] = {}
        if self.tiers is not None:
            sections["tiers"] = self.tiers.on_boundary(self.step)
        if self.refresh is not None:
            self.refresh.on_boundary(self.step)
            sections["refresh"] = self.refresh.figures
        if parallel is not None and (figures := parallel.figures()) is not None:
            sections["distributed"] = figures
        for hook in list(self._boundary_hooks):
            hook(self.step)
        return sections
