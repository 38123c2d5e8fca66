"""`asteria start`: the control plane (training the default run) and the dashboard, together.

    asteria start                                   # control plane :8000, dashboard :8501
    ASTERIA_PORT=8100 ASTERIA_DASHBOARD_PORT=8600 asteria start --train.steps 2000
    asteria start --resume                          # continue the newest stopped run

Two child processes, each in a session of its own so that a terminal's Ctrl-C reaches only this
launcher, which then stops them in order:

    python -m asteria serve --config <data_dir>/start-config.toml --host H --port P ...
    python -m streamlit run dashboard/app.py --server.headless true --server.address 127.0.0.1 ...

It waits until both answer, prints both URLs (once: the control plane's own line is turned off),
then the active run's progress line (step, loss, tokens/s, step time: `asteria train`'s bar, drawn
from the step records the control plane serves), and on SIGINT or SIGTERM stops the dashboard and
the control plane (which stops the run at a step boundary and keeps a checkpoint) and says how to
continue it; a child that has not exited after its grace period, or after a second Ctrl-C, is
killed with its process group. If either child dies, the other is stopped too and the exit status
is 1. On Linux each child also gets SIGTERM if the launcher itself dies, so no process outlives it.

With `resume` (`asteria start --resume`) the control plane starts no run of its own; the launcher
resumes one from its checkpoint through the API (POST /runs/{id}/resume): the run named, or the
newest stopped, interrupted or failed one.

Settings come from the environment like the control plane's (ASTERIA_HOST, ASTERIA_PORT,
ASTERIA_DATA_DIR, ASTERIA_TOKEN), plus ASTERIA_DASHBOARD_PORT (default 8501).
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import httpx

from asteria_core.cli import to_toml
from asteria_core.train.checkpoint import CHECKPOINT_NAME
from asteria_core.train.config import RunConfig
from asteria_core.train.progress import progress_bar, progress_figures
from backend.run_states import ACTIVE, RESUMABLE
from backend.settings import Settings

if TYPE_CHECKING:
    from tqdm import tqdm

DASHBOARD_PORT = 8501
READY_SECONDS = 180.0
GRACE_SECONDS = {"dashboard": 10.0, "control plane": 90.0}
PR_SET_PDEATHSIG = 1
NEWEST = ""
"""`resume=NEWEST`: the newest run that can be resumed."""
RESUME_HINT = "asteria start --resume"


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the launcher dies (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _port_free(host: str, port: int) -> bool:
    """Whether a server can listen on host:port now. Probed with SO_REUSEADDR, as uvicorn and
    Streamlit bind: a port whose last connections sit in TIME_WAIT (right after a Ctrl-C) is
    free to them, while one that something listens on is refused all the same."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _dashboard_script() -> Path:
    spec = importlib.util.find_spec("dashboard")  # locates the package without importing it
    if spec is None or spec.origin is None:
        raise FileNotFoundError("the dashboard package is not installed next to asteria")
    return Path(spec.origin).parent / "app.py"


class Child:
    """A child process in its own session, stoppable with its whole process group."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path,
                 log: Path | None = None) -> None:
        self.name = name
        self.log = log
        out = log.open("w") if log else None
        preexec = _die_with_parent if sys.platform.startswith("linux") else None
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=out,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=preexec)
        if out:
            out.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace: float, hurry: threading.Event) -> None:
        """SIGTERM, wait up to `grace` s (less if `hurry` is set), then SIGKILL the group."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline and not hurry.is_set():
            time.sleep(0.1)
        self.signal(signal.SIGKILL)  # also reaps any grandchild left in the group
        self.proc.wait()

    def tail(self, lines: int = 15) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


