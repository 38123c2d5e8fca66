"""`asteria start`'s port check: a port whose last connection sits in TIME_WAIT (right after a
Ctrl-C stopped the stack) is free, as uvicorn and Streamlit (SO_REUSEADDR) find it; a port that
something listens on is in use. Real sockets on loopback."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from backend.launch import _port_free

TIME_WAIT = "06"  # the state's code in /proc/net/tcp


def tcp_states(port: int) -> set[str]:
    """The states of every IPv4 TCP socket whose local port is `port`."""
    states = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rsplit(":", 1)[1], 16) == port:
            states.add(fields[3])
    return states


def listener(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening socket as a server binds it (uvicorn, Streamlit: SO_REUSEADDR)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port))
    s.listen()
    return s


def left_in_time_wait() -> int:
    """A port nothing listens on whose server side of a connection is in TIME_WAIT: a server
    accepted a connection and closed it first, then stopped listening (a stopped control plane
    after the launcher's last poll)."""
    server = listener()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server closes first: its side goes to TIME_WAIT
    assert client.recv(1) == b""  # the client has the server's FIN
    client.close()
    server.close()
    deadline = time.monotonic() + 10
    while TIME_WAIT not in tcp_states(port):
        assert time.monotonic() < deadline, f"port {port} never reached TIME_WAIT"
        time.sleep(0.01)
    return port


def test_a_port_in_time_wait_is_free():
    port = left_in_time_wait()
    assert _port_free("127.0.0.1", port)
    assert TIME_WAIT in tcp_states(port)  # still there when probed: the probe saw it


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_a_port_listened_on_is_in_use(host):
    with listener(host) as busy:
        port = busy.getsockname()[1]
        assert not _port_free("127.0.0.1", port)
        assert not _port_free("0.0.0.0", port)


def test_a_listener_without_reuseaddr_still_counts():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert not _port_free("127.0.0.1", busy.getsockname()[1])
