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
import sys
from pathlib import Path
from typing import Any

from asteria_bench.results import SuiteResult, git_info
from asteria_bench.suites import NOT_RUN, measured_paths

ROOT = Path(__file__).resolve().parents[1]  # asteria_core, asteria_bench and backend lie here
SAME_MACHINE = ("cpu", "cores", "python", "torch", "device")


class ResumeError(ValueError):
    """The JSON in --out can not be continued; the message says why."""


def code_digest(suite: str) -> str:
    """A digest of the Python files of the code `suite` measures."""
    digest = hashlib.sha256()
    for rel in measured_paths(suite):
        path = ROOT / rel
        files = sorted(path.rglob("*.py")) if path.is_dir() else ([path] if path.is_file() else [])
        for file in files:
            if file.relative_to(ROOT).as_posix() in NOT_RUN:
                continue
            digest.update(file.relative_to(ROOT).as_posix().encode() + b"\0")
            digest.update(file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _decided(config: dict[str, Any]) -> dict[str, Any]:
    """What a run settles before its first configuration trains, as compared: corpora by their
    contents, not the temporary folder a built-in one is written to."""
    out = {k: v for k, v in config.items() if k not in ("measured_code", "resumed")}
    if "corpora" in out:
        out["corpora"] = {key: {k: v for k, v in corpus.items() if k != "path"}
                          for key, corpus in out["corpora"].items()}
    return out


def _first_difference(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    for key in sorted(new):  # only what this run has decided; the rest grows as it goes
        if old.get(key) != new[key]:
            return f"{key} {old.get(key)!r} then, {new[key]!r} now"
    return None


def previous_runs(result: SuiteResult, out_dir: Path) -> list[dict[str, Any]]:
    """The runs of this suite's JSON in `out_dir` for the run about to start, which has settled
    its config (sizes, corpora, peers, device, the digest of its code): `result` carries them
    until each is reached again, and takes over the file's start, seconds and commit so that the
    finished file reads as one run. No runs where there is no file (said on stderr)."""
    path = out_dir / f"{result.suite}.json"
    if not path.is_file():
        print(f"asteria bench: --resume: nothing to continue at {path}; starting from the "
              "first run", file=sys.stderr)
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
    if "measured_code" not in old:
        raise ResumeError(f"{refuse}: it records no digest of the code it measured (written "
                          "before runs could be continued)")
    if old["measured_code"] != result.config["measured_code"]:
        raise ResumeError(f"{refuse}: the code it measures changed since it ran (digest "
                          f"{old['measured_code']} then, {result.config['measured_code']} now)")
    changed = _first_difference(_decided(old), _decided(result.config))
    if changed:
        raise ResumeError(f"{refuse}: it was run with other settings (config {changed})")
    moved = _first_difference({k: data.get("machine", {}).get(k) for k in SAME_MACHINE},
                              {k: result.machine.get(k) for k in SAME_MACHINE})
    if moved:
        raise ResumeError(f"{refuse}: it ran on another machine (machine {moved})")
    runs = list(data.get("runs", []))
    result.started, result.git = data["started"], data["git"]
    result.shift_start(float(data.get("seconds", 0.0)))  # the saved runs' time
    result.carried = list(runs)
    result.config["resumed"] = [*old.get("resumed", []), {
        "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git": git_info(), "runs_found": len(runs)}]
    return runs


def settle(result: SuiteResult) -> None:
    """At the end of a resumed run: how many of the file's runs it kept, and the ones it never
    reached again (the choices went another way), which leave the file (said on stderr)."""
    if not result.config.get("resumed"):
        return
    last = result.config["resumed"][-1]  # this run's: previous_runs appended it
    last["runs_dropped"] = len(result.carried)
    last["runs_kept"] = last["runs_found"] - len(result.carried)
    if result.carried:
        print(f"asteria bench: --resume: {len(result.carried)} saved run(s) were not reached "
              "again and leave the file", file=sys.stderr)
    result.carried = []
