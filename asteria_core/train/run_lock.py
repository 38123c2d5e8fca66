"""One process trains in a run folder at a time: an exclusive lock on a file in the folder.

The lock is the kernel's (`flock`), so it goes with the process that holds it, however that
process ends (kill -9 included): a folder is never left locked by a dead process. Every trainer
takes it (`asteria train`, a served run, each rank of a data-parallel run in its own rank
folder), and so does the control plane before it launches a run there: a second process that
would train in the folder (a second server, a CLI run, a second `--train.resume` of the same
checkpoint) is refused with who holds it.

Within one process the lock is shared: the control plane holds it while its own trainer, in a
thread of the same process, takes it again. A flock belongs to one open file, so a second open
in the same process would refuse itself; holders here count instead, and the file is closed
(the lock dropped) when the last one releases it.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

LOCK_NAME = ".lock"

_held: dict[tuple[int, int], list[int]] = {}
"""The lock files this process holds, by (device, inode): [descriptor, holders]."""
_held_guard = threading.Lock()


class RunFolderBusy(RuntimeError):
    """Another process trains in the run folder."""


class RunFolderLock:
    def __init__(self, folder: Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        with _held_guard:
            try:
                stat = os.fstat(fd)
                key = (stat.st_dev, stat.st_ino)
                if key in _held:  # this process holds it already
                    os.close(fd)
                    _held[key][1] += 1
                    self._key: tuple[int, int] | None = key
                    return
                _take(fd, folder)
            except BaseException:
                os.close(fd)
                raise
            try:  # who holds it, for the refusal's message: the flock itself is the lock
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"process {os.getpid()}\n".encode(), 0)
            except OSError:  # a full disk fails where the run writes, naming its file
                pass
            _held[key] = [fd, 1]
            self._key = key

    def release(self) -> None:
        with _held_guard:
            if self._key is None:
                return
            key, self._key = self._key, None
            entry = _held[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                os.close(entry[0])  # closing the descriptor drops the lock


def _take(fd: int, folder: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
        raise RunFolderBusy(
            f"run folder {folder} is in use by {holder}, which trains in it; stop that run "
            "first (two processes training in one folder overwrite each other's "
            "checkpoints)") from None
