"""What a run can be and what an operator can ask of it: the statuses the store keeps and the
API reports, and the commands `POST /runs/{id}/{command}` takes. Plain strings on the wire and
in SQLite (each member is its value); code compares with the members."""

from __future__ import annotations

from asteria_core.compat import Choice


class RunStatus(Choice):
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    STOPPED = "stopped"  # by an operator or a signal, with a checkpoint
    FAILED = "failed"
    INTERRUPTED = "interrupted"  # the control plane went away while it trained


class RunCommand(Choice):
    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    CHECKPOINT = "checkpoint"


ACTIVE = (RunStatus.RUNNING, RunStatus.PAUSED)
"""Statuses of a run that is training (or paused) in this process."""
RESUMABLE = (RunStatus.INTERRUPTED, RunStatus.STOPPED, RunStatus.FAILED)
"""Statuses of a run that `resume` continues from its checkpoint."""
