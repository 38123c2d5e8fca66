"""The core commands of `asteria`: train a run and print its config, without the control plane.

    python -m asteria_core.cli train --config run.toml --optim.lr 3e-3 --train.steps 200
    python -m asteria_core.cli config --config run.toml      # the resolved config as TOML
    python -m asteria_core.cli train --metrics-port 9400     # also serve Prometheus /metrics
    python -m asteria_core.cli keys optim                    # every key: type, range, help
    python -m asteria_core.cli plan --optim.name soap --step-seconds 0.4   # workers, memory
    torchrun --nproc-per-node 2 -m asteria_core.cli train    # data-parallel (DDP), one run

Overrides are `--section.key value` (or `--section.key=value`) for any config key; an unknown
key or a bad value stops the command before anything is built, naming the key. Options are
matched whole: a mistyped one is an error, never taken for the option it abbreviates.

The `asteria` command (`backend.cli`) adds `serve` and `start`, which run the control plane and
the dashboard; this module imports nothing from them, so the core runs without the web stack.

Under torchrun (WORLD_SIZE > 1) `train` is one rank of a data-parallel run
(asteria_core/train/parallel.py): rank 0 prints the run's lines and log lines and draws the
progress bar (the other ranks print only warnings and errors), every rank checkpoints at one
step, and `--metrics-port PORT` serves rank r's /metrics on PORT + r. The `[runtime]` section
says how the ranks keep the optimizer state (`--runtime.distributed_state sharded`: each
parameter's on one rank). The run itself: asteria_core/train/command.py.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
import textwrap
from collections.abc import Callable, Mapping
from typing import Any

from asteria_core.torchrun import Ranks
from asteria_core.train.command import train_command
from asteria_core.train.config import ConfigError, RunConfig
from asteria_core.train.config_docs import describe_keys, section_summary
from asteria_core.train.config_io import (
    build_config,
    config_to_dict,
    parse_overrides,
    read_config_file,
    sections,
)


class UnknownOption(ConfigError):
    """A command-line option that is neither the command's nor a config override."""


def _split_overrides(rest: list[str]) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg.startswith("-") and "." not in arg.split("=", 1)[0]:
            raise UnknownOption(arg.split("=", 1)[0])
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


def resolve_config(config_path: str | None, rest: list[str],
                   base: dict | None = None) -> RunConfig:
    layers = [base] if base else []
    if config_path:
        layers.append(read_config_file(config_path))
    layers.append(parse_overrides(_split_overrides(rest)))
    return build_config(*layers)


def toml_value(value: object) -> str:
    """A config value as a TOML file writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def to_toml(config: RunConfig) -> str:
    lines = []
    for section, values in config_to_dict(config).items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in values.items())
        lines.append("")
    return "\n".join(lines)


def _cmd_config(config: RunConfig, args: argparse.Namespace) -> int:
    print(to_toml(config), end="")
    return 0


def _cmd_keys(config: RunConfig, args: argparse.Namespace) -> int:
    known = sections()
    for name in args.sections:
        if name not in known:
            print(f"asteria: keys: unknown section {name!r}; allowed: {', '.join(known)}",
                  file=sys.stderr)
            return 2
    keys = describe_keys()
    for section in args.sections or known:
        print(f"[{section}]  {section_summary(known[section])}")
        for doc in (k for k in keys if k.key.startswith(section + ".")):
            allowed = doc.allowed if doc.allowed.startswith(doc.type) else \
                f"{doc.type}; allowed: {doc.allowed}"
            print(f"  {doc.key}  {allowed}; default {toml_value(doc.default)}")
            print(textwrap.fill(doc.help, 100, initial_indent=" " * 6, subsequent_indent=" " * 6))
        print()
    return 0


class AboveTheBar(logging.StreamHandler):
    """Writes each log line above the progress bar (tqdm clears the bar, writes, redraws it),
    never into the middle of it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging's own rule: a failed line never raises
            self.handleError(record)


