"""What the autopilot read at its latest boundary, against the thresholds its rules act on: the
figures an operator needs to see why it decided nothing (or what it decided from).

It reads the same records `decide` reads (the window under the policy in force, after the
settle), so the figures are those the rules compared; before the window is full it says how
many records it still waits for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from asteria_core.autopilot.config import AutopilotConfig
from asteria_core.autopilot.decide import (
    BEHIND_DUTY,
    BEHIND_WAIT,
    FIRST_READ,
    SPARE_DUTY,
    SYNC_WAIT,
    TARGET_DUTY,
    TIER_WAIT,
    window_duty,
    window_size,
)
from asteria_core.autopilot.signals import Record, read


def reading(records: Sequence[Record], policy: Mapping[str, Any],
            history: Sequence[Mapping[str, Any]], config: AutopilotConfig) -> dict[str, Any]:
    """The latest reading: the step, the records read (or still awaited) and each figure with
    the threshold a rule compares it with (its `over` rule acts above `high`)."""
    if not records:
        return {"step": None, "records_read": 0, "records_needed": window_size(policy, config),
                "figures": []}
    now = int(records[-1]["step"])
    since = max((int(c["effective_step"]) for c in history), default=0)
    first = since + config.settle if history else FIRST_READ
    version = records[-1].get("policy_version")
    under = [r for r in records if r.get("policy_version") == version and r["step"] >= first]
    needed = window_size(policy, config)
    out: dict[str, Any] = {"step": now, "records_read": min(len(under), needed),
                           "records_needed": needed, "figures": []}
    if not under:
        return out
    s = read(under[-needed:])
    duty = window_duty(s.duty, policy)
    spare = SPARE_DUTY.get(config.objective, SPARE_DUTY["time"])
    out["figures"] = [
        {"name": "refresh duty", "value": duty, "low": spare, "target": TARGET_DUTY,
         "high": BEHIND_DUTY,
         "acts": f"above {BEHIND_DUTY}: more time or workers for refreshes; below {spare}: "
                 "one worker fewer"},
        {"name": "refresh wait (share of step time)", "value": s.refresh_wait, "low": None,
         "target": None, "high": BEHIND_WAIT,
         "acts": f"above {BEHIND_WAIT}: refreshes fall behind"},
        {"name": "tier wait (share of step time)", "value": s.transfer_wait, "low": None,
         "target": None, "high": TIER_WAIT,
         "acts": f"above {TIER_WAIT}: a faster tier or a larger budget"},
        {"name": "rank wait (share of step time)", "value": s.sync_wait, "low": None,
         "target": None, "high": SYNC_WAIT,
         "acts": f"above {SYNC_WAIT}: the ranks' refreshes fall behind"},
    ]
    return out
