"""A real control plane (uvicorn in a thread, as in tests/backend) with a finished tiny AdamW run
and a live tiny SOAP run, shared by the tests of one module; headless Chromium."""

from __future__ import annotations

import httpx
import pytest
import streamlit as st

from backend.settings import Settings
from tests.backend.conftest import TOKEN, LiveServer, free_port, paced_steps  # noqa: F401 (runs here pace too)
from tests.components import missing
from tests.dashboard.stack import chromium, tiny_run, wait_until


def start_run(http: httpx.Client, steps: int, **kw) -> str:
    r = http.post("/runs", json={"config": tiny_run(steps, **kw)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def wait_status(http: httpx.Client, run_id: str, *statuses: str) -> dict:
    return wait_until(lambda: (r := http.get(f"/runs/{run_id}").json())["status"] in statuses
                      and r, 120, what=f"run {run_id} {' or '.join(statuses)}")


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's package, driven by Playwright), one per test module."""
    path, reason = chromium()
    if path is None:
        missing(reason)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        missing(f"playwright is not installed: {err}")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(path), headless=True)
        yield b
        b.close()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    settings = Settings(port=free_port(), data_dir=tmp_path_factory.mktemp("control-plane"),
                        token=TOKEN, start_default_run=False, store_flush_seconds=0.1)
    with LiveServer(settings) as live:
        yield live


@pytest.fixture
def fresh_api(tmp_path):
    """A control plane of its own with no run yet (its runs are stopped when it shuts down)."""
    settings = Settings(port=free_port(), data_dir=tmp_path / "fresh", token=TOKEN,
                        start_default_run=False, store_flush_seconds=0.1)
    with LiveServer(settings) as live:
        yield live


@pytest.fixture(scope="module")
def http(api):
    with httpx.Client(base_url=api.url, timeout=30,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        yield client


@pytest.fixture(scope="module")
def finished_run(http) -> str:
    """120 steps, with one policy change (staleness_bound 10 -> 4) applied early on."""
    run_id = start_run(http, 120, eval_interval=40)
    assert http.patch(f"/runs/{run_id}/policy", json={"staleness_bound": 4}).status_code == 200
    wait_status(http, run_id, "finished")
    wait_until(lambda: len(http.get(f"/runs/{run_id}/steps").json()["steps"]) == 120,
               what="all step records stored")
    return run_id


@pytest.fixture(scope="module")
def live_run(http, finished_run) -> str:
    """A SOAP run (refresh engine on a worker) that trains until the module ends, then stops."""
    run_id = start_run(http, 10_000_000, eval_interval=100, optim="soap")
    wait_until(lambda: http.get(f"/runs/{run_id}/steps").json()["steps"], what="first steps")
    yield run_id
    http.post(f"/runs/{run_id}/stop")
    wait_status(http, run_id, "stopped", "finished", "failed")


@pytest.fixture
def dashboard_env(api, monkeypatch):
    """The dashboard's settings for AppTest, and no cached reads left from another test."""
    monkeypatch.setenv("ASTERIA_URL", api.url)
    monkeypatch.setenv("ASTERIA_TOKEN", TOKEN)
    st.cache_data.clear()
    yield
    st.cache_data.clear()
