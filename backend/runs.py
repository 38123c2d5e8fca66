"""Runs: one active training run per control plane, driven from HTTP without blocking on it.

`RunManager` decides which run is active and answers for it: start or resume a run it launches
itself, attach a user's runtime, route commands and policy changes to the active run
(backend/run_kinds.py: `LaunchedRun`, `AttachedRun`), and read a past run from the store.
Routes never wait for training: commands go into a queue the run drains between steps, and
policy changes go to its `LivePolicy`, applied at the next step boundary. What the run does is
written down by its `RunRecorder` (backend/recorder.py). Starting runs and checkpointing or
resuming one from its checkpoint need a run the server launched: for an attached run they are
a conflict.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asteria_core.autopilot import Autopilot, Proposal
from asteria_core.policy import LivePolicy, Policy, PolicyBusy, PolicyChange
from asteria_core.runtime import Runtime
from asteria_core.train.checkpoint import CHECKPOINT_NAME, good_checkpoints, previous_path
from asteria_core.train.checkpoint import load as load_checkpoint
from asteria_core.train.config import RunConfig
from asteria_core.train.config_io import config_from_dict, config_to_dict
from asteria_core.train.run_lock import RunFolderBusy, RunFolderLock
from backend.events import Broadcaster
from backend.live import LiveView
from backend.recorder import RunRecorder, records_between
from backend.run_kinds import ActiveRun, AttachedRun, LaunchedRun, RunConflict
from backend.run_states import RESUMABLE, RunCommand, RunStatus
from backend.store import RunStore, StoreError

if TYPE_CHECKING:
    from asteria_core.telemetry.core import Telemetry

log = logging.getLogger(__name__)
SLOT_WAIT_SECONDS = 0.5
"""How long a change waits for another one being written (a write takes milliseconds): while
the store is locked, a second change is answered 503 at once instead of holding a server
thread for the first one's whole wait."""

__all__ = ["ActiveRun", "RunConflict", "RunManager", "RunNotFound"]


class RunNotFound(LookupError):
    pass


