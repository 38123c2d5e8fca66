"""One process trains in a run folder at a time: an exclusive lock on a file in the folder.

The lock is the kernel's (`flock`), so it goes with the process that holds it, however that
process ends (kill -9 included): a folder is never left locked by a dead server. A second server
(one started on a copy of the data folder that still names this folder, or on the same data
folder) is refused with who holds it.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_NAME = ".lock"


class RunFolderBusy(RuntimeError):
    """Another process trains in the run folder."""


class RunFolderLock:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise RunFolderBusy(
                f"run folder {folder} is in use by {holder}, which trains in it; stop that "
                "run first (two processes training in one folder overwrite each other's "
                "checkpoints)") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the descriptor drops the lock
