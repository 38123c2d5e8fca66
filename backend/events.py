"""Live events: the training thread publishes, each SSE client has its own bounded queue."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Event:
    kind: str
    """step | policy | status"""
    run_id: str
    data: dict[str, Any] | None = None
    text: str = ""
    """`data` as JSON: made once at publish (or given), sent as is to every subscriber."""


@dataclass(slots=True, eq=False)
class Subscription:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[Event]
    run_id: str | None
    dropped: int = 0


@dataclass
class Broadcaster:
    """Fan-out from any thread to asyncio subscribers; a slow client loses events, not memory."""

    max_queue: int = 1000
    _subs: set[Subscription] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def subscribe(self, run_id: str | None) -> Subscription:
        sub = Subscription(asyncio.get_running_loop(), asyncio.Queue(self.max_queue), run_id)
        with self._lock:
            self._subs.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subs.discard(sub)

    def publish(self, event: Event) -> None:
        if not event.text:
            event.text = json.dumps(event.data)
        with self._lock:
            subs = [s for s in self._subs if s.run_id in (None, event.run_id)]
        for sub in subs:
            try:
                sub.loop.call_soon_threadsafe(_offer, sub, event)
            except RuntimeError:  # the subscriber's loop is closed: it is gone
                self.unsubscribe(sub)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subs)


def _offer(sub: Subscription, event: Event) -> None:
    try:
        sub.queue.put_nowait(event)
    except asyncio.QueueFull:
        sub.dropped += 1
