"""The `asteria` command.

    asteria start                         # the product on the embedded default corpus
    asteria train --config run.toml --optim.lr 3e-3 --train.steps 200
    asteria config --config run.toml      # print the resolved config as TOML
    asteria train --metrics-port 9400     # also serve Prometheus /metrics while training
    asteria serve --port 8000             # the control plane, with a default run

Overrides are `--section.key value` (or `--section.key=value`) for any config key; an unknown
key or a bad value stops the command before anything is built, naming the key.
"""

from __future__ import annotations

import argparse
import logging
import sys

from asteria_core.train.config import ConfigError, RunConfig
from asteria_core.train.config_io import (
    build_config,
    config_to_dict,
    parse_overrides,
    read_config_file,
)


def _split_overrides(rest: list[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if not arg.startswith("--") or "." not in arg:
            raise ConfigError(f"unexpected argument {arg!r}; overrides look like "
                              "--section.key value (for example --optim.lr 3e-3)")
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(rest):
                raise ConfigError(f"{arg[2:]}: missing value after {arg}")
            key, value = arg[2:], rest[i + 1]
            i += 2
        pairs.append((key, value))
    return pairs


# The product's default run (`asteria start` / `asteria serve`): SOAP with its refresh off the
# critical path, long enough to watch and steer, with periodic checkpoints. On a machine without
# a measured energy source the energy figures are a labelled estimate (CPU seconds x 15 W).
# A config file or an override changes any of it (e.g. --optim.name adamw).
SERVED_RUN = {
    "optim": {"name": "soap", "lr": 1e-2},
    "policy": {"workers": 1},
    "train": {"steps": 3000, "checkpoint_interval": 100},
    "telemetry": {"model_cpu_watts": 15.0},
}


def resolve_config(config_path: str | None, rest: list[str],
                   base: dict | None = None) -> RunConfig:
    layers = [base] if base else []
    if config_path:
        layers.append(read_config_file(config_path))
    layers.append(parse_overrides(_split_overrides(rest)))
    return build_config(*layers)


def to_toml(config: RunConfig) -> str:
    def fmt(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, str):
            return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(value, list):
            return "[" + ", ".join(fmt(v) for v in value) + "]"
        return repr(value)

    lines = []
    for section, values in config_to_dict(config).items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {fmt(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def _cmd_train(config: RunConfig, args: argparse.Namespace) -> int:
    from asteria_core.refresh import RefreshFailed
    from asteria_core.train.trainer import Trainer

    trainer = Trainer(config)
    host, port = config.telemetry.metrics_host, config.telemetry.metrics_port
    if port and trainer.telemetry is not None:
        try:
            port = trainer.telemetry.serve(host, port)
        except OSError as err:
            trainer.close()
            print(f"asteria: cannot serve metrics on {host}:{port}: {err}", file=sys.stderr)
            return 1
        print(f"asteria: metrics at http://{host}:{port}/metrics", flush=True)
    n = trainer.model_params
    print(f"asteria: run {trainer.run_id}: {n / 1e6:.2f}M parameters, optimizer "
          f"{config.optim.name}, {config.train.steps} steps on {trainer.device}; "
          f"writing {trainer.run_dir}", flush=True)
    try:
        result = trainer.train(progress=not args.no_progress)
    except KeyboardInterrupt:
        print(f"\nasteria: interrupted at step {trainer.step}; checkpoint saved in "
              f"{trainer.run_dir}", file=sys.stderr)
        return 130
    except RefreshFailed as err:
        print(f"asteria: run stopped at step {trainer.step}: {err}; checkpoint saved in "
              f"{trainer.run_dir}", file=sys.stderr)
        return 1
    finally:
        trainer.close()
    if result.eval_losses:
        last_step = max(result.eval_losses)
        print(f"asteria: done at step {result.step}; validation loss "
              f"{result.eval_losses[last_step]:.4f} (step {last_step}); checkpoint "
              f"{result.run_dir / 'checkpoint.pt'}")
    return 0


def _cmd_serve(config: RunConfig, args: argparse.Namespace) -> int:
    # Imported here: asteria_core never imports the control plane at module level.
    import uvicorn

    from backend.app import create_app
    from backend.settings import Settings

    overrides = {"host": args.host, "port": args.port, "data_dir": args.data_dir}
    settings = Settings(**{k: v for k, v in overrides.items() if v is not None},
                        start_default_run=not args.no_default_run)
    app = create_app(settings, default_config=config)
    print(f"asteria: control plane on http://{settings.host}:{settings.port} "
          f"(API docs at /docs, metrics at /metrics)", flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, workers=1, log_level="warning")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asteria", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("start", "start the product on the embedded default corpus"),
        ("train", "train a GPT from a config file and overrides"),
        ("config", "print the resolved config as TOML"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--config", help="a TOML or YAML config file")
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("--metrics-port", type=int, metavar="PORT",
                       help="serve Prometheus /metrics on PORT while training "
                            "(same as --telemetry.metrics_port)")
        p.add_argument("--metrics-host", metavar="HOST",
                       help="address for --metrics-port, default 127.0.0.1 "
                            "(same as --telemetry.metrics_host)")
    serve = sub.add_parser("serve", help="start the control plane (and a default run)")
    serve.add_argument("--config", help="config of the default run (TOML or YAML)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1, or ASTERIA_HOST)")
    serve.add_argument("--port", type=int, help="port (default 8000, or ASTERIA_PORT)")
    serve.add_argument("--data-dir", help="run store, runs and token (default asteria-data)")
    serve.add_argument("--no-default-run", action="store_true",
                       help="start no run; start one with POST /runs")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args, rest = build_parser().parse_known_args(argv)
    for flag, key in (("metrics_port", "telemetry.metrics_port"),
                      ("metrics_host", "telemetry.metrics_host")):
        if getattr(args, flag, None) is not None:
            rest += [f"--{key}", str(getattr(args, flag))]
    try:
        base = SERVED_RUN if args.command in ("start", "serve") else None
        config = resolve_config(args.config, rest, base)
    except ConfigError as err:
        print(f"asteria: config error: {err}", file=sys.stderr)
        return 2
    match args.command:
        case "config":
            print(to_toml(config), end="")
            return 0
        case "start":
            from backend.launch import start  # here: asteria_core never imports backend at load

            return start(config)
        case "train":
            return _cmd_train(config, args)
        case "serve":
            return _cmd_serve(config, args)
        case _:
            raise NotImplementedError(args.command)


if __name__ == "__main__":
    sys.exit(main())
