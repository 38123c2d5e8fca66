"""`streamlit run dashboard/app.py` as the README gives it, with no address: the dashboard's own
config binds it to loopback, on IPv4 and IPv6 alike; an explicit --server.address still wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backend.conftest import free_port
from tests.dashboard.stack import APP, answers, wait_until

LISTEN = "0A"
LOOPBACK = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1 as /proc shows them


def listening(port: int) -> set[str]:
    """The local addresses of the sockets listening on `port` (hex, as /proc/net shows them)."""
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == LISTEN:
                found.add(address)
    return found


@pytest.mark.parametrize("address", [None, "0.0.0.0"])
def test_the_dashboard_listens_on_loopback_unless_told_otherwise(tmp_path, address):
    port = free_port()
    argv = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
            "--server.port", str(port), "--server.fileWatcherType", "none"]
    if address:
        argv += ["--server.address", address]
    env = dict(os.environ, ASTERIA_URL="http://127.0.0.1:9")
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: answers(f"http://127.0.0.1:{port}/_stcore/health", "ok"), 120, 0.2,
                   "streamlit health")
        bound = listening(port)
        if address is None:
            assert bound and bound <= LOOPBACK, bound
        else:
            assert "00000000" in bound, bound
    finally:
        proc.terminate()
        proc.wait(30)
