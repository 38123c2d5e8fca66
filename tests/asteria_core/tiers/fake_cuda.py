"""A fake of the CUDA streams and events the tier store's host copies use: the one test double
here, at the hardware boundary this machine lacks (no GPU). Work runs at once on the CPU; the
fake records what the copies asked of CUDA, in order, and counts host-device synchronizations.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import torch


class FakeStream:
    def __init__(self, cuda: FakeCuda, name: str) -> None:
        self.cuda, self.name = cuda, name

    def wait_stream(self, other: FakeStream) -> None:
        self.cuda.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event: FakeEvent) -> None:
        self.cuda.log.append(("wait_event", self.name, event.stream))


class FakeEvent:
    def __init__(self, cuda: FakeCuda) -> None:
        self.cuda, self.stream = cuda, None

    def record(self, stream: FakeStream | None = None) -> None:
        self.stream = (stream or self.cuda.current).name
        self.cuda.log.append(("record", self.stream))

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        thread = threading.current_thread().name
        self.cuda.sync_threads.append(thread)
        if thread == "MainThread":  # the training thread: the syncs that stall a step
            self.cuda.syncs += 1
        self.cuda.log.append(("synchronize", self.stream))


class FakeCuda:
    """torch.cuda's Stream, Event, current_stream and stream, and Tensor.record_stream."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.syncs = 0
        """Host-device synchronizations on the training (main) thread."""
        self.sync_threads: list[str] = []
        self.pinned = 0
        self.registered: set[int] = set()
        self.training = FakeStream(self, "training")
        self.current = self.training

    def Stream(self, device: torch.device) -> FakeStream:  # noqa: N802 (torch.cuda's name)
        return FakeStream(self, "side")

    def Event(self, **_: object) -> FakeEvent:  # noqa: N802
        return FakeEvent(self)

    def current_stream(self, device: torch.device | None = None) -> FakeStream:
        return self.current

    @contextmanager
    def stream(self, stream: FakeStream):
        before, self.current = self.current, stream
        self.log.append(("copy_on", stream.name))
        try:
            yield
        finally:
            self.current = before

    def record_stream(self, t: torch.Tensor, stream: FakeStream) -> None:
        self.log.append(("record_stream", stream.name))

    def host_register(self, buf) -> bool:
        self.registered.add(buf.ctypes.data)
        return True

    def host_unregister(self, buf) -> None:
        self.registered.remove(buf.ctypes.data)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        self.pinned += 1
        return t.detach().to("cpu", copy=True)
