"""Policy changes on every rank at one step, without a barrier, and 8 bytes a step otherwise.

Rank 0 (whose control plane takes the PATCH) takes its queued changes at the boundary of step t
and broadcasts their size asynchronously, on a gloo group of their own: an 8-byte header that
every rank, rank 0 included, waits for at the boundary of t + 1 (a whole step later, so normally
it is there). A header of 0 (no change: nearly every step) ends it. Otherwise the changes follow
as one broadcast of that many bytes of JSON at t + 1, and every rank applies them there: the
change is in force from step t + 2 on every rank, which is what the PATCH answered
(`LivePolicy.apply_after = 2`). Every rank posts the same collectives at every boundary; a wait
for a late one is `sync_wait`. Bytes are counted as the version exchange counts them (payload x
receivers sent by rank 0, payload received by every other rank).
"""

from __future__ import annotations

import dataclasses
import json

import torch
import torch.distributed as dist

from asteria_core.distributed.process_group import release_group
from asteria_core.policy import LivePolicy, Policy, PolicyChange, PolicyError
from asteria_core.telemetry.labels import IdleCause
from asteria_core.telemetry.reporter import Reporter

HEADER_BYTES = 8
MESSAGE_BYTES = 16 * 1024
"""The most bytes one boundary's changes may take: the policy, its version and the changes."""


class PolicySync:
    def __init__(self, live: LivePolicy, rank: int, world: int, reporter: Reporter) -> None:
        self.live, self.rank, self.world, self.reporter = live, rank, world, reporter
        self.bytes_sent = 0
        self.bytes_received = 0
        self._group = dist.new_group(backend="gloo")  # collective: every rank, same order
        self._header = torch.zeros(1, dtype=torch.int64)
        self._message = torch.zeros(0, dtype=torch.uint8)
        """Rank 0: the changes whose header is in flight (sent at the next boundary)."""
        self._work = None
        live.apply_after = 2
        if rank != 0:
            live.add_validator(_through_rank_zero)

    def at_boundary(self, step: int) -> list[PolicyChange]:
        """The policy stage of the step boundary: apply what rank 0 announced at the last
        boundary, then announce this boundary's changes. Returns the changes applied now."""
        applied: list[PolicyChange] = []
        if self._work is not None:
            with self.reporter.wait(IdleCause.SYNC_WAIT):
                self._work.wait()
                size = int(self._header.item())
                if size:
                    message = self._message if self.rank == 0 else \
                        torch.empty(size, dtype=torch.uint8)
                    dist.broadcast(message, src=0, group=self._group)
                    self._count(size)
            if size:
                applied = self.live.apply(*_decode(message), step=step)
        self._message = _encode(*self.live.take_pending(step)) if self.rank == 0 else \
            self._message
        self._header = torch.tensor([self._message.numel() if self.rank == 0 else 0])
        self._work = dist.broadcast(self._header, src=0, group=self._group, async_op=True)
        self._count(HEADER_BYTES)
        return applied

    def _count(self, nbytes: int) -> None:
        if self.rank == 0:
            self.bytes_sent += nbytes * (self.world - 1)
        else:
            self.bytes_received += nbytes

    def close(self) -> None:
        """Wait for the last header (every rank posted it), then release the group; a change
        announced there is never applied (the run ends before its step)."""
        if self._work is not None:
            self._work.wait()
            if int(self._header.item()):
                message = self._message if self.rank == 0 else \
                    torch.empty(int(self._header.item()), dtype=torch.uint8)
                dist.broadcast(message, src=0, group=self._group)
            self._work = None
        release_group(self._group)
        self._group = None


def _through_rank_zero(proposed: Policy) -> None:
    raise PolicyError("policy", "in a data-parallel run, changes go through rank 0 (its control "
                                "plane), which brings them to every rank at one step")


def _encode(policy: Policy, version: int, changes: list[PolicyChange]) -> torch.Tensor:
    """The changes of one boundary as JSON bytes (none: nothing changed)."""
    if not changes:
        return torch.zeros(0, dtype=torch.uint8)
    text = json.dumps({"policy": policy.to_dict(), "version": version,
                       "changes": [dataclasses.asdict(c) for c in changes]}).encode()
    if len(text) > MESSAGE_BYTES:
        raise PolicyError("policy", f"a change of {len(text)} bytes does not fit the "
                                    f"{MESSAGE_BYTES} bytes a boundary carries")
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


def _decode(message: torch.Tensor) -> tuple[Policy, int, list[PolicyChange]]:
    data = json.loads(bytes(message.tolist()))
    changes = [PolicyChange(**{**c, "diff": {k: tuple(v) for k, v in c["diff"].items()}})
               for c in data["changes"]]
    return Policy(**data["policy"]), data["version"], changes
