"""Runs: one active training run per control plane, driven from HTTP without blocking on it.

A run is a `Runtime` either way: one the server launches itself (its own `Trainer`, training in
a thread of this process) or one a user's script attached (`backend.serve(runtime)`; the script
trains in its own thread). Routes never wait for training: commands (pause, resume, stop,
checkpoint) go into a queue the runtime drains between steps, and policy changes go to its
`LivePolicy`, applied at the next step boundary. Step records and policy changes flow to the
run store (batched) and to live-event subscribers. Starting runs and checkpointing or resuming
one from its checkpoint need a run the server launched: for an attached run they are a conflict.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asteria_core.policy import LivePolicy, Policy, PolicyChange
from asteria_core.runtime import Runtime
from asteria_core.train.config import RunConfig
from asteria_core.train.config_io import config_from_dict, config_to_dict
from asteria_core.train.trainer import Trainer
from backend.events import Broadcaster
from backend.live import LiveView
from backend.recorder import RunRecorder
from backend.run_states import RESUMABLE, RunCommand, RunStatus
from backend.store import RunStore

log = logging.getLogger(__name__)


class RunNotFound(LookupError):
    pass


class RunConflict(RuntimeError):
    """The request does not fit the run's state (e.g. a second active run)."""


@dataclass
class ActiveRun:
    run_id: str
    config: RunConfig | None
    """None for an attached run (the script's own loop has no config of ours)."""
    policy: LivePolicy
    commands: queue.Queue[str] = field(default_factory=queue.Queue)
    trainer: Trainer | None = None
    runtime: Runtime | None = None
    attached: bool = False
    """True for a user's runtime served with `backend.serve`; False for a launched run."""
    thread: threading.Thread | None = None
    paused: bool = False
    recorder: RunRecorder | None = None
    """Its store rows, live view and events (backend/recorder.py)."""
    unbind: list = field(default_factory=list)
    """Removers of the listeners this manager added to the runtime."""
    resume_step: int | None = None
    """A resumed run: the step of its checkpoint, where stored pending changes take effect."""


