"""The control plane's commands in the `asteria` table (asteria/cli.py): `start`, `serve`, and
`train --control-port`, which attaches the control plane to a run. The web stack loads only when
one of them runs, so `asteria train` costs what the core's `train` costs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from asteria_core import cli as core
from asteria_core.train.command import serve_metrics, train_command
from asteria_core.train.config import RunConfig

# The product's default run (`asteria start` / `asteria serve`): SOAP with its refresh off the
# critical path, long enough to watch and steer, with periodic checkpoints. On a machine without
# a measured energy source the energy figures are a labelled estimate (CPU seconds x 15 W).
# A config file or an override changes any of it (e.g. --optim.name adamw).
SERVED_RUN: dict[str, dict[str, Any]] = {
    "optim": {"name": "soap", "lr": 1e-2},
    "policy": {"workers": 1},
    "train": {"steps": 3000, "checkpoint_interval": 100},
    "telemetry": {"model_cpu_watts": 15.0},
}


def cmd_start(config: RunConfig, args: argparse.Namespace) -> int:
    from backend.launch import NEWEST, start

    if args.resume is not None and config != core.resolve_config(None, [], SERVED_RUN):
        print("asteria: config error: --resume continues a run with the config it was started "
              "with; allowed: no --config and no overrides with --resume", file=sys.stderr)
        return 2
    resume = None if args.resume is None else args.resume or NEWEST
    return start(config, progress=not args.no_progress, resume=resume)


def cmd_serve(config: RunConfig, args: argparse.Namespace) -> int:
    import uvicorn

    from backend.app import create_app
    from backend.serving import uvicorn_config
    from backend.settings import Settings

    overrides = {"host": args.host, "port": args.port, "data_dir": args.data_dir}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None},
                        start_default_run=not args.no_default_run)
    app = create_app(settings, default_config=config)
    if not args.no_banner:
        print(f"asteria: control plane on http://{settings.host}:{settings.port} "
              f"(API docs at /docs, metrics at /metrics)", flush=True)
    uvicorn.Server(uvicorn_config(app, settings, workers=1, log_level="warning")).run()
    return 0


def cmd_train(config: RunConfig, args: argparse.Namespace) -> int:
    """The core's `train`; with --control-port also the control plane, attached to the run
    (rank 0's in a data-parallel run: its PATCHes reach every rank at one step, its stop stops
    every rank, its /metrics is rank 0's), and every other rank's /metrics for Prometheus
    (serve_rank_metrics, on --metrics-port + rank or any free port, its file_sd target in
    DATA_DIR/targets)."""
    if args.control_port is None:
        return train_command(config, args)
    return train_command(config, args, serve=lambda trainer: _serve_run(trainer, args))


def _serve_run(trainer, args: argparse.Namespace):
    from asteria_core.distributed import serve_rank_metrics
    from backend.settings import Settings

    overrides = {"host": args.control_host, "port": args.control_port,
                 "data_dir": args.data_dir}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None})
    telemetry, ranks = trainer.config.telemetry, trainer.ranks
    targets = settings.data_dir / "targets"
    if ranks.rank > 0:  # prints nothing: rank 0 says where the ranks' /metrics are
        if trainer.telemetry is not None:
            serve_rank_metrics(trainer.telemetry, ranks.rank, host=telemetry.metrics_host,
                               base_port=telemetry.metrics_port, targets_dir=targets)
        return None
    from backend.attach import serve

    if not ranks.parallel:
        serve_metrics(trainer)  # --metrics-port too, as without the control plane
    try:
        plane = serve(trainer.runtime, settings=settings, total_steps=trainer.config.train.steps)
    except RuntimeError as err:
        raise RuntimeError(f"cannot serve the control plane: {err}") from err
    print(f"asteria: control plane on {plane.url} (API docs at /docs; token in "
          f"{settings.resolved_token_file})", flush=True)
    if ranks.parallel and trainer.telemetry is not None:
        base = telemetry.metrics_port
        where = f"port {base} + r" if base else f"a free port each (listed in {targets})"
        print(f"asteria: /metrics of rank 0 at {plane.url}/metrics, of rank r > 0 on "
              f"{telemetry.metrics_host}, {where}", flush=True)
    return plane.close


def add_start(sub) -> None:
    start = core.add_parser(sub, "start", "start the product on the embedded default corpus: "
                                          "the control plane training the default run, and the "
                                          "dashboard")
    core.add_run_arguments(start, base=SERVED_RUN)
    start.add_argument("--resume", nargs="?", const="", metavar="RUN",
                       help="continue a stopped, interrupted or failed run from its checkpoint "
                            "(RUN: its id; default: the newest such run in the data folder), "
                            "with the config it was started with, instead of a new run")


def add_control_arguments(train: argparse.ArgumentParser) -> None:
    """The core's `train` parser gets the control plane's options."""
    train.add_argument("--control-port", type=int, metavar="PORT",
                       help="also serve the control plane on PORT (0: any free port), attached "
                            "to this run, with its /metrics; under torchrun on rank 0, while "
                            "every other rank serves its /metrics (on --metrics-port + rank, or "
                            "any free port)")
    train.add_argument("--control-host", metavar="HOST",
                       help="address for --control-port (default 127.0.0.1, or ASTERIA_HOST)")
    train.add_argument("--data-dir", help="the control plane's run store and token, and the "
                                          "ranks' Prometheus targets (default asteria-data)")


def add_serve(sub) -> None:
    serve = core.add_parser(sub, "serve", "start the control plane (and a default run)")
    serve.epilog = core.overrides_help(SERVED_RUN)
    serve.add_argument("--config", help="config of the default run (TOML or YAML)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1, or ASTERIA_HOST)")
    serve.add_argument("--port", type=int, help="port (default 8000, or ASTERIA_PORT)")
    serve.add_argument("--data-dir", help="run store, runs and token (default asteria-data)")
    serve.add_argument("--no-default-run", action="store_true",
                       help="start no run; start one with POST /runs")
    serve.add_argument("--no-banner", action="store_true",
                       help="print no address line (`asteria start` prints its own)")