QUIET_LOGGERS = ("httpx", "httpcore")
"""Libraries that log every request at INFO (rank 0 scraping the ranks' /metrics each second):
routine, so only their warnings are shown."""


def _rank_from_env() -> int:
    """This process's rank under torchrun (0 outside torchrun, and when the environment is
    malformed: the run refuses that later, naming the variable)."""
    try:
        return Ranks.from_env().rank
    except ValueError:
        return 0


def configure_logging() -> None:
    """INFO lines above the progress bar; under torchrun only rank 0's, since every rank would
    log the same routine lines (energy sources, the target reached) into rank 0's progress line:
    ranks r > 0 show warnings and errors only."""
    handler = AboveTheBar()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    level = logging.INFO if _rank_from_env() == 0 else logging.WARNING
    logging.basicConfig(level=level, handlers=[handler])
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _cmd_plan(config: RunConfig, args: argparse.Namespace) -> int:
    """`asteria plan`: host workers and memory per tier for a run at the user's step time
    (asteria_core/train/plan.py)."""
    import json
    from pathlib import Path

    from asteria_core.policy import PolicyError
    from asteria_core.train.plan import plan_run, render
    from asteria_core.train.refresh_cost import default_cache_path

    calibration = None if args.no_cache else Path(args.calibration or default_cache_path())
    try:
        planned = plan_run(config, step_seconds=args.step_seconds, headroom=args.headroom,
                           calibration=calibration, recalibrate=args.recalibrate,
                           cap=args.measure_up_to)
    except (ConfigError, PolicyError) as err:
        print(f"asteria: config error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(planned.to_dict(), indent=1) if args.json else render(planned))
    return 0


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step-seconds", type=float, required=True, metavar="S",
                        help="seconds of one training step on your device (e.g. your GPU's "
                             "measured step), in (0, 86400]")
    parser.add_argument("--headroom", type=float, default=0.8,
                        help="the duty the recommended workers stay under, in (0, 1] "
                             "(default 0.8)")
    parser.add_argument("--calibration", metavar="FILE",
                        help="the refresh-cost measurements to use and extend (default "
                             "$XDG_CACHE_HOME/asteria/refresh-cost.json)")
    parser.add_argument("--measure-up-to", type=int, default=1024, metavar="B",
                        help="measure refreshes of block sides up to B, in [1, 65536] (default "
                             "1024); wider ones are extrapolated as b^3 and marked as estimates "
                             "(one 3072-wide refresh takes seconds on a core)")
    parser.add_argument("--recalibrate", action="store_true",
                        help="measure again, ignoring what the calibration file holds")
    parser.add_argument("--no-cache", action="store_true",
                        help="measure without reading or writing a calibration file")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")


Command = Callable[[RunConfig, argparse.Namespace], int]

# name: (help, handler), in the order `asteria --help` lists them.
COMMANDS: dict[str, tuple[str, Command]] = {
    "train": ("train a GPT from a config file and overrides", train_command),
    "config": ("print the resolved config as TOML", _cmd_config),
    "keys": ("print every config key: its type, allowed values, default and help", _cmd_keys),
    "plan": ("how many host refresh workers a run needs at your step time, and its memory "
             "per tier, from refresh costs measured on this host", _cmd_plan),
}