class Progress:
    """The active run's progress line, from the control plane's step records (anonymous GETs,
    what the dashboard reads); a new bar for each run, none while no run is active. A bar is
    drawn at its run's first new step, so the lines the run logs as it starts (the control
    plane's own, on the same terminal) stand above it instead of inside it."""

    def __init__(self, api: str, data_dir: Path | None = None, draw: bool = True,
                 started: float | None = None) -> None:
        """`started`: when this launch began (a run created since is its own, and is
        announced even if it ended before the first poll); default now."""
        self.api, self.since, self.total = api, 0, 0
        self.run: str | None = None
        self.bar: tqdm[NoReturn] | None = None
        self.draw = draw
        """False (--no-progress): no bar, but a run's end is still announced."""
        self.data_dir, self.loss = data_dir, None
        self.started = time.time() if started is None else started
        self.seen = False

    def poll(self) -> None:
        try:
            run = httpx.get(f"{self.api}/healthz", timeout=2.0).json()["active_run"]
            if self.run is not None:
                self._advance()  # also the last steps of a run that has just ended
            if run is None and not self.seen:
                self._ended_before_first_poll()
            if run != self.run:
                ended = self.run
                self.close()
                if ended is not None:
                    self._announce_end(ended)
                if run is not None:
                    info = httpx.get(f"{self.api}/runs/{run}", timeout=2.0).json()
                    # from its newest record on: a run first seen after its last step (writing
                    # its final checkpoint) still has a loss to show
                    self.run, self.total = run, info["total_steps"]
                    self.since = max(info["step"] - 1, 0)
                    self.seen = True
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            pass  # tried again at the next poll; a child that died is noticed by the caller

    def _advance(self) -> None:
        page = httpx.get(f"{self.api}/runs/{self.run}/steps", params={"since": self.since},
                         timeout=2.0).json()
        if page["steps"]:
            last = page["steps"][-1]
            self.loss = last["loss"]
            if not self.draw:
                self.since = page["next_since"]
                return
            if self.bar is None:
                self.bar = progress_bar(self.since, self.total)
            self.bar.update(page["next_since"] - self.since)
            self.bar.set_postfix(progress_figures(last["loss"], last["tokens"],
                                                  last["step_seconds"], last.get("eval_loss")))
            self.since = page["next_since"]

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        self.run, self.bar = None, None

    def _ended_before_first_poll(self) -> None:
        """A run started by this launch that ended before the first poll saw it (a short
        one, while the dashboard was starting) is announced all the same."""
        runs = httpx.get(f"{self.api}/runs", timeout=2.0).json()
        self.seen = True
        if runs and runs[0]["created_at"] >= self.started and runs[0]["status"] not in ACTIVE:
            self._announce_end(runs[0]["id"], unseen=True)

    def _announce_end(self, run_id: str, unseen: bool = False) -> None:
        """The run has ended: say how, where its records and checkpoint are, and what now.
        `unseen`: it ended before any poll saw it (a short run, while the dashboard was
        starting): its whole line is drawn at once, with its last step's figures."""
        info = httpx.get(f"{self.api}/runs/{run_id}", timeout=2.0).json()
        if unseen and info["step"] > 0:
            page = httpx.get(f"{self.api}/runs/{run_id}/steps",
                             params={"since": info["step"] - 1}, timeout=2.0).json()
            last = page["steps"][-1] if page["steps"] else None
            self.loss = None if last is None else last["loss"]
            if self.draw and last is not None:
                bar = progress_bar(0, info["total_steps"])
                bar.update(info["step"])
                bar.set_postfix(progress_figures(last["loss"], last["tokens"],
                                                 last["step_seconds"], last.get("eval_loss")))
                bar.close()
        print(ended_text(info, self.loss, self.data_dir), flush=True)
        self.loss = None


