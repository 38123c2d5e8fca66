"""Bearer-token auth for mutating routes, compared in constant time; wrong tokens throttled
per client (TokenGuard)."""

from __future__ import annotations

import hmac
import logging
import math
import os
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, generate_latest
from starlette.types import Scope

log = logging.getLogger(__name__)


def load_or_create_token(token: str | None, path: Path) -> tuple[str, bool]:
    """The token from settings, else from `path`, else a new one written there with mode 0600.

    Returns (token, created): the caller prints a created token once, so the operator sees it.
    """
    if token:
        return token, False
    if path.is_file():
        text = path.read_text().strip()
        if text:
            return text, False
    path.parent.mkdir(parents=True, exist_ok=True)
    new = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new + "\n")
    os.chmod(path, 0o600)  # the umask may have widened it
    return new, True


def token_matches(header: str | None, expected: str) -> bool:
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), expected.encode())


class Throttled(Exception):
    """A client that sent too many wrong tokens: answer 429 with `retry_after` seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many wrong tokens; retry after {retry_after} s")
        self.retry_after = retry_after


class FailedAttempts:
    """Wrong tokens per client in a sliding window: after `burst` of them within
    `window_seconds`, the client is throttled until the oldest leaves the window. Bounded: at
    most `max_clients` clients are remembered (the one whose latest failure is oldest goes)."""

    def __init__(self, burst: int, window_seconds: float, *, max_clients: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.window = burst, window_seconds
        self.max_clients, self.clock = max_clients, clock
        self._times: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._times.get(client, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def retry_after(self, client: str) -> int | None:
        """Seconds until `client` may try again, or None when it is not throttled."""
        with self._lock:
            now = self.clock()
            times = self._recent(client, now)
            if len(times) < self.burst:
                return None
            return max(1, math.ceil(times[0] + self.window - now))

    def record(self, client: str) -> int:
        """Count one wrong token from `client`; returns its failures within the window."""
        with self._lock:
            now = self.clock()
            times = self._recent(client, now)
            times.append(now)
            self._times[client] = times
            self._times.move_to_end(client)
            while len(self._times) > self.max_clients:
                self._times.popitem(last=False)
            return len(times)


class TokenGuard:
    """The one place a presented token is compared: wrong ones are counted per client (IP),
    logged without their value and, after a burst, throttled; a throttled client's token is
    not even compared, so a guess made then tells nothing. A request without an
    Authorization header guesses nothing: it is neither counted nor throttled."""

    def __init__(self, token: str, burst: int, window_seconds: float) -> None:
        self.token = token
        self.failures = FailedAttempts(burst, window_seconds)
        self.registry = CollectorRegistry()
        self.failed_total = Counter("asteria_auth_failures_total",
                                    "Requests that presented a wrong bearer token",
                                    registry=self.registry)
        self.throttled_total = Counter("asteria_auth_throttled_total",
                                       "Requests refused with 429 after too many wrong tokens",
                                       registry=self.registry)

    def verify(self, header: str | None, client: str) -> bool:
        """Whether `header` carries the token. Raises Throttled for a client over its burst
        that presents any header."""
        if not header:
            return False
        wait = self.failures.retry_after(client)
        if wait is not None:
            self.throttled_total.inc()
            raise Throttled(wait)
        if token_matches(header, self.token):
            return True
        count = self.failures.record(client)
        self.failed_total.inc()
        log.warning("wrong bearer token from %s (%d within %g s; %d allowed)", client, count,
                    self.failures.window, self.failures.burst)
        return False

    def throttled(self, header: str | None, client: str) -> bool:
        """Whether `verify` would raise Throttled now (nothing counted)."""
        return bool(header) and self.failures.retry_after(client) is not None

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def client_host(scope: Scope) -> str:
    """The client's address as the server saw it (a proxy in front: the proxy's)."""
    client = scope.get("client")
    return client[0] if client else "unknown"
