"""The folders an HTTP request may name: a run's corpus, the checkpoint it resumes from, the
disk tier's folder.

A request never names a file the operator did not put within reach: a path is taken only when,
resolved (symlinks and `..` followed, relative paths against the server's working folder), it
lies inside the data dir or a folder listed in ASTERIA_ALLOWED_PATHS, and never inside the
kernel's and the system's own trees, whatever is listed. The check runs before the config is
validated, so a refused path does not even tell whether it exists. (`asteria train`, run by the
operator on their own machine, may still name any path they can read.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asteria_core.policy import PolicyError
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.validation import ConfigError
from backend.settings import Settings

NEVER = tuple(Path(p) for p in ("/proc", "/sys", "/dev", "/etc", "/boot", "/run", "/root"))
"""Never allowed, even under a listed folder: the process's environment (the token), devices,
system configuration."""
CONFIG_PATHS = (("data", "corpus"), ("train", "resume"), ("policy", "disk_dir"))
RAPL_ROOT = TelemetryConfig().rapl_root


def _resolved(path: str) -> Path:
    return (Path.cwd() / Path(path).expanduser()).resolve()


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def refusal(path: str, settings: Settings) -> str | None:
    """Why a request may not name `path`, or None when it may (the empty path always may)."""
    if not path:
        return None
    roots = [settings.data_dir, *settings.allowed_paths]
    where = _resolved(path)
    if any(_inside(where, never) for never in NEVER) or \
            not any(_inside(where, _resolved(str(root))) for root in roots):
        allowed = ", ".join(str(_resolved(str(root))) for root in roots)
        return (f"got {path!r}; allowed: a path inside {allowed} (the data dir and "
                "ASTERIA_ALLOWED_PATHS)")
    return None


def check_config(config: dict[str, dict[str, Any]], policy: dict[str, Any],
                 settings: Settings) -> None:
    """The paths in a POST /runs body (raw, before validation); ConfigError names the key."""
    for section, key in CONFIG_PATHS:
        value = config.get(section, {}).get(key, "")
        if isinstance(value, str) and (why := refusal(value, settings)):
            raise ConfigError(f"{section}.{key}: {why}")
    disk_dir = policy.get("disk_dir", "")
    if isinstance(disk_dir, str) and (why := refusal(disk_dir, settings)):
        raise ConfigError(f"policy.disk_dir: {why}")
    rapl = config.get("telemetry", {}).get("rapl_root", RAPL_ROOT)
    if rapl != RAPL_ROOT:
        raise ConfigError(f"telemetry.rapl_root: got {rapl!r}; allowed: {RAPL_ROOT!r} (a "
                          "request may not move it)")


def check_policy(changes: dict[str, Any], settings: Settings) -> None:
    """The disk tier's folder in a PATCH, before anything creates it; PolicyError."""
    disk_dir = changes.get("disk_dir", "")
    if isinstance(disk_dir, str) and (why := refusal(disk_dir, settings)):
        raise PolicyError("disk_dir", why)
