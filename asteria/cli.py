"""The `asteria` command.

    asteria start                         # the product on the embedded default corpus
    asteria start --resume                # continue the newest stopped run from its checkpoint
    asteria train --config run.toml --optim.lr 3e-3 --train.steps 200
    asteria config --config run.toml      # print the resolved config as TOML
    asteria keys optim                    # every key of a section: type, range, default, help
    asteria train --metrics-port 9400     # also serve Prometheus /metrics while training
    asteria train --control-port 8000     # and the control plane, attached to the run
    torchrun --nproc-per-node 2 -m asteria train --control-port 8000   # data-parallel
    asteria serve --port 8000             # the control plane, with a default run
    asteria bench all --quick             # every suite, small sizes, into ./asteria-bench-results

Overrides are `--section.key value` (or `--section.key=value`) for any config key; an unknown
key or a bad value stops the command before anything is built, naming the key.

`pip install asteria` is the runtime: `train`, `config`, `keys`, `plan` and the rest of the
core's commands. `start` needs the app extra, `serve` and `train --control-port` the server
extra, `bench` a source checkout with the bench extra; each says so in one line when it is
missing.
"""

# The command table sits above every product package: the core's commands (asteria_core.cli,
# which imports nothing from the control plane), the control plane's (backend/commands.py) and
# the benchmarks' (asteria_bench/cli.py, loaded only for `bench`). No product package imports
# this module or the benchmarks.

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from asteria_core import cli as core
from asteria_core import extras
from asteria_core.train.config import RunConfig
from backend import commands as control  # the control plane's commands: no web stack loaded

BENCH_FROM_CHECKOUT = ("asteria bench runs from Asteria's source checkout (the benchmarks are not "
                       'in the wheel): pip install -e ".[bench]" there')


def _bench_available() -> bool:
    """Whether the benchmarks can load: importable already, or beside this package in a source
    checkout (an editable install maps only the product packages), whose root then joins the
    path."""
    if importlib.util.find_spec("asteria_bench") is not None:
        return True
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "asteria_bench" / "__init__.py").is_file():
        sys.path.append(str(checkout))
        return True
    return False


def needs(extra: str, handler: core.Command, when=lambda args: True) -> core.Command:
    """`handler`, run only where `extra` is installed (or `when(args)` says it is not needed);
    otherwise one line on stderr naming the extra to install, and exit status 1."""
    def run(config: RunConfig, args: argparse.Namespace) -> int:
        absent = extras.missing(extra) if when(args) else []
        if absent:
            print(f"asteria: {extras.message(f'asteria {args.command}', extra, absent)}",
                  file=sys.stderr)
            return 1
        return handler(config, args)

    return run


def _cmd_bench(config: RunConfig, args: argparse.Namespace) -> int:
    if not _bench_available():
        print(f"asteria: {BENCH_FROM_CHECKOUT}", file=sys.stderr)
        return 1
    from asteria_bench import cli as bench  # the suites load torch's models only when asked

    return bench.run(args)


COMMANDS: dict[str, core.Command] = {
    "start": needs("app", control.cmd_start),
    **{name: handler for name, (_, handler) in core.COMMANDS.items()},
    "train": needs("server", control.cmd_train, when=lambda a: a.control_port is not None),
    "serve": needs("server", control.cmd_serve),
    "bench": needs("bench", _cmd_bench, when=lambda a: _bench_available()),
}


def build_parser() -> argparse.ArgumentParser:
    parser, sub = core.new_parser(__doc__)
    control.add_start(sub)
    core.add_commands(sub)
    control.add_control_arguments(sub.choices["train"])
    control.add_serve(sub)
    bench = core.add_parser(sub, "bench", "run benchmark suites into a results folder (and, "
                                          "with --publish, the repository's pages)")
    if _bench_available():
        from asteria_bench.cli import add_arguments

        add_arguments(bench)
    else:  # an installed wheel: whatever follows, the command says where the bench lives
        bench.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return core.run(build_parser(), argv, COMMANDS,
                        bases={**core.BASES, "start": control.SERVED_RUN,
                               "serve": control.SERVED_RUN})
    except ModuleNotFoundError as err:  # a part of an extra reached past the checks above
        extra = extras.extra_of(err.name or "")
        if extra is None:
            raise
        print(f"asteria: {extras.message('this command', extra, [err.name])}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
