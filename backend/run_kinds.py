"""The two kinds of active run. A `LaunchedRun` is one the control plane started itself: its own
`Trainer`, training in a thread of this process, which checkpoints and resumes. An `AttachedRun`
is a user's script's runtime (`backend.serve(runtime)`): the script trains in its own thread
and owns its model and checkpoints.

Either way the control plane reaches the core through the run's `Runtime` only (its records,
its between-steps hook, its stop flag, its live policy and telemetry); the trainer is reached
through `LaunchedRun` alone. Commands go into a queue a route fills and the training thread
drains between steps (pause blocks there, outside any step's timing).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from asteria_core.policy import LivePolicy
from asteria_core.runtime import Runtime
from asteria_core.train.config import RunConfig
from asteria_core.train.run_lock import RunFolderLock
from asteria_core.train.trainer import Trainer
from backend.recorder import RunRecorder
from backend.run_states import RunCommand, RunStatus

log = logging.getLogger(__name__)


class RunConflict(RuntimeError):
    """The request does not fit the run's state (e.g. a second active run)."""


class ActiveRun:
    """What both kinds share: the run's id, live policy and recorder, and its commands."""

    def __init__(self, run_id: str, policy: LivePolicy, recorder: RunRecorder) -> None:
        self.run_id = run_id
        self.policy = policy
        self.recorder = recorder
        """Its store rows, live view and events (backend/recorder.py)."""
        self.runtime: Runtime | None = None
        """The port into the core (a launched run's, once its trainer is built)."""
        self.commands: queue.Queue[RunCommand] = queue.Queue()
        self.paused = False
        self._unbind: list[Callable[[], None]] = []

    def command(self, command: RunCommand) -> None:
        """Queue `command` for the training thread (between steps). RESUME of a paused run
        comes here too; the manager handles the resume of a run that ended."""
        self.commands.put(command)

    def bind(self, runtime: Runtime) -> None:
        """Follow the runtime: records to the recorder, commands between steps."""
        self.runtime = runtime
        self._unbind = [runtime.add_listener(self.recorder.record),
                        runtime.between_steps(lambda step: self._drain())]

    def unbind(self) -> None:
        for remove in self._unbind:
            remove()
        self._unbind = []

    def _checkpoint(self) -> None:
        raise NotImplementedError  # an attached run refuses CHECKPOINT in `command`

    def shutdown(self, timeout: float) -> None:
        raise NotImplementedError  # a launched run's (an attached one is detached instead)

    def _drain(self) -> None:
        """Between steps: run queued commands; while paused, wait here for the next one."""
        while True:
            try:
                command = self.commands.get(block=self.paused, timeout=0.5)
            except queue.Empty:
                if self.paused:
                    continue
                return
            match command:
                case RunCommand.PAUSE:
                    self.paused = True
                    self.recorder.status(RunStatus.PAUSED)
                case RunCommand.RESUME:
                    self.paused = False
                    self.recorder.status(RunStatus.RUNNING)
                case RunCommand.CHECKPOINT:
                    self._checkpoint()
                case RunCommand.STOP:
                    assert self.runtime is not None  # commands run between its steps
                    self.runtime.request_stop()
                    self.paused = False
                    return
                case _:
                    raise NotImplementedError(command)


RunCallback = Callable[[ActiveRun], None]


class LaunchedRun(ActiveRun):
    """A run the control plane trains itself, from a `RunConfig`, in a thread of its own."""

    def __init__(self, run_id: str, config: RunConfig, policy: LivePolicy,
                 recorder: RunRecorder, *, resume_step: int | None = None,
                 folder_lock: RunFolderLock | None = None) -> None:
        super().__init__(run_id, policy, recorder)
        self.folder_lock = folder_lock
        """Held while this process trains in the run's folder (released when it ends)."""
        self.config = config
        self.resume_step = resume_step
        """A resumed run: the step of its checkpoint, where stored pending changes take effect."""
        self.trainer: Trainer | None = None
        self.thread: threading.Thread | None = None

    def start(self, *, bound: RunCallback, ended: RunCallback) -> None:
        """Train in a new thread: `bound(self)` once the trainer's runtime is followed,
        `ended(self)` when training stops, after its status is stored."""
        self.thread = threading.Thread(target=self._train, args=(bound, ended),
                                       name=f"train-{self.run_id}", daemon=True)
        self.thread.start()

    def shutdown(self, timeout: float) -> None:
        """Stop at the next step boundary and wait for the checkpoint."""
        self.command(RunCommand.STOP)
        if self.thread is not None:
            self.thread.join(timeout)

    def _checkpoint(self) -> None:
        assert self.trainer is not None  # commands run between its steps
        self.trainer.save_checkpoint()

    def _train(self, bound: RunCallback, ended: RunCallback) -> None:
        status, error = RunStatus.FAILED, None
        try:
            if self.resume_step is not None:  # as at the boundary after the checkpoint's step
                self.policy.apply_pending(self.resume_step)
            trainer = Trainer(self.config, run_id=self.run_id, policy=self.policy)
            if self.config.train.resume:
                self.recorder.rewind(trainer.step, trainer.run_dir / "steps.jsonl")
            self.trainer = trainer
            self.bind(trainer.runtime)
            bound(self)
            trainer.checkpoint_sinks.append(lambda step, path: self.recorder.checkpointed(step))
            try:
                result = trainer.train(progress=False)
            finally:
                trainer.close()
            status = RunStatus.STOPPED if result.stopped_early else RunStatus.FINISHED
        except Exception as err:  # the run fails; the server and the history stay
            log.exception("run %s failed", self.run_id)
            error = f"{type(err).__name__}: {err}"
        finally:
            self.recorder.ended(status, error)
            if self.folder_lock is not None:
                self.folder_lock.release()
            ended(self)
            self.recorder.announce_end(status, error)


class AttachedRun(ActiveRun):
    """A user's runtime, served: the script trains, the control plane follows."""

    def __init__(self, runtime: Runtime, recorder: RunRecorder) -> None:
        super().__init__(runtime.run_id, runtime.policy, recorder)
        self.bind(runtime)

    def command(self, command: RunCommand) -> None:
        if command == RunCommand.CHECKPOINT:
            raise RunConflict(f"run {self.run_id} is attached by a script, which owns its model "
                              "and checkpoints; the control plane checkpoints only runs it "
                              "launched")
        super().command(command)

    def detach(self) -> RunStatus:
        """Stop following the runtime: finished if it was closed, else stopped (the script's
        training is not touched). Returns the status stored."""
        self.unbind()
        runtime = self.runtime
        assert runtime is not None  # bound at construction
        status = RunStatus.FINISHED if runtime.closed and not runtime.stop_requested \
            else RunStatus.STOPPED
        self.recorder.ended(status)
        return status
