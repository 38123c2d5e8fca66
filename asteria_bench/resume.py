"""Continuing a suite that was cut short (`asteria bench optimizers --resume`) from the runs its
JSON already holds.

A run is kept only where it would come out the same today: the code the suite measures is
byte for byte the code the JSON was written with (a digest of those files, so it holds for a
source checkout and an installed package alike), on the same machine, with the same sizes.
Anything else is refused with what differs, never mixed into one file.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from asteria_bench.results import SuiteResult, git_info, machine_info
from asteria_bench.suites import measured_paths

ROOT = Path(__file__).resolve().parents[1]  # asteria_core, asteria_bench and backend lie here
GROWING = ("corpora", "summary", "planned_runs", "resumed", "measured_code")
"""Config keys a run fills in as it goes, or that are compared on their own."""
SAME_MACHINE = ("cpu", "cores", "python", "torch", "torch_threads", "device")


class ResumeError(ValueError):
    """The JSON in --out can not be continued; the message says why."""


def code_digest(suite: str) -> str:
    """A digest of the Python files of the code `suite` measures."""
    digest = hashlib.sha256()
    for rel in measured_paths(suite):
        path = ROOT / rel
        files = sorted(path.rglob("*.py")) if path.is_dir() else ([path] if path.is_file() else [])
        for file in files:
            digest.update(file.relative_to(ROOT).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _first_difference(old: dict[str, Any], new: dict[str, Any],
                      skip: tuple[str, ...] = ()) -> str | None:
    for key in sorted((set(old) | set(new)) - set(skip)):
        if old.get(key) != new.get(key):
            return f"{key} {old.get(key)!r} then, {new.get(key)!r} now"
    return None


def previous_runs(result: SuiteResult, out_dir: Path) -> list[dict[str, Any]]:
    """The runs of this suite's JSON in `out_dir` that the run about to start can keep (none
    where there is no file); `result` takes over the file's start, seconds and commit so the
    finished file reads as one run, and records this continuation in config["resumed"]."""
    path = out_dir / f"{result.suite}.json"
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise ResumeError(f"--resume: {path} is not readable JSON ({err})") from err
    refuse = f"--resume: {path} can not be continued"
    if data.get("suite") != result.suite or data.get("quick") != result.quick:
        raise ResumeError(f"{refuse}: it holds suite {data.get('suite')!r} "
                          f"(quick {data.get('quick')}), this run is {result.suite!r} "
                          f"(quick {result.quick})")
    old = data.get("config", {})
    if old.get("measured_code") != result.config["measured_code"]:
        raise ResumeError(f"{refuse}: the code it measures changed since it ran (digest "
                          f"{old.get('measured_code')} then, {result.config['measured_code']} "
                          "now)")
    changed = _first_difference(old, result.config, GROWING)
    if changed:
        raise ResumeError(f"{refuse}: its sizes differ from this run's (config {changed})")
    machine = machine_info()
    moved = _first_difference({k: data.get("machine", {}).get(k) for k in SAME_MACHINE},
                              {k: machine.get(k) for k in SAME_MACHINE})
    if moved:
        raise ResumeError(f"{refuse}: it ran on another machine (machine {moved})")
    runs = list(data.get("runs", []))
    result.started, result.git = data["started"], data["git"]
    result.shift_start(float(data.get("seconds", 0.0)))
    result.config["resumed"] = [*old.get("resumed", []), {
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_info(), "runs_kept": len(runs)}]
    return runs
