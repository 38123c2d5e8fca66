"""What an anonymous reader (a GET without the token) sees: everything about training, nothing
about the machine's files or the people who steer it.

Runs, step records, policies, their history and /metrics are public, so a dashboard or a
scraper needs no secret. Hidden from them: file system paths (a run's folder is shown as
`runs/<id>`, a path in a config or policy by its last component), a failed run's error beyond
its kind (messages may name files), and who changed a policy (the audit's client, an IP address
and user agent, reads `operator`; the autopilot's changes say `autopilot`). A GET that carries
the token sees every field.
"""

from __future__ import annotations

import dataclasses
from pathlib import PurePath
from typing import Any, overload

from asteria_core.autopilot import AUTOPILOT
from asteria_core.policy import PolicyChange

PATH_KEYS = (("data", "corpus"), ("train", "resume"), ("train", "out_dir"),
             ("policy", "disk_dir"), ("telemetry", "rapl_root"))
CLIENT = "operator"


def _name(value: Any) -> Any:
    return PurePath(value).name if isinstance(value, str) and value else value


@overload
def policy(values: dict[str, Any]) -> dict[str, Any]: ...
@overload
def policy(values: None) -> None: ...
def policy(values: dict[str, Any] | None) -> dict[str, Any] | None:
    if not values or "disk_dir" not in values:
        return values
    return {**values, "disk_dir": _name(values["disk_dir"])}


def run(row: dict[str, Any]) -> dict[str, Any]:
    config = {section: dict(values) for section, values in row["config"].items()}
    for section, key in PATH_KEYS:
        if key in config.get(section, {}):
            config[section][key] = _name(config[section][key])
    error = row.get("error")
    run_dir = f"runs/{row['id']}" if row.get("run_dir") else None
    return {**row, "run_dir": run_dir, "config": config,
            "policy": policy(row.get("policy")),
            "error": error.split(":", 1)[0] if error else error}


def change(values: PolicyChange) -> PolicyChange:
    diff = values.diff
    if "disk_dir" in diff:
        diff = {**diff, "disk_dir": tuple(_name(v) for v in diff["disk_dir"])}
    # the autopilot is no person: its changes keep their actor, and their reason, in public
    client = values.client if values.client == AUTOPILOT else CLIENT
    return dataclasses.replace(values, client=client, diff=diff)
