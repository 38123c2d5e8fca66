"""The runtime: what Asteria adds to a torch optimizer, driven by any training loop.

    opt = asteria.optimizer(model, "soap", policy=asteria.Policy(staleness_bound=5))
    for x, y in loader:
        loss = model(x, y)
        loss.backward()
        opt.step(); opt.zero_grad()      # the step boundary runs inside step()
    opt.runtime.close()

`Runtime(optimizer, model=..., config=RuntimeConfig(...))` owns one step at a time: it is the
`StepEvents` its hooks call, and the API a loop calls. It holds the live policy, telemetry, its
parts (runtime/parts.py: refresh engine, tier store, autopilot, data-parallel attachment) and
one collaborator per job:

- the hooks (runtime/hooks.py): torch's optimizer and model hooks tell it when a step starts and
  which phase runs, so a loop needs no other call;
- the boundary (runtime/boundary.py): at the end of every `optimizer.step()`, an ordered list of
  stages (policy, tiers, refresh, state, autopilot, distributed, the loop's hooks), each
  returning its section of the step record;
- the record (runtime/record.py): built at the boundary and complete when the next step starts
  (or at `end_step()` / `close()`), so figures the loop logs after `step()`
  (`runtime.log(loss=..., eval_loss=...)`) still land in it; then telemetry observes it and
  every listener gets it;
- the callbacks (runtime/callbacks.py): record listeners, boundary and between-steps hooks;
- the outputs (runtime/outputs.py): the JSONL file and the experiment trackers;
- the device (runtime/device.py): where the parameters train, read again at the first step.

The loss of a step is what the loop logs, or else the model's output when it is a scalar
tensor, has a `.loss` (Hugging Face), or is a tuple holding one (the mean over the step's
forwards). Tokens are the integer input's elements (the first positional tensor or
`input_ids`), unless logged.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from asteria_core.distributed import VersionExchange
from asteria_core.distributed.attach import DataParallel, data_parallel, shared_run_id
from asteria_core.policy import LivePolicy, Policy
from asteria_core.runtime.boundary import Boundary, boundary_stages
from asteria_core.runtime.callbacks import Callbacks, Listener, StepHook
from asteria_core.runtime.config import RuntimeConfig
from asteria_core.runtime.device import ParameterDevice
from asteria_core.runtime.hooks import TorchHooks
from asteria_core.runtime.outputs import RecordOutputs
from asteria_core.runtime.parts import build_parts
from asteria_core.runtime.record import StepInProgress
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.labels import Phase
from asteria_core.telemetry.records import StepRecord
from asteria_core.telemetry.reporter import NullReporter, RunReporter, make_reporter
from asteria_core.telemetry.state_bytes import StateCount
from asteria_core.telemetry.timing import PhaseTimer

if TYPE_CHECKING:
    from asteria_core.autopilot import Autopilot
    from asteria_core.refresh import RefreshEngine
    from asteria_core.telemetry.core import Telemetry
    from asteria_core.tiers import TierStore


def new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


class Runtime:
    """Refresh engine, tier store, telemetry and live policy around one torch optimizer."""

    hooks_type = TorchHooks
    """What hooks into torch (a benchmark may count the hooks' own cost)."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, model: torch.nn.Module | None = None,
                 config: RuntimeConfig | None = None) -> None:
        """`model`, when given, gets forward hooks (steps start at its first training forward;
        its tokens and loss are read). `config`: runtime/config.py."""
        if getattr(optimizer, "runtime", None) is not None:
            raise ValueError("this optimizer already has a runtime attached")
        config = config or RuntimeConfig()
        self.optimizer = optimizer
        self.model = model
        parallel = data_parallel(config.distributed)
        self.run_id = config.run_id or new_run_id()
        if parallel:  # one run: rank 0's id on every rank
            self.run_id = shared_run_id(self.run_id)
        self.run_dir = Path(config.run_dir) if config.run_dir is not None \
            else Path("runs") / self.run_id
        self.optimizer_name = config.optimizer_name or type(optimizer).__name__.lower()
        self.policy = config.policy if isinstance(config.policy, LivePolicy) else \
            LivePolicy(config.policy or Policy(), start_step=config.start_step)
        self.step = config.start_step
        """Optimizer steps done (including those of a run this one resumes)."""
        self._device = ParameterDevice(optimizer)
        self.device = self._device.device
        """Where the parameters train: read again at the first step (runtime/device.py), since
        an optimizer may be built before `model.cuda()`."""
        self.timer = PhaseTimer(self.device)
        self.reporter: RunReporter = config.reporter if config.reporter is not None else \
            make_reporter(config.telemetry or TelemetryConfig())
        # Any reporter but the null one is the Telemetry that exports the run's metrics.
        self.telemetry = None if isinstance(self.reporter, NullReporter) else \
            cast("Telemetry", self.reporter)
        """The reporter when it exports metrics (`.exposition()`, `.serve()`), else None."""
        self.reporter.bind(self.timer, device=self.device, run_id=self.run_id,
                           optimizer=self.optimizer_name)
        parts = build_parts(optimizer, config, self.policy, self.reporter, self.run_dir,
                            parallel=parallel)
        self.data_parallel: DataParallel | None = parts.data_parallel
        """This rank's part of a data-parallel job (distributed/attach.py), None alone."""
        self.refresh: RefreshEngine | None = parts.refresh
        self.tiers: TierStore | None = parts.tiers
        self.autopilot: Autopilot | None = parts.autopilot
        """Tunes the policy from the records (off unless configured or turned on mid-run)."""
        rank = self.data_parallel.policy_sync.rank if self.data_parallel is not None else 0
        self._outputs = RecordOutputs(config.records, config.telemetry, run_dir=self.run_dir,
                                      run_id=self.run_id, rank=rank)
        pilot = [self.autopilot.observe] if self.autopilot is not None else []
        self._callbacks = Callbacks([*pilot, *self._outputs.listeners])
        self._stop_requested = False
        self._closed = False
        self.boundary = Boundary(boundary_stages(self, StateCount(optimizer, self.policy),
                                                 self._callbacks.boundary))
        """The step boundary's stages, in order (runtime/boundary.py)."""
        self._step = StepInProgress()
        self._hooks = self.hooks_type(self.timer, self, optimizer, model)
        # torch's Optimizer declares no `runtime`: the attribute is this runtime's own.
        optimizer.runtime = self  # type: ignore[attr-defined]

    # ----------------------------------------------------------------- what a loop calls
    def phase(self, name: str) -> AbstractContextManager[None]:
        """Time a block as phase `name` (data, forward, backward, optimizer, boundary)."""
        self.begin()
        return self.timer.phase(name)

    def wait(self, cause: str) -> AbstractContextManager[None]:
        """Time a block in which training waits, for a cause (data_wait, sync_wait, ...)."""
        return self.reporter.wait(cause)

    def log(self, **figures: Any) -> None:
        """Figures of the step in progress, or of the step just finished while its record is
        still open (before `end_step`); after `end_step`, of the next step. Names: loss,
        eval_loss, grad_norm, tokens, lr, or any of your own (numbers or scalar tensors; a
        tensor is read when the record is complete, not now)."""
        self._step.log(figures, in_step=self.timer.in_step)

    def end_step(self) -> StepRecord | None:
        """Complete the record of the step just finished (telemetry, then every listener) and
        run the between-steps hooks; the next step's start does this by itself."""
        record = self._step.complete()
        if record is not None:
            self.reporter.observe(record)
            self._callbacks.record(record)
        self._callbacks.between(self.step)
        return record

    @property
    def last_record(self) -> StepRecord | None:
        """The record of the step just finished while it is still open (before `end_step`)."""
        return self._step.pending

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(record)` with every completed step record; returns the remover."""
        return self._callbacks.add_listener(listener)

    def at_boundary(self, hook: StepHook) -> Callable[[], None]:
        """Run `hook(step)` at every step boundary, after the refresh engine (inside the step's
        timing, as part of the boundary); returns the remover."""
        return self._callbacks.at_boundary(hook)

    def between_steps(self, hook: StepHook) -> Callable[[], None]:
        """Run `hook(step)` after each completed record, outside any step's timing (commands
        such as pause may block here); returns the remover."""
        return self._callbacks.between_steps(hook)

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
            if self.exchange is not None and self.refresh is not None:  # no exchange without it
                # Every rank posted the same transfers: complete them all (the workers would
                # drop what is queued), so no rank's exchange is left inside a collective.
                self.refresh.settle()
        finally:
            self._hooks.remove()
            if self.refresh is not None:
                self.refresh.close()
            if self.data_parallel is not None:
                self.data_parallel.close()
            if self.tiers is not None:
                self.tiers.close()
            self.reporter.close()
            self._outputs.close()
            self.optimizer.runtime = None  # type: ignore[attr-defined]  # (see __init__)

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

    # ----------------------------------------------------------------- the step (StepEvents)
    def begin(self) -> None:
        """A step starts now, unless one is in progress: the last record is completed first."""
        if self.timer.in_step:
            return
        if self._closed:
            raise RuntimeError("this runtime is closed")
        self.end_step()
        if not self._device.found:  # the parts follow parameters moved since the start
            tiers = [self.tiers.set_device] if self.tiers is not None else []
            self.device = self._device.find(self.timer.set_device, self.reporter.set_device,
                                            *tiers)
        self._step.start(self.policy.version)
        self.timer.start_step()

    def forward_input(self, args: tuple, kwargs: dict) -> None:
        if self.tiers is not None:
            self.tiers.announce()  # the optimizer's state is prefetched while forward runs
        self._step.read_input(args, kwargs)

    def forward_output(self, output: Any) -> None:
        self._step.read_output(output)

    def optimizer_begins(self, optimizer: torch.optim.Optimizer) -> None:
        self._step.read_lr(optimizer)
        if self.data_parallel is not None:
            self.data_parallel.before_step()  # sharded: other ranks' parameters are theirs

    def optimizer_done(self) -> None:
        """The update of a step is done: run the boundary, build the step's record."""
        if self.data_parallel is not None:
            self.data_parallel.after_step()  # sharded: every owner's update to every rank
        self.step += 1
        with self.timer.phase(Phase.BOUNDARY):
            sections = self.boundary(self.step)
        phases, wall = self.timer.finish()
        self._step.build(self.step, phases, wall, self.reporter.split_step(phases, wall),
                         sections)
