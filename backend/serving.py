"""How uvicorn serves the control plane: bounded connections, request heads and idle time.

The process that serves the API also trains, so an anonymous local client must not be able to
exhaust it: connections beyond `max_connections` are refused at once, a request head larger than
`max_header_bytes` is refused (h11 bounds its buffer; httptools would not), a connection that has
not sent a complete head within `header_timeout_seconds` is closed (uvicorn has no such timeout:
its keep-alive timer starts only after a response and stops at the first byte), and forwarding
headers are believed only from the proxies the operator names.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from backend.settings import Settings

log = logging.getLogger(__name__)

FD_SHARE = 4
"""Connections may take at most 1/FD_SHARE of the open-file limit; the rest is the training's."""
REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
           b"connection: close\r\nretry-after: 5\r\ncontent-length: 32\r\n\r\n"
           b"too many open connections: retry")


def connection_bound(wanted: int) -> int:
    """`wanted`, lowered to a share of this process's open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft // FD_SHARE))


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection bound and a deadline for each request head."""

    max_connections = 256
    header_timeout = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.write(REFUSAL)
            transport.close()
            return
        self._head_deadline: asyncio.TimerHandle | None = None
        self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        deadline = getattr(self, "_head_deadline", None)
        if deadline is not None:
            deadline.cancel()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline = None
        if not self.transport.is_closing():
            self._head_deadline = self.loop.call_later(self.header_timeout, self._head_overdue)

    def _head_overdue(self) -> None:
        # IDLE: no request head complete since the deadline was armed (none sent, or a part).
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app: Any, settings: Settings, **kwargs: Any) -> uvicorn.Config:
    """The uvicorn config that serves `app` under `settings`' bounds (kwargs: uvicorn's own)."""
    bound = connection_bound(settings.max_connections)
    if bound < settings.max_connections:
        log.warning("max_connections lowered from %d to %d: a quarter of the open-file limit",
                    settings.max_connections, bound)
    protocol = type("ServedH11Protocol", (GuardedH11Protocol,),
                    {"max_connections": bound,
                     "header_timeout": settings.header_timeout_seconds})
    proxies = settings.trusted_proxies
    return uvicorn.Config(app, host=settings.host, port=settings.port, http=protocol,
                          h11_max_incomplete_event_size=settings.max_header_bytes,
                          # uvicorn annotates an int; it passes the seconds to a timer, which
                          # takes a float.
                          timeout_keep_alive=settings.keep_alive_seconds,  # type: ignore[arg-type]
                          proxy_headers=bool(proxies),
                          forwarded_allow_ips=",".join(proxies) if proxies else None,
                          **kwargs)