class RunManager:
    def __init__(self, store: RunStore, events: Broadcaster, runs_dir: Path, *,
                 live_window: int = 10_000) -> None:
        self.store = store
        self.live_window = live_window
        self.events = events
        self.runs_dir = runs_dir
        self._lock = threading.Lock()
        self._active: ActiveRun | None = None
        self.last_telemetry: Telemetry | None = None
        """The telemetry of the newest run, kept after it ends so /metrics keeps its final
        values (Prometheus and Grafana would otherwise go blank between runs)."""
        self._learn_checkpoints()

    def _learn_checkpoints(self) -> None:
        """A process that died may have written a checkpoint file the store had not yet
        learnt of (the training thread never waits for the store): the file names its step."""
        for row in self.store.list_runs():
            if row["status"] != RunStatus.INTERRUPTED or not row["run_dir"]:
                continue
            path = Path(row["run_dir"]) / "checkpoint.pt"
            try:
                step = _checkpoint_step(path) if path.is_file() else None
            except RunConflict as err:
                log.warning("run %s: %s", row["id"], err)
                continue
            if step is None or step == row["checkpoint_step"]:
                continue
            stored = self.store.last_step(row["id"])
            try:  # the records up to it too, from the run's steps.jsonl (as a resume does)
                self.store.restore_steps(row["id"], records_between(
                    path.parent / "steps.jsonl", after=stored, until=step))
            except StoreError as err:
                log.warning("run %s: %s (a resume restores them)", row["id"], err)
            self.store.set_checkpoint(row["id"], step)

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
        if active is not None and active.run_id == run_id:
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
            live = LivePolicy(policy or config.policy)
            folder = _lock_folder((self.runs_dir / run_id).absolute())
            try:
                self.store.create_run(run_id, config_to_dict(config), folder.path.parent,
                                      config.train.steps)
            except BaseException:
                folder.release()
                raise
            self.store.set_policy(run_id, live.current.to_dict(), live.version)
            self._launch(LaunchedRun(run_id, config, live, self._recorder(run_id, live),
                                     folder_lock=folder))
        return self.get(run_id)

    def resume(self, run_id: str) -> tuple[dict[str, Any], str | None]:
        """Unpause an active run, or restart a stopped/interrupted one from its checkpoint.
        Also what the caller should know of the checkpoint it restarts from (None: nothing,
        its newest one is used)."""
        row = self.get(run_id)
        active = self._active
        if active is not None and active.run_id == run_id:
            active.command(RunCommand.RESUME)
            return self.get(run_id), None
        if row["config"].get("runtime", {}).get("attached"):
            raise RunConflict(f"run {run_id} was attached by a script; resume it from the "
                              "script (the control plane resumes only runs it launched)")
        if row["status"] not in RESUMABLE:
            raise RunConflict(f"run {run_id} is {row['status']}; only "
                              f"{', '.join(RESUMABLE)} runs can be resumed")
        checkpoint = Path(row["run_dir"] or self.runs_dir / run_id) / CHECKPOINT_NAME
        if not checkpoint.is_file() and not previous_path(checkpoint).is_file():
            raise RunConflict(f"run {run_id} has no checkpoint to resume from")
        config = config_from_dict(row["config"])
        config = dataclasses.replace(
            config, train=dataclasses.replace(config.train, resume=str(checkpoint),
                                              out_dir=str(checkpoint.parent.parent)))
        with self._lock:
            self._check_idle()
            folder = _lock_folder(checkpoint.parent)
            try:
                # checked before it is accepted, as the trainer will (a damaged file is never
                # trained from); the file names its own step: the store may not have learnt it
                step, note = _usable_checkpoint(run_id, checkpoint)
                live = self._stored_policy(row, step)
                self.store.set_status(run_id, RunStatus.RUNNING, checked=True)
            except BaseException:
                folder.release()
                raise
            self._launch(LaunchedRun(run_id, config, live, self._recorder(run_id, live),
                                     resume_step=step, folder_lock=folder))
        return self.get(run_id), note

    def _stored_policy(self, row: dict[str, Any], checkpoint_step: int) -> LivePolicy:
        """The policy a resumed run continues under, with every change ever acknowledged: the
        stored policy, plus the changes in the audit that it does not hold yet (a PATCH is
        answered only once its change is stored). Those in force before the checkpoint are
        folded in; the others are queued again for the step each was promised (the resumed
        run trains the steps before it as the first run did), or the first step it trains if
        that is later (`LaunchedRun._train` applies those before building the trainer)."""
        policy = Policy(**row["policy"]) if row["policy"] else Policy()
        version = row["policy_version"]
        later: list[tuple[dict[str, Any], PolicyChange]] = []
        for change in self.store.policy_changes(row["id"]):
            if change.version <= version:
                continue
            values = {k: new for k, (_, new) in change.diff.items()}
            applied = change.applied_at is not None
            if applied and change.effective_step <= checkpoint_step and not later:
                policy, version = dataclasses.replace(policy, **values), change.version
            else:
                later.append((values, change))
        # versions go on above every one the store has seen: none is given out twice
        live = LivePolicy(policy, version=version, issued=self.store.issued_version(row["id"]))
        for values, change in later:
            live.propose(values, client=change.client, requested_at=change.requested_at,
                         reason=change.reason, version=change.version,
                         not_before=change.effective_step)
        return live

    def command(self, run_id: str, command: RunCommand) -> tuple[dict[str, Any], str | None]:
        """The run's row after the command, and a note on how it was carried out (None: as
        the command says; a resume from an older checkpoint says so)."""
        if command == RunCommand.RESUME:
            return self.resume(run_id)
        self._require_active(run_id).command(command)
        return self.get(run_id), None

    def propose_policy(self, run_id: str, changes: dict[str, Any], client: str) -> PolicyChange:
        """Queue a change for the next step boundary, stored (pending) before it is queued and
        acknowledged: a crash before that boundary loses no change that was answered 200."""
        live = self._require_active(run_id).policy
        try:
            change = live.stage(changes, client=client, wait=SLOT_WAIT_SECONDS)
        except PolicyBusy as err:
            raise StoreError(str(err)) from err
        try:
            self.store.write_policy_change(run_id, change)  # no lock held: training goes on
        except BaseException:
            live.drop(change)
            raise
        queued = live.queue(change)
        if queued.effective_step != change.effective_step:  # boundaries passed while storing
            self.store.add_policy_change(run_id, queued)
        return queued

    def policy_history(self, run_id: str) -> list[PolicyChange]:
        """Every change of the run by version: the stored ones, with the active run's own
        (queued or applied: their true effective step) over those it holds."""
        changes = {c.version: c for c in self.store.policy_changes(run_id)}
        active = self._active
        if active is not None and active.run_id == run_id:
            for change in (*active.policy.history(), *active.policy.pending()):
                changes[change.version] = change
        return [changes[v] for v in sorted(changes)]

    def autopilot(self, run_id: str) -> Autopilot:
        """The active run's autopilot (a second-order optimizer's; 409 otherwise)."""
        active = self._require_active(run_id)
        pilot = active.runtime.autopilot if active.runtime is not None else None
        if pilot is None:
            raise RunConflict(f"run {run_id} has no autopilot (a second-order optimizer's "
                              "runtime has one, once its trainer is built)")
        return pilot

    def accept_proposal(self, run_id: str, proposal_id: int) -> Proposal:
        """Apply the autopilot's open proposal, stored (pending) before it is queued, as a
        PATCH is."""
        return self.autopilot(run_id).accept(
            proposal_id, within=lambda change: self.store.write_policy_change(run_id, change),
            wait=SLOT_WAIT_SECONDS)

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
        if isinstance(active, AttachedRun):
            self.detach()
        elif active is not None:
            active.shutdown(timeout)

    # ------------------------------------------------------------------ attached runs
    def attach(self, runtime: Runtime, *, total_steps: int = 0) -> dict[str, Any]:
        """Serve a user's runtime as the active run: its records, policy and commands."""
        with self._lock:
            self._check_idle()
            lr = runtime.optimizer.param_groups[0]["lr"]
            config = {"optim": {"name": runtime.optimizer_name, "lr": float(lr)},
                      "runtime": {"attached": True}}
            if self.store.get_run(runtime.run_id) is None:
                # the script's folder if it made one; none else (it keeps its own files)
                folder = Path(runtime.run_dir).absolute()
                self.store.create_run(runtime.run_id, config,
                                      folder if folder.is_dir() else "", total_steps)
                self.store.set_policy(runtime.run_id, runtime.policy.current.to_dict(),
                                      runtime.policy.version)
            else:  # the same run again: a relaunch or torchrun's restart, from its checkpoint
                self._requeue_acknowledged(runtime)
                self.store.set_status(runtime.run_id, RunStatus.RUNNING, checked=True)
            recorder = self._recorder(runtime.run_id, runtime.policy)
            recorder.created(status=RunStatus.RUNNING, step=runtime.step,
                             policy_version=runtime.policy.version)
            self.last_telemetry = runtime.telemetry
            self._active = AttachedRun(runtime, recorder)
        return self.get(runtime.run_id)

    def _requeue_acknowledged(self, runtime: Runtime) -> None:
        """Queue again every stored change the resumed runtime does not hold (its checkpoint
        predates them), for the step it was promised: a change answered 200 is never lost to
        a restart, nor in force earlier than it said."""
        for change in self.store.policy_changes(runtime.run_id):
            if change.version > runtime.policy.version:
                runtime.policy.propose({k: new for k, (_, new) in change.diff.items()},
                                       client=change.client, requested_at=change.requested_at,
                                       reason=change.reason, version=change.version,
                                       not_before=change.effective_step)

    def detach(self) -> None:
        """End the attached run's connection: finished if its runtime was closed, else
        stopped; the script's training is not touched."""
        active = self._active
        if not isinstance(active, AttachedRun):
            return
        status = active.detach()
        with self._lock:
            self._active = None
        active.recorder.announce_end(status)

    def _refuse_if_attached(self, what: str) -> None:
        active = self._active
        if isinstance(active, AttachedRun):
            raise RunConflict(f"this control plane is attached to run {active.run_id} of a "
                              f"script, and {what}")

    def _check_idle(self) -> None:
        if self._active is not None:
            raise RunConflict(f"run {self._active.run_id} is active; one active run per trainer")

    def _recorder(self, run_id: str, policy: LivePolicy) -> RunRecorder:
        return RunRecorder(run_id, policy, self.store, self.events, self.live_window)

    def _launch(self, run: LaunchedRun) -> None:
        run.recorder.created(status=RunStatus.RUNNING, policy_version=run.policy.version)
        if run.resume_step is not None:  # the records after it are trained again
            live = run.recorder.live
            assert live is not None  # made by created()
            live.update(step=run.resume_step)
        self._active = run
        run.start(bound=self._bound, ended=self._ended)

    def _bound(self, run: ActiveRun) -> None:
        """A launched run's trainer is built: /metrics follows its telemetry."""
        assert run.runtime is not None  # bound before this callback
        self.last_telemetry = run.runtime.telemetry

    def _ended(self, run: ActiveRun) -> None:
        with self._lock:
            if self._active is run:
                self._active = None


