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
    asteria bench all --quick             # every published number, measured (docs/benchmarks.md)

Overrides are `--section.key value` (or `--section.key=value`) for any config key; an unknown
key or a bad value stops the command before anything is built, naming the key.
"""

# The command table sits above every product package: the core's commands (asteria_core.cli,
# which imports nothing from the control plane), the control plane's (backend/commands.py) and
# the benchmarks' (asteria_bench/cli.py, loaded only for `bench`). No product package imports
# this module or the benchmarks.

from __future__ import annotations

import argparse
import sys

from asteria_core import cli as core
from asteria_core.train.config import RunConfig
from backend import commands as control


def _cmd_bench(config: RunConfig, args: argparse.Namespace) -> int:
    from asteria_bench import cli as bench  # the suites load torch's models only when asked

    return bench.run(args)


COMMANDS: dict[str, core.Command] = {
    "start": control.cmd_start,
    **{name: handler for name, (_, handler) in core.COMMANDS.items()},
    "train": control.cmd_train,
    "serve": control.cmd_serve,
    "bench": _cmd_bench,
}


def build_parser() -> argparse.ArgumentParser:
    parser, sub = core.new_parser(__doc__)
    control.add_start(sub)
    core.add_commands(sub)
    control.add_control_arguments(sub.choices["train"])
    control.add_serve(sub)
    bench = core.add_parser(sub, "bench", "run benchmark suites and render docs/benchmarks.md "
                                          "and the README's performance section from them")
    from asteria_bench.cli import add_arguments

    add_arguments(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    return core.run(build_parser(), argv, COMMANDS,
                    bases={**core.BASES, "start": control.SERVED_RUN,
                           "serve": control.SERVED_RUN})


if __name__ == "__main__":
    sys.exit(main())