class RunManager:
    def __init__(self, store: RunStore, events: Broadcaster, runs_dir: Path, *,
                 live_window: int = 10_000) -> None:
        self.store = store
        self.live_window = live_window
        self.events = events
        self.runs_dir = runs_dir
        self._lock = threading.Lock()
        self._active: ActiveRun | None = None
        self.last_telemetry = None
        """The telemetry of the newest run, kept after it ends so /metrics keeps its final
        values (Prometheus and Grafana would otherwise go blank between runs)."""

    # ------------------------------------------------------------------ queries
    def active(self) -> ActiveRun | None:
        return self._active

    def get(self, run_id: str) -> dict[str, Any]:
        live = self._live(run_id)
        if live is not None:
            return live.row()
        row = self.store.get_run(run_id)
        if row is None:
            raise RunNotFound(run_id)
        return row

    def _live(self, run_id: str) -> LiveView | None:
        active = self._active
        if active is not None and active.run_id == run_id and active.recorder is not None:
            return active.recorder.live
        return None

    def live_run_json(self, run_id: str, anonymous: bool = False) -> bytes | None:
        """The active run's `RunPublic` as JSON (as an anonymous reader sees it, if asked), or
        None if `run_id` is not the active run."""
        live = self._live(run_id)
        return live.row_json(anonymous) if live is not None else None

    def live_steps_json(self, run_id: str, since: int, limit: int) -> bytes | None:
        """A `StepPage` from memory, or None when the store must answer."""
        live = self._live(run_id)
        return live.steps_json(since, limit) if live is not None else None

    def _require_active(self, run_id: str) -> ActiveRun:
        self.get(run_id)  # 404 first
        active = self._active
        if active is None or active.run_id != run_id:
            raise RunConflict(f"run {run_id} is not active")
        return active

    # ------------------------------------------------------------------ lifecycle
    def start(self, config: RunConfig, policy: Policy | None = None) -> dict[str, Any]:
        self._refuse_if_attached("starts no runs of its own")
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        config = dataclasses.replace(
            config, train=dataclasses.replace(config.train, out_dir=str(self.runs_dir)))
        with self._lock:
            self._check_idle()
            active = ActiveRun(run_id, config, LivePolicy(policy or config.policy))
            self.store.create_run(run_id, config_to_dict(config), str(self.runs_dir / run_id),
                                  config.train.steps)
            self.store.set_policy(run_id, active.policy.current.to_dict(), active.policy.version)
            self._launch(active)
        return self.get(run_id)

    def resume(self, run_id: str) -> dict[str, Any]:
        """Unpause an active run, or restart a stopped/interrupted one from its checkpoint."""
        row = self.get(run_id)
        active = self._active
        if active is not None and active.run_id == run_id:
            active.commands.put(RunCommand.RESUME)
            return self.get(run_id)
        if row["config"].get("runtime", {}).get("attached"):
            raise RunConflict(f"run {run_id} was attached by a script; resume it from the "
                              "script (the control plane resumes only runs it launched)")
        if row["status"] not in RESUMABLE:
            raise RunConflict(f"run {run_id} is {row['status']}; only "
                              f"{', '.join(RESUMABLE)} runs can be resumed")
        checkpoint = Path(row["run_dir"]) / "checkpoint.pt"
        if not checkpoint.is_file():
            raise RunConflict(f"run {run_id} has no checkpoint to resume from")
        config = config_from_dict(row["config"])
        config = dataclasses.replace(
            config, train=dataclasses.replace(config.train, resume=str(checkpoint)))
        with self._lock:
            self._check_idle()
            active = ActiveRun(run_id, config, self._stored_policy(row),
                               resume_step=row["checkpoint_step"] or 0)
            self.store.set_status(run_id, RunStatus.RUNNING, checked=True)
            self._launch(active)
        return self.get(run_id)

    def _stored_policy(self, row: dict[str, Any]) -> LivePolicy:
        """The policy a resumed run continues under, with every change ever acknowledged: the
        stored policy, plus the changes in the audit that it does not hold yet (a PATCH is
        answered only once its change is stored). Those in force before the checkpoint are
        folded in; the others are queued again, and take effect from the first step the
        resumed run trains (`_train` applies them before building the trainer)."""
        policy = Policy(**row["policy"]) if row["policy"] else Policy()
        version, later = row["policy_version"], []
        for change in self.store.policy_changes(row["id"]):
            if change["version"] <= version:
                continue
            values = {k: new for k, (_, new) in change["diff"].items()}
            applied = change["applied_at"] is not None
            if applied and change["effective_step"] <= (row["checkpoint_step"] or 0) and \
                    not later:
                policy, version = dataclasses.replace(policy, **values), change["version"]
            else:
                later.append((values, change))
        live = LivePolicy(policy, version=version)
        for values, change in later:
            requeued = live.propose(values, client=change["client"],
                                    requested_at=change["requested_at"])
            if requeued.version != change["version"]:
                log.warning("run %s: stored policy version %d requeued as version %d",
                            row["id"], change["version"], requeued.version)
        return live

    def command(self, run_id: str, command: str) -> dict[str, Any]:
        if command == RunCommand.RESUME:
            return self.resume(run_id)
        active = self._require_active(run_id)
        if command == RunCommand.CHECKPOINT and active.attached:
            raise RunConflict(f"run {run_id} is attached by a script, which owns its model and "
                              "checkpoints; the control plane checkpoints only runs it launched")
        active.commands.put(command)
        return self.get(run_id)

    def propose_policy(self, run_id: str, changes: dict[str, Any], client: str) -> PolicyChange:
        """Queue a change for the next step boundary, stored (pending) before it is queued and
        acknowledged: a crash before that boundary loses no change that was answered 200."""
        def persist(change: PolicyChange) -> None:
            self.store.add_policy_change(run_id, dataclasses.asdict(change), durable=True)

        return self._require_active(run_id).policy.propose(changes, client=client,
                                                           persist=persist)

    def policy(self, run_id: str) -> tuple[dict[str, Any], int, list[PolicyChange]]:
        active = self._active
        if active is not None and active.run_id == run_id:
            live = active.policy
            return live.current.to_dict(), live.version, live.pending()
        row = self.get(run_id)
        return row["policy"] or Policy().to_dict(), row["policy_version"], []

    def shutdown(self, timeout: float = 60.0) -> None:
        """Stop a launched run at its next step boundary and wait for its checkpoint; detach an
        attached one (its script goes on training, unobserved)."""
        active = self._active
        if active is None:
            return
        if active.attached:
            self.detach()
            return
        active.commands.put(RunCommand.STOP)
        if active.thread is not None:
            active.thread.join(timeout)

    # ------------------------------------------------------------------ attached runs
    def attach(self, runtime: Runtime, *, total_steps: int = 0) -> dict[str, Any]:
        """Serve a user's runtime as the active run: its records, policy and commands."""
        with self._lock:
            self._check_idle()
            lr = runtime.optimizer.param_groups[0]["lr"]
            config = {"optim": {"name": runtime.optimizer_name, "lr": float(lr)},
                      "runtime": {"attached": True}}
            active = ActiveRun(runtime.run_id, None, runtime.policy, runtime=runtime,
                               attached=True)
            self.store.create_run(active.run_id, config, str(runtime.run_dir), total_steps)
            self.store.set_policy(active.run_id, runtime.policy.current.to_dict(),
                                  runtime.policy.version)
            active.recorder = self._recorder(active.run_id)
            active.recorder.created(status=RunStatus.RUNNING, step=runtime.step,
                                    policy_version=runtime.policy.version)
            self._bind(active, runtime)
            self._active = active
        return self.get(active.run_id)

    def detach(self) -> None:
        """End the attached run's connection: finished if its runtime was closed, else
        stopped; the script's training is not touched."""
        active = self._active
        if active is None or not active.attached:
            return
        for remove in active.unbind:
            remove()
        runtime = active.runtime
        status = RunStatus.FINISHED if runtime.closed and not runtime.stop_requested \
            else RunStatus.STOPPED
        active.recorder.ended(status)
        with self._lock:
            self._active = None
        active.recorder.announce_end(status)

    def _refuse_if_attached(self, what: str) -> None:
        active = self._active
        if active is not None and active.attached:
            raise RunConflict(f"this control plane is attached to run {active.run_id} of a "
                              f"script, and {what}")

    def _check_idle(self) -> None:
        if self._active is not None:
            raise RunConflict(f"run {self._active.run_id} is active; one active run per trainer")

    def _recorder(self, run_id: str) -> RunRecorder:
        return RunRecorder(run_id, self.store, self.events, self.live_window)

    def _launch(self, active: ActiveRun) -> None:
        active.recorder = self._recorder(active.run_id)
        active.recorder.created(status=RunStatus.RUNNING, policy_version=active.policy.version)
        if active.resume_step is not None:  # the records after it are trained again
            active.recorder.live.update(step=active.resume_step)
        self._active = active
        active.thread = threading.Thread(target=self._train, args=(active,),
                                         name=f"train-{active.run_id}", daemon=True)
        active.thread.start()

    # ------------------------------------------------------------------ training thread
    def _train(self, active: ActiveRun) -> None:
        status, error = RunStatus.FAILED, None
        try:
            active.policy.add_listener(
                lambda change: active.recorder.policy_changed(active.policy, change))
            if active.resume_step is not None:  # as at the boundary after the checkpoint's step
                active.policy.apply_pending(active.resume_step)
            trainer = Trainer(active.config, run_id=active.run_id, policy=active.policy)
            if active.config.train.resume:
                active.recorder.rewind(trainer.step, trainer.run_dir / "steps.jsonl")
            active.trainer, active.runtime = trainer, trainer.runtime
            self._bind(active, trainer.runtime)
            trainer.checkpoint_sinks.append(lambda step, path: active.recorder.checkpointed(step))
            try:
                result = trainer.train(progress=False)
            finally:
                trainer.close()
            status = RunStatus.STOPPED if result.stopped_early else RunStatus.FINISHED
        except Exception as err:  # the run fails; the server and the history stay
            log.exception("run %s failed", active.run_id)
            error = f"{type(err).__name__}: {err}"
        finally:
            active.recorder.ended(status, error)
            with self._lock:
                self._active = None
            active.recorder.announce_end(status, error)

    def _bind(self, active: ActiveRun, runtime: Runtime) -> None:
        """Follow the runtime: records to the store and live clients, commands between steps."""
        self.last_telemetry = runtime.telemetry
        active.unbind = [runtime.add_listener(active.recorder.record),
                         runtime.between_steps(lambda step: self._drain(active))]
        if active.attached:  # a launched run's policy listener is added before its trainer
            runtime.policy.add_listener(lambda change: self._active is active and
                                        active.recorder.policy_changed(runtime.policy, change))

    def _drain(self, active: ActiveRun) -> None:
        """Between steps: run queued commands; while paused, wait here for the next one."""
        while True:
            try:
                command = active.commands.get(block=active.paused, timeout=0.5)
            except queue.Empty:
                if active.paused:
                    continue
                return
            match command:
                case RunCommand.PAUSE:
                    active.paused = True
                    active.recorder.status(RunStatus.PAUSED)
                case RunCommand.RESUME:
                    active.paused = False
                    active.recorder.status(RunStatus.RUNNING)
                case RunCommand.CHECKPOINT:
                    active.trainer.save_checkpoint()
                case RunCommand.STOP:
                    active.runtime.request_stop()
                    active.paused = False
                    return
                case _:
                    raise NotImplementedError(command)
