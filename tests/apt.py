"""Debian packages a test needs, installed with apt-get as root, one install at a time.

Tests run in two pytest-xdist workers, and two `apt-get` at once fail on dpkg's lock: a file
lock makes the second wait for the first (then it usually finds its package installed)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "asteria-tests-apt.lock"


def can_install() -> bool:
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def install(*packages: str, timeout: float = 900) -> str:
    """Installs `packages` (after `apt-get update`); returns "" or what failed."""
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for cmd in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *packages]):
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if done.returncode != 0:
                return f"`{' '.join(cmd)}` failed: {done.stdout[-1000:]}\n{done.stderr[-1000:]}"
    return ""
