"""Anonymous local clients cannot exhaust the process that trains: a real `asteria serve`
under a lowered open-file limit, real sockets on loopback.

Connections beyond the bound (a quarter of the open-file limit at most) are answered 503 and
closed at once, so the process keeps its descriptors; a connection that has not sent a complete
request head within the header timeout is closed, whether it sent nothing or sends a byte at a
time; an oversized head is refused; an idle kept-alive connection is closed.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.backend.conftest import HANG_GUARD, free_port, wait_for

FD_LIMIT = 512
BOUND = FD_LIMIT // 4  # what the server lowers max_connections (256 by default) to
FLOOD = 300
HEAD_SECONDS = 2.0


def _limit_fds() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    port = free_port()
    env = dict(os.environ, ASTERIA_HEADER_TIMEOUT_SECONDS=str(HEAD_SECONDS),
               ASTERIA_KEEP_ALIVE_SECONDS="1", ASTERIA_TOKEN="bounds-token")
    proc = subprocess.Popen(
        [sys.executable, "-m", "asteria", "serve", "--no-default-run", "--no-banner",
         "--port", str(port), "--data-dir", str(tmp_path_factory.mktemp("data"))],
        env=env, preexec_fn=_limit_fds, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, "asteria serve exited"
        try:
            return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, interval=0.2)
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(HANG_GUARD)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def closed_by_server(sock: socket.socket, timeout: float = HANG_GUARD) -> bytes | None:
    """What the server sent before it closed `sock` (None: still open after `timeout`)."""
    sock.setblocking(False)
    received, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.5)[0]:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk
    return None


def test_a_connection_flood_is_refused_beyond_the_bound_and_idle_ones_are_closed(served):
    proc, port = served
    before = open_fds(proc.pid)
    flood = [socket.create_connection(("127.0.0.1", port)) for _ in range(FLOOD)]
    try:
        # One more, answered: the server has accepted every connection opened before it.
        probe = socket.create_connection(("127.0.0.1", port))
        probe.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert probe.recv(1) == b"H"
        during = open_fds(proc.pid)
        assert during <= before + BOUND + 2, (before, during)
        # Those beyond the bound were told why, and closed at once.
        refused = [s for s in flood if (got := closed_by_server(s, 0.2)) is not None
                   and got.startswith(b"HTTP/1.1 503")]
        assert len(refused) >= FLOOD - BOUND
        # The rest sent nothing: closed after the header timeout.
        assert all(closed_by_server(s) is not None for s in flood if s not in refused)
        probe.close()
        assert wait_for(lambda: open_fds(proc.pid) <= before + 1)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=30).status_code == 200
    finally:
        for s in flood:
            s.close()


def test_a_head_sent_a_byte_at_a_time_is_cut_off(served):
    _, port = served
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        deadline = time.monotonic() + HANG_GUARD
        closed = False
        while time.monotonic() < deadline and not closed:
            try:
                slow.sendall(b"X")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            closed = closed_by_server(slow, 0.3) is not None
            slow.setblocking(True)
        assert closed, "a head trickling in was never cut off"


def test_an_oversized_head_is_refused(served):
    _, port = served
    with socket.create_connection(("127.0.0.1", port)) as big:
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (1 << 20) + \
            b"\r\n\r\n"
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            big.sendall(head)  # may be cut off while sending: refused before the end
        answer = closed_by_server(big)
        assert answer is not None and not answer.startswith(b"HTTP/1.1 200"), answer[:80]


def test_an_idle_kept_alive_connection_is_closed(served):
    _, port = served
    with socket.create_connection(("127.0.0.1", port)) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = closed_by_server(kept)
        assert answer is not None and answer.startswith(b"HTTP/1.1 200")
