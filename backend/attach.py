"""`serve(runtime)`: the control plane for a run that a user's own script trains.

    import asteria_core as asteria
    import backend

    opt = asteria.optimizer(model, "soap")
    plane = backend.serve(opt.runtime, port=8000)   # same app, auth, store, /metrics, SSE
    ...                                             # train as usual
    opt.runtime.close(); plane.close()

The FastAPI app runs in a background thread of the script's process (uvicorn installs no
signal handlers off the main thread, so Ctrl-C still reaches the script). The runtime is the
active run: its step records go to the run store and live clients, a policy PATCH is applied at
its next step boundary, pause blocks the loop between steps and stop sets
`runtime.stop_requested`. Starting runs, and checkpointing or resuming one, answer 409.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from asteria_core.runtime import Runtime
from backend.app import create_app
from backend.serving import uvicorn_config
from backend.settings import Settings

START_SECONDS = 30.0


@dataclass
class ControlPlane:
    """A running control plane; `close()` stops it (the run is marked finished or stopped)."""

    url: str
    token: str
    server: uvicorn.Server
    thread: threading.Thread

    def close(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve(runtime: Runtime, *, host: str | None = None, port: int | None = None,
          data_dir: str | Path | None = None, total_steps: int = 0,
          settings: Settings | None = None) -> ControlPlane:
    """Start the control plane attached to `runtime`; returns once it answers. Settings come
    from the environment (ASTERIA_*) like `asteria serve`'s; `host`, `port` and `data_dir`
    override them (port 0 picks a free port). `total_steps` is shown as the run's length."""
    overrides: dict[str, Any] = {"host": host, "port": port, "data_dir": data_dir}
    settings = settings or Settings(**{k: v for k, v in overrides.items() if v is not None})
    settings = settings.model_copy(update={"start_default_run": False})
    app = create_app(settings, attach=runtime, total_steps=total_steps)
    server = uvicorn.Server(uvicorn_config(app, settings, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="asteria-control-plane", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_SECONDS
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the control plane did not start on {settings.host}:"
                               f"{settings.port} (is the port in use?)")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    shown = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    return ControlPlane(url=f"http://{shown}:{bound}", token=app.state.token, server=server,
                        thread=thread)
