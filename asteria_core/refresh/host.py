"""Snapshots from a CUDA device to host workers, and results back, without stalling the step.

On a CPU run a snapshot is lent as it is (no copy at all) and this module does nothing. On CUDA
the refresh must run on the host, beside the device, not as kernels on the device's stream, so:

- `HostCopies` copies a boundary's lent snapshots into pinned host memory on a side stream that
  first waits for the step's work (the statistics are final), and records one event the workers
  wait on (a blocking event: a waiting worker sleeps instead of spinning on a core). The training
  stream never waits: the lent tensors are not written again (copy on write), and
  `record_stream` keeps their memory from being reused before the copy ran.
- `checked_refresh(..., pin_memory=True)` leaves a thread worker's result in pinned memory, so
  the swap's copies back to the device are asynchronous too (a worker process's result comes
  back through a pipe, unpinned, and its swap copy may block the host until the device is idle).

With d = 0 a refresh is swapped in at its own boundary, so the step waits for the copy, which
waits for the device's queued work: on CUDA keep d >= 1 (the default, d = the refresh interval
at most S, does).

Not yet run on a GPU.
"""

from __future__ import annotations

import dataclasses

import torch

from asteria_core.optim.seam import FactorSnapshot


class HostCopies:
    """Copies snapshots of `device` state to pinned host memory on a side stream."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Priority 0, the lowest, is also the default (and CUDA does not prioritise copies):
        # what keeps the training stream free is that it never waits for this one.
        self.stream = torch.cuda.Stream(device=device, priority=0)

    def __call__(self, snapshots: list[FactorSnapshot]
                 ) -> tuple[list[FactorSnapshot], torch.cuda.Event]:
        """Host copies of `snapshots` (in flight) and the event that marks them complete."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            copies = [dataclasses.replace(
                s, factor=self._copy(s.factor),
                basis=None if s.basis is None else self._copy(s.basis)) for s in snapshots]
            done = torch.cuda.Event(blocking=True)
            done.record(self.stream)
        return copies, done

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        if t.is_cuda:
            t.record_stream(self.stream)  # the optimizer may drop t before the copy has run
        return host


def host_copies_for(optimizer: torch.optim.Optimizer) -> HostCopies | None:
    """A HostCopies when the optimizer's parameters live on a CUDA device, else None."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            return HostCopies(p.device) if p.device.type == "cuda" else None
    return None