def _lock_folder(folder: Path) -> RunFolderLock:
    try:
        return RunFolderLock(folder)
    except RunFolderBusy as err:
        raise RunConflict(str(err)) from None


def _usable_checkpoint(run_id: str, path: Path) -> tuple[int, str | None]:
    """The step a resume from `path` starts at: its newest checkpoint whose checksum holds, or
    the one kept before it (then a note saying so). RunConflict naming each file when none
    can be used. The checksums and the steps only: no tensor is read."""
    good, why = good_checkpoints(path)
    if not good:
        raise RunConflict(
            f"run {run_id} cannot be resumed: no usable checkpoint ({'; '.join(why)}); restore "
            f"{path} from a copy, or start the run afresh with its config (POST /runs)")
    step = max(good)
    if good[step] == path:
        return step, None
    note = (f"the run continues from its checkpoint of step {step}, the one kept before the "
            f"newest ({'; '.join(why) if why else f'{path} is missing'})")
    if path.is_file():
        note += f"; a damaged newest file is set aside as {path.name}.damaged, not deleted"
    log.warning("run %s: %s", run_id, note)
    return step, note


def _checkpoint_step(path: Path) -> int:
    try:
        return int(load_checkpoint(path)["step"])
    except (ValueError, OSError, KeyError, TypeError) as err:
        raise RunConflict(f"the checkpoint {path} cannot be resumed: {err}") from None