def overrides_help(base: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The epilog of a command that takes config overrides: how to write one, the sections,
    where every key is listed, and the command's own defaults (`base`) if it has any."""
    names = sections()
    width = max(map(len, names))
    lines = ["config overrides:",
             "  --SECTION.KEY VALUE (or --SECTION.KEY=VALUE) sets any config key, over the file",
             "  of --config; for example --optim.name soap --optim.lr 3e-3 --train.steps 2000.",
             "  sections:",
             *(f"    {name:<{width}}  {section_summary(cls)}" for name, cls in names.items()),
             "  `asteria keys` prints every key with its type, allowed values, default and help",
             "  (`asteria keys optim` prints one section)."]
    if base:
        flags = " ".join(f"--{section}.{key} {value}" for section, values in base.items()
                         for key, value in values.items())
        lines += ["", "this command's defaults, where they differ from `asteria train`'s:",
                  *textwrap.wrap(flags, 96, initial_indent="  ", subsequent_indent="  ")]
    return "\n".join(lines)


def add_parser(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    """A subcommand whose options are matched whole (argparse would take `--no-progres` for
    `--no-progress`; here it is an error, and so is anything else that is not an override)."""
    parser = sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.set_defaults(parser=parser)  # `run` names a mistyped option with its usage
    return parser


def add_run_arguments(parser: argparse.ArgumentParser,
                      base: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """The options of every command that resolves a run config (train, config, start), and the
    help on overrides."""
    parser.epilog = overrides_help(base)
    parser.add_argument("--config", help="a TOML or YAML config file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--metrics-port", type=int, metavar="PORT",
                        help="serve Prometheus /metrics on PORT while training "
                             "(same as --telemetry.metrics_port)")
    parser.add_argument("--metrics-host", metavar="HOST",
                        help="address for --metrics-port, default 127.0.0.1 "
                             "(same as --telemetry.metrics_host)")


def new_parser(description: str | None) -> tuple[argparse.ArgumentParser, Any]:
    """The `asteria` parser and its (required) subcommand set, for the core's and other
    commands."""
    parser = argparse.ArgumentParser(prog="asteria", description=description, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    return parser, parser.add_subparsers(dest="command", required=True)


def add_commands(sub: Any) -> None:
    """Add the core's commands (`COMMANDS`) to a subcommand set from `new_parser`."""
    for name, (help_text, _) in COMMANDS.items():
        parser = add_parser(sub, name, help_text)
        if name == "keys":
            parser.add_argument("sections", nargs="*", metavar="SECTION",
                                help="only these sections (default: all)")
        elif name == "plan":  # resolves a run config, but runs nothing
            parser.epilog = overrides_help(BASES["plan"])
            parser.add_argument("--config", help="a TOML or YAML config file")
            add_plan_arguments(parser)
        else:
            add_run_arguments(parser)


def build_parser() -> argparse.ArgumentParser:
    parser, sub = new_parser(__doc__)
    add_commands(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: list[str] | None,
        commands: Mapping[str, Command], bases: Mapping[str, dict] | None = None) -> int:
    """Parse `argv`, resolve the run config (on `bases[command]`, if any) and run the command.

    A config error prints `asteria: config error: ...` and returns 2 before anything is built;
    an option that is neither the command's nor an override is a usage error (exit 2) that names
    the closest option.
    """
    configure_logging()
    args, rest = parser.parse_known_args(argv)
    for flag, key in (("metrics_port", "telemetry.metrics_port"),
                      ("metrics_host", "telemetry.metrics_host")):
        if getattr(args, flag, None) is not None:
            rest += [f"--{key}", str(getattr(args, flag))]
    try:
        config = resolve_config(getattr(args, "config", None), rest,
                                (bases or {}).get(args.command))
    except UnknownOption as err:
        options = re.findall(r"--[\w-]+", args.parser.format_usage())
        close = difflib.get_close_matches(str(err), options, n=1)
        args.parser.error(f"unknown option {str(err)!r}" +
                          (f"; did you mean {close[0]}?" if close else "") +
                          " (config overrides are --section.key value)")
    except ConfigError as err:
        print(f"asteria: config error: {err}", file=sys.stderr)
        return 2
    if args.command not in commands:
        raise NotImplementedError(args.command)
    return commands[args.command](config, args)


# The commands' own defaults under the config file and the overrides: a plan is for a
# second-order optimizer (the train default, AdamW, has no refresh to plan).
BASES: dict[str, dict] = {"plan": {"optim": {"name": "soap"}}}


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv, {name: handler for name, (_, handler) in COMMANDS.items()},
               bases=BASES)


if __name__ == "__main__":
    sys.exit(main())