def ended_text(info: dict, loss: float | None, data_dir: Path | None) -> str:
    """What the terminal says when a run ends (`info`: GET /runs/{id})."""
    run_id, status = info["id"], info["status"]
    text = f"asteria: run {run_id} {status} at step {info['step']} of {info['total_steps']}"
    if loss is not None:
        text += f", final loss {loss:.4f}"
    if info.get("error"):
        text += f": {info['error']}"
    folder = data_dir / "runs" / run_id if data_dir is not None else None
    text += f"\nasteria: its step records are in the run store (GET /runs/{run_id}/steps" + \
        (f"; files in {folder}" if folder else "") + ")"
    if info.get("checkpoint_step") is not None:
        where = folder / CHECKPOINT_NAME if folder else "its run folder"
        text += f"; its checkpoint (step {info['checkpoint_step']}) is {where}"
    return text + ("\nasteria: the control plane and the dashboard stay up to view it; "
                   "Ctrl-C exits")


def _wait_ready(child: Child, url: str, ok: Callable[[httpx.Response], bool],
                stop: threading.Event) -> bool:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline and not stop.is_set():
        if not child.alive():
            return False
        try:
            if ok(httpx.get(url, timeout=2.0)):
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def start(config: RunConfig, settings: Settings | None = None,
          dashboard_port: int | None = None, progress: bool = True,
          resume: str | None = None) -> int:
    """Run the stack until SIGINT/SIGTERM or until a child dies; returns the exit status.
    `resume`: None trains `config` as a new run; NEWEST or a run id resumes that run from its
    checkpoint instead, with the config it was started with."""
    settings = settings or Settings()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per readiness poll
    port = dashboard_port or int(os.environ.get("ASTERIA_DASHBOARD_PORT", DASHBOARD_PORT))
    for what, host, p, var in (("control plane", settings.host, settings.port, "ASTERIA_PORT"),
                               ("dashboard", "127.0.0.1", port, "ASTERIA_DASHBOARD_PORT")):
        if not _port_free(host, p):
            print(f"asteria: port {p} for the {what} is in use; set {var} to a free port",
                  file=sys.stderr)
            return 1
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    config_path = data_dir / "start-config.toml"
    config_path.write_text(to_toml(config))
    api_host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    api = f"http://{api_host}:{settings.port}"
    ui = f"http://127.0.0.1:{port}"

    stop, hurry = threading.Event(), threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        (hurry if stop.is_set() else stop).set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    children: list[Child] = []
    try:
        return _run(settings, config_path, data_dir, api, ui, port, children, stop, progress,
                    resume)
    finally:
        stopping = _active_run(api) if children and children[0].alive() else None
        if children and stopping:
            print("asteria: stopping the dashboard and the control plane (the run stops at "
                  "its next step boundary and keeps a checkpoint)...", flush=True)
        elif children:
            print("asteria: exiting: no run is training; stopping the dashboard and the "
                  "control plane...", flush=True)
        for child in reversed(children):
            child.stop(GRACE_SECONDS[child.name], hurry)
        if children:
            print("asteria: stopped", flush=True)
        if stopping and (data_dir / "runs" / stopping / CHECKPOINT_NAME).is_file():
            print(f"asteria: run {stopping} keeps its checkpoint; continue it with "
                  f"`{RESUME_HINT}`", flush=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(settings: Settings, config_path: Path, data_dir: Path, api: str, ui: str, port: int,
         children: list[Child], stop: threading.Event, progress: bool,
         resume: str | None) -> int:
    began = time.time()  # the default run may start and end before the dashboard is up
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cwd = _dashboard_script().parent.parent
    argv = [sys.executable, "-m", "asteria", "serve", "--config", str(config_path),
            "--host", settings.host, "--port", str(settings.port), "--data-dir", str(data_dir),
            "--no-banner"]  # its address is printed below, with ours
    if resume is not None:
        argv.append("--no-default-run")  # the run to resume is started below, through the API
    serve_env = {"ASTERIA_DASHBOARD_URL": ui, **env}  # linked from its landing page at /
    serve = Child("control plane", argv, serve_env, cwd)
    children.append(serve)
    if not _wait_ready(serve, f"{api}/healthz", lambda r: r.status_code == 200, stop):
        return _failed(serve, stop)
    token_file = settings.token_file or data_dir / "token"
    if resume is not None and not _resume(api, settings.token or _read_token(cwd / token_file),
                                          resume, data_dir):
        return 1
    ui_env = dict(env, ASTERIA_URL=api, ASTERIA_DATA_DIR=str(data_dir))
    if not settings.token:
        ui_env["ASTERIA_TOKEN_FILE"] = str(token_file)
    dash = Child("dashboard", [sys.executable, "-m", "streamlit", "run",
                               str(_dashboard_script()), "--server.headless", "true",
                               "--server.address", "127.0.0.1", "--server.port", str(port),
                               "--browser.gatherUsageStats", "false",
                               "--server.fileWatcherType", "none"],
                 ui_env, cwd, log=data_dir / "dashboard.log")
    children.append(dash)
    if not _wait_ready(dash, f"{ui}/_stcore/health", lambda r: r.text.strip() == "ok", stop):
        return _failed(dash, stop)
    print(f"asteria: control plane  {api}  (API docs {api}/docs, metrics {api}/metrics)\n"
          f"asteria: dashboard      {ui}\n"
          "asteria: Ctrl-C stops both", flush=True)
    line = Progress(api, data_dir, draw=progress, started=began)
    try:
        while not stop.is_set():
            for child in children:
                if not child.alive():
                    return _failed(child, stop)
            line.poll()
            stop.wait(0.5)
    finally:
        line.close()
    return 0


def _active_run(api: str) -> str | None:
    try:
        return httpx.get(f"{api}/healthz", timeout=2.0).json()["active_run"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def _read_token(path: Path) -> str:
    """The control plane's token, from the file it wrote at start-up (the child's working
    folder is `cwd`, so a relative path is taken from there, as the child did)."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""  # the resume request is then refused, and says so


def _resumable(row: dict) -> bool:
    """What RunManager.resume accepts: a launched run, stopped, interrupted or failed, with a
    checkpoint."""
    attached = row["config"].get("runtime", {}).get("attached")
    return row["status"] in RESUMABLE and row["checkpoint_step"] is not None and not attached


def _resume(api: str, token: str, wanted: str, data_dir: Path) -> bool:
    """Resume run `wanted` (NEWEST: the newest run that can be) from its checkpoint, through
    the API; prints which run and from which step, or why not."""
    auth = {"Authorization": f"Bearer {token}"}
    try:
        if wanted == NEWEST:
            runs = [r for r in httpx.get(f"{api}/runs", headers=auth, timeout=30.0).json()
                    if _resumable(r)]
            if not runs:
                print(f"asteria: no run in {data_dir} to resume (a stopped, interrupted or "
                      "failed run with a checkpoint); `asteria start` starts a new one",
                      file=sys.stderr)
                return False
            wanted = runs[0]["id"]
        answer = httpx.post(f"{api}/runs/{wanted}/resume", headers=auth, timeout=60.0)
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
        print(f"asteria: cannot resume a run: {err}", file=sys.stderr)
        return False
    if answer.status_code != 202:
        print(f"asteria: cannot resume run {wanted}: {_detail(answer)}", file=sys.stderr)
        return False
    run = answer.json()["run"]
    print(f"asteria: resuming run {wanted} from its checkpoint at step {run['checkpoint_step']} "
          f"(of {run['total_steps']})", flush=True)
    return True


def _detail(answer: httpx.Response) -> str:
    try:
        return str(answer.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {answer.status_code}"


def _failed(child: Child, stop: threading.Event) -> int:
    if stop.is_set():
        return 0  # asked to stop while starting
    state = "did not become ready" if child.alive() else \
        f"exited with status {child.proc.returncode}"
    print(f"asteria: the {child.name} {state}.", file=sys.stderr)
    tail = child.tail()
    if tail:
        print(f"asteria: last lines of {child.log}:\n{tail}", file=sys.stderr)
    return 1
