"""Real parts for dashboard tests and screenshots: a control plane with tiny runs, a
`streamlit run` of the dashboard, and headless Chromium (Debian's package, via Playwright).

Chromium: when /usr/bin/chromium is missing and we are root on a Debian-like system, it is
installed with apt-get (once). When it cannot be had the caller skips with the reason, except
under CI=true, where a missing component fails.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests import apt

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboard" / "app.py"
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"
# Hang guards, not speed checks: the page answers in a second or two, but a machine loaded by
# the rest of the suite (torchrun groups, disk-tier writes) has stalled it for over 30 s.
HANG_GUARD_S = 180
HANG_GUARD_MS = HANG_GUARD_S * 1000


def tiny_run(steps: int, *, eval_interval: int = 50, watts: float = 15.0,
             optim: str = "adamw") -> dict:
    """A run config of tests/backend/conftest.py's TINY model, with a modelled energy estimate."""
    from tests.backend.conftest import TINY

    config = copy.deepcopy(TINY)
    config["train"].update(steps=steps, eval_interval=eval_interval)
    config["optim"] = {"name": optim}
    config["telemetry"] = {"model_cpu_watts": watts}
    return config


@contextmanager
def control_plane(prefix: str) -> Iterator[tuple[object, httpx.Client, Path]]:
    """For the scripts: a real control plane on a fresh data dir, a client holding the token,
    and that data dir (for logs)."""
    from backend.settings import Settings
    from tests.backend.conftest import TOKEN, LiveServer, free_port

    data = Path(tempfile.mkdtemp(prefix=prefix))
    settings = Settings(port=free_port(), data_dir=data, token=TOKEN, start_default_run=False,
                        store_flush_seconds=0.2)
    with LiveServer(settings) as api, httpx.Client(
            base_url=api.url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        yield api, http, data


def wait_until(predicate, timeout: float = HANG_GUARD_S, interval: float = 0.1,
               what: str = "condition"):
    """Poll until predicate() is truthy and return it; fail loudly on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout:.0f} s")
        time.sleep(interval)


def answers(url: str, body: str | None = None) -> bool:
    try:
        r = httpx.get(url, timeout=2.0)
    except httpx.HTTPError:
        return False
    return r.status_code == 200 and (body is None or r.text.strip() == body)


class Dashboard:
    """`python -m streamlit run dashboard/app.py` on `port`, pointed at a control plane."""

    def __init__(self, port: int, api_url: str, token: str, log: Path, **env_extra: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        env = dict(os.environ, ASTERIA_URL=api_url, ASTERIA_TOKEN=token, **env_extra)
        self._out = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(APP), "--server.headless", "true",
             "--server.address", "127.0.0.1", "--server.port", str(port),
             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
            cwd=ROOT, env=env, stdout=self._out, stderr=subprocess.STDOUT)

    def __enter__(self) -> Dashboard:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"streamlit exited: {self.log.read_text()[-2000:]}")
            return answers(f"{self.url}/_stcore/health", "ok")
        wait_until(ready, 60, 0.2, "streamlit health")
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._out.close()


def sign_in(page, token: str) -> None:
    """Sign a browser session in to the dashboard (the sidebar's form), as an operator would."""
    page.get_by_label("Sign-in token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("button", name="Sign out").wait_for(timeout=HANG_GUARD_MS)


def chromium() -> tuple[Path | None, str]:
    """(path, "") when Chromium is there or could be installed; (None, reason) otherwise."""
    if CHROMIUM.exists():
        return CHROMIUM, ""
    if not apt.can_install():
        return None, f"{CHROMIUM} is missing and cannot be installed (needs root and apt-get)"
    failed = apt.install("chromium", "fonts-liberation")
    if failed:
        return None, failed
    if not CHROMIUM.exists():
        return None, f"apt-get installed chromium but {CHROMIUM} is still missing"
    return CHROMIUM, ""


class Start:
    """`python -m asteria start ARGS` (what `asteria start` runs) on given ports and data
    folder, its output collected as it comes."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "asteria", "start", *args],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def ready(self) -> None:
        wait_until(lambda: "Ctrl-C stops both" in self.output or self.proc.poll() is not None,
                   240, 0.2, "asteria start to be ready")
        assert self.proc.poll() is None, self.output

    def finish(self) -> int:
        try:
            return self.proc.wait(180)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.reader.join(10)

    def interrupt(self) -> int:
        """Ctrl-C, and the exit status."""
        self.proc.send_signal(signal.SIGINT)
        return self.finish()
