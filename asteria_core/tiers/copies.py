"""Copies between host-homed optimizer state and the device, off the training stream.

On a GPU, state homed on the host lives in pinned memory (`pin`) and is copied in for each use
and back after an update. A blocking `copy_` per parameter per step would stall the host on the
device at every parameter; here nothing does:

- in (`to_device`): an asynchronous copy on the training stream, from pinned memory, after the
  stream waits (on the device, not the host) for the last copy out of that home;
- out (`to_host`): a side stream first waits for the training stream (the update is enqueued
  there), copies asynchronously into the pinned home, records an event, and keeps the device
  tensor alive until the side stream has read it (`record_stream`).

The disk tier's staging buffers are pinned the same way (`register`), and a parameter's state
goes in and out of its buffer by the same two copies; the writer thread waits for the copy out
(`last_event`) before it writes the buffer to disk or frees it: off the training thread.

The training thread waits for the copies out (`settle`, one synchronization on the last event of
the stream) only where it reads the homes itself: before a checkpoint, a migration or close (the
tier store's `_drain`). Per step the store adds no host-device synchronization; the step's one
is the phase timer's (telemetry/timing.py). The CUDA calls go through `api` (torch.cuda), the
seam a test fills with a fake where there is no GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

Key = tuple  # (parameter index, state path)


class TorchCuda:
    """The CUDA calls the copies make: torch.cuda's (a fake replaces this object in tests)."""

    Stream = staticmethod(torch.cuda.Stream)
    Event = staticmethod(torch.cuda.Event)
    current_stream = staticmethod(torch.cuda.current_stream)
    stream = staticmethod(torch.cuda.stream)

    @staticmethod
    def record_stream(t: torch.Tensor, stream: Any) -> None:
        t.record_stream(stream)

    @staticmethod
    def pin(t: torch.Tensor) -> torch.Tensor:
        """A pinned (page-locked) host copy: what an asynchronous copy needs."""
        return t.detach().to("cpu").pin_memory()

    @staticmethod
    def host_register(buf: np.ndarray) -> bool:
        """Page-lock an existing host buffer (the disk tier's aligned staging buffers)."""
        return int(torch.cuda.cudart().cudaHostRegister(buf.ctypes.data, buf.nbytes, 0)) == 0

    @staticmethod
    def host_unregister(buf: np.ndarray) -> None:
        torch.cuda.cudart().cudaHostUnregister(buf.ctypes.data)


class HostCopies:
    """Pinned host homes <-> `device`, with a side stream and events."""

    def __init__(self, device: torch.device, api: Any = None) -> None:
        self.api = api if api is not None else TorchCuda()
        self.device = device
        self.stream = self.api.Stream(device)
        self._out: dict[Key, Any] = {}
        """The event ending the last copy out of each home, until `settle`."""
        self._last: Any = None
        """The event ending the last copy out (the api's Event); None when none is pending."""
        self._registered: list[np.ndarray] = []
        self.copies_out = 0

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        """A pinned host copy of `t`: the home an asynchronous copy needs."""
        return self.api.pin(t)

    def to_device(self, key: Key, home: torch.Tensor) -> torch.Tensor:
        """The home's values on the device, on the training stream, after its last copy out."""
        event = self._out.get(key)
        if event is not None:
            self.api.current_stream(self.device).wait_event(event)
        return home.to(self.device, non_blocking=True, copy=True)

    def to_host(self, key: Key, home: torch.Tensor, t: torch.Tensor) -> None:
        """Copy the device tensor `t` into its pinned `home`, off the training stream."""
        side = self.stream
        side.wait_stream(self.api.current_stream(self.device))
        with self.api.stream(side):
            home.copy_(t, non_blocking=True)
        self.api.record_stream(t, side)  # its memory is not reused before the side stream
        # has read it
        event = self.api.Event()
        event.record(side)
        self._out[key] = self._last = event
        self.copies_out += 1

    def last_event(self) -> Any:
        """The event ending the last copy out (None when none is pending)."""
        return self._last

    def register(self, buffers: list[np.ndarray]) -> None:
        """Pin the disk tier's staging buffers (replacing any pinned before), so copies in and
        out of them are asynchronous too; a buffer the driver will not pin stays pageable (its
        copies are then synchronous, still correct)."""
        self.unregister()
        for buf in buffers:
            if buf.nbytes and self.api.host_register(buf):
                self._registered.append(buf)

    def unregister(self) -> None:
        for buf in self._registered:
            self.api.host_unregister(buf)
        self._registered = []

    def settle(self) -> None:
        """The host reads the homes next: wait for every copy out (the side stream runs them in
        order, so its last event covers them all)."""
        if self._last is not None:
            self._last.synchronize()  # host-device sync: before a checkpoint/migration only
        self._out.clear()
        self._last = None


class BlockingCopies(HostCopies):
    """A device without streams (e.g. meta, or a backend torch.cuda does not drive): plain
    copies, synchronous where the device is."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._out = {}
        self._last = None
        self._registered = []
        self.copies_out = 0

    def register(self, buffers: list[np.ndarray]) -> None:
        pass

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to("cpu", copy=True)

    def to_device(self, key: Key, home: torch.Tensor) -> torch.Tensor:
        return home.to(self.device)

    def to_host(self, key: Key, home: torch.Tensor, t: torch.Tensor) -> None:
        home.copy_(t)
        self.copies_out += 1


def copies_for(device: torch.device) -> HostCopies | None:
    """The copies a device needs for host-homed state; None on the CPU (used in place)."""
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        return HostCopies(device)
    return BlockingCopies(device)
