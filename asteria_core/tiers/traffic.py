"""The reader and writer threads between the staging buffers and the disk tier's files.

A load takes a free buffer and reads a parameter's files into it, after that parameter's
pending write, so it reads the newest values. A write-back writes the dirty files of a buffer
and frees it, after the device's copies out of it. A load's error goes to whoever waits for the
load; a write's is kept and raised on the training thread at its next call (`raise_errors`).
"""

from __future__ import annotations

import queue
import threading
from typing import Any

from asteria_core.telemetry.labels import Tier
from asteria_core.tiers.buffers import StagingBuffers
from asteria_core.tiers.files import Group, ParamFiles

Load = tuple[threading.Event, list]
"""A load in flight: (done, [buffer number, error])."""


class DiskTraffic:
    """Loads and write-backs of disk-homed state, on a reader and a writer thread."""

    def __init__(self, files: ParamFiles, buffers: StagingBuffers) -> None:
        self.files = files
        self.buffers = buffers
        self._writing: dict[int, threading.Event] = {}
        """Parameter index -> the event its last write-back sets when done."""
        self.errors: list[BaseException] = []
        """The write-backs' errors, raised on the training thread."""
        self._reads: queue.Queue = queue.Queue()
        self._writes: queue.Queue = queue.Queue()
        self._threads = [threading.Thread(target=self._loop, args=(q,), daemon=True,
                                          name=f"tier-{n}")
                         for n, q in (("reader", self._reads), ("writer", self._writes))]
        for thread in self._threads:
            thread.start()

    def load(self, index: int) -> Load:
        """Start loading parameter `index`'s files into a free buffer."""
        load: Load = (threading.Event(), [None, None])
        self._reads.put((self._read, index, load))
        return load

    def _read(self, index: int, load: Load) -> None:
        done, out = load
        try:
            pending = self._writing.get(index)
            if pending is not None:
                pending.wait()
            out[0] = slot = self.buffers.take()
            self.files.read(index, self.buffers.buffer(slot))
        except BaseException as err:  # handed to the training thread at acquire
            out[1] = err
        finally:
            done.set()

    def write_back(self, index: int, slot: int, dirty: list[Group], ready: Any = None) -> None:
        """Write the dirty files of the buffer `slot` and free it, on the writer thread, once
        the device's copies out of and into it are done (`ready`, an event; None: no copies)."""
        if not dirty and ready is None:
            self.buffers.free(slot)
            return
        event = self._writing[index] = threading.Event()
        self._writes.put((self._write, index, slot, dirty, event, ready))

    def _write(self, index: int, slot: int, dirty: list[Group], event: threading.Event,
               ready: Any = None) -> None:
        try:
            if ready is not None:  # waits on the writer thread, never the training thread
                ready.synchronize()
            self.files.write(self.buffers.buffer(slot), dirty, Tier.HOST)
        except BaseException as err:
            self.errors.append(err)
        finally:
            self.buffers.free(slot)
            event.set()

    def wait_written(self, index: int) -> None:
        """Wait for parameter `index`'s pending write-back, and raise any write's error."""
        event = self._writing.get(index)
        if event is not None:
            event.wait()
        self.raise_errors()

    def wait_writes(self) -> None:
        """Wait for every write-back (errors are left to `raise_errors`)."""
        for event in list(self._writing.values()):
            event.wait()

    def raise_errors(self) -> None:
        if self.errors:
            raise self.errors[0]

    def running(self) -> bool:
        return bool(self._threads)

    def stop(self) -> None:
        """Stop both threads once the tasks queued before are done."""
        for q in (self._reads, self._writes):
            q.put(None)
        for t in self._threads:
            t.join(timeout=30)
        self._threads = []

    @staticmethod
    def _loop(q: queue.Queue) -> None:
        while True:
            task = q.get()
            if task is None:
                return
            task[0](*task[1:])
