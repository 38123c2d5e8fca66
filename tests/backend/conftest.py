"""A real control plane on a free loopback port (uvicorn in a thread), and an httpx client."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

from asteria_core.train.data import BatchLoader
from backend.app import create_app
from backend.serving import uvicorn_config
from backend.settings import Settings

TOKEN = "test-token-123"
HANG_GUARD = 120.0
"""Seconds before a wait is taken for a hang: generous, for a machine loaded at ~10."""
PACE_SECONDS = 0.005
"""The pause before each batch of a run trained in the test process (`paced_steps`)."""
TINY = {
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 32},
    "data": {"batch_size": 4},
    "train": {"steps": 100000, "eval_interval": 1000, "eval_batches": 2, "threads": 1},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.url = f"http://127.0.0.1:{settings.port}"
        config = uvicorn_config(create_app(settings), settings, log_level="warning", workers=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + HANG_GUARD
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(60)


@pytest.fixture
def server_factory(tmp_path):
    def make(**overrides) -> LiveServer:
        kw = {"port": free_port(), "data_dir": tmp_path / "data", "token": TOKEN,
              "start_default_run": False, "store_flush_seconds": 0.1}
        kw.update(overrides)
        return LiveServer(Settings(**kw))
    return make


@pytest.fixture
def server(server_factory):
    with server_factory() as live:
        yield live


@pytest.fixture
def client(server):
    with httpx.Client(base_url=server.url, timeout=HANG_GUARD,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def wait_for(predicate, timeout: float = HANG_GUARD, interval: float = 0.05):
    """Poll until predicate() is truthy and return it; fail loudly on timeout (a hang guard:
    the wait ends on the behaviour, the bound only on a hang)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(interval)


@pytest.fixture(scope="module", autouse=True)
def paced_steps():
    """Runs started here train in a thread of the test's own process, beside the server's
    threads. The tiny model's step is ~2 ms of Python that holds the GIL nearly throughout, so
    a run left training starves the request handlers and the test itself (a test waiting on a
    response waits for GIL hand-offs, not for work). A 5 ms pause before each batch, as a slow
    input pipeline would, gives the GIL back; what the tests check does not depend on the rate."""
    real = BatchLoader.next_batch

    def paced(self):
        time.sleep(PACE_SECONDS)
        return real(self)

    with pytest.MonkeyPatch.context() as patch:  # module-wide: module fixtures start runs too
        patch.setattr(BatchLoader, "next_batch", paced)
        yield
