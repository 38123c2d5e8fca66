"""Policy changes on every rank at one step, without a barrier.

Rank 0 (whose control plane takes the PATCH) takes its queued changes at the boundary of step t
and broadcasts them asynchronously, on a gloo group of their own; every rank, rank 0 included,
waits for that message at the boundary of t + 1 (a whole step later, so normally it is there)
and applies it there: the change is in force from step t + 2 on every rank, which is what the
PATCH answered (`LivePolicy.apply_after = 2`). The message is a fixed-size buffer (the policy is
a few hundred bytes of JSON), so every rank posts the same collective every boundary; a wait for
a late one is `sync_wait`.
"""

from __future__ import annotations

import dataclasses
import json

import torch
import torch.distributed as dist

from asteria_core.policy import LivePolicy, Policy, PolicyChange, PolicyError
from asteria_core.telemetry.labels import IdleCause
from asteria_core.telemetry.reporter import Reporter

MESSAGE_BYTES = 16 * 1024
"""Room for the policy, its version and the changes of one boundary, as JSON."""


class PolicySync:
    def __init__(self, live: LivePolicy, rank: int, reporter: Reporter) -> None:
        self.live, self.rank, self.reporter = live, rank, reporter
        self._group = dist.new_group(backend="gloo")  # collective: every rank, same order
        self._buffer = torch.zeros(MESSAGE_BYTES, dtype=torch.uint8)
        self._work = None
        live.apply_after = 2
        if rank != 0:
            live.add_validator(_through_rank_zero)

    def at_boundary(self, step: int) -> list[PolicyChange]:
        """The policy stage of the step boundary: apply what rank 0 sent at the last boundary,
        then send this boundary's changes. Returns the changes applied now."""
        applied = []
        if self._work is not None:
            with self.reporter.wait(IdleCause.SYNC_WAIT):
                self._work.wait()
            message = _decode(self._buffer)
            if message is not None:
                applied = self.live.apply(*message, step=step)
        self._buffer = _encode(*self.live.take_pending(step)) if self.rank == 0 else \
            torch.zeros(MESSAGE_BYTES, dtype=torch.uint8)
        self._work = dist.broadcast(self._buffer, src=0, group=self._group, async_op=True)
        return applied

    def close(self) -> None:
        """Wait for the last message (every rank posted it), so the group can be torn down."""
        if self._work is not None:
            self._work.wait()
            self._work = None


def _through_rank_zero(proposed: Policy) -> None:
    raise PolicyError("policy", "in a data-parallel run, changes go through rank 0 (its control "
                                "plane), which brings them to every rank at one step")


def _encode(policy: Policy, version: int, changes: list[PolicyChange]) -> torch.Tensor:
    buffer = torch.zeros(MESSAGE_BYTES, dtype=torch.uint8)
    if not changes:
        return buffer  # length 0: nothing changed
    text = json.dumps({"policy": policy.to_dict(), "version": version,
                       "changes": [dataclasses.asdict(c) for c in changes]}).encode()
    if len(text) > MESSAGE_BYTES - 8:
        raise PolicyError("policy", f"a change of {len(text)} bytes does not fit the "
                                    f"{MESSAGE_BYTES - 8} bytes a boundary carries")
    buffer[:8] = torch.tensor(list(len(text).to_bytes(8, "little")), dtype=torch.uint8)
    buffer[8:8 + len(text)] = torch.frombuffer(bytearray(text), dtype=torch.uint8)
    return buffer


def _decode(buffer: torch.Tensor) -> tuple[Policy, int, list[PolicyChange]] | None:
    size = int.from_bytes(bytes(buffer[:8].tolist()), "little")
    if size == 0:
        return None
    data = json.loads(bytes(buffer[8:8 + size].tolist()))
    changes = [PolicyChange(**{**c, "diff": {k: tuple(v) for k, v in c["diff"].items()}})
               for c in data["changes"]]
    return Policy(**data["policy"]), data["version"], changes
