"""The suites of `asteria bench`, in the order `all` runs them. Each module has TITLE and
`run(opts: BenchOptions) -> SuiteResult` (which saves its JSON in opts.out_dir as it goes)."""

from __future__ import annotations

import importlib
from types import ModuleType

SUITES = ("optimizers", "critical-path", "staleness", "runtime", "tiers", "serving",
          "distributed", "network", "straggler", "autopilot", "scale",
          "scale-memory")


def load(name: str) -> ModuleType:
    if name not in SUITES:
        raise ValueError(f"suite: got {name!r}; allowed: {', '.join(SUITES)}")
    return importlib.import_module(f"asteria_bench.suites.{name.replace('-', '_')}")


# What each suite measures: a change to any of these paths after the commit a suite ran at makes
# its published figures stale (the report flags it). Every suite measures the runtime and its own
# module; the shared drivers and the control plane where a suite runs them.
DRIVERS = ("asteria_bench/turns.py", "asteria_bench/clocks.py", "asteria_bench/pausable.py",
           "asteria_bench/peers.py", "asteria_bench/ddp_rank.py", "asteria_bench/slower_host.py",
           "asteria_bench/selection.py")
SERVED = ("serving", "autopilot", "network")
NOT_RUN = ("backend/launch.py",)
"""Files under those paths that no suite runs: `asteria start`'s launcher, a client of the
control plane (the suites run `asteria serve`, the trainer and their own ranks)."""


def suite_of(name: str) -> str:
    """The suite a result's name belongs to: "optimizers-large" (a rung) is optimizers'."""
    return max((s for s in SUITES if name == s or name.startswith(s + "-")), key=len,
               default=name)


def measured_paths(name: str) -> tuple[str, ...]:
    """The paths whose change makes `name`'s figures stale (less NOT_RUN)."""
    name = suite_of(name)
    module = f"asteria_bench/suites/{name.replace('-', '_')}.py"
    return ("asteria_core", module, *DRIVERS, *(("backend",) if name in SERVED else ()))


def measured_pathspecs(name: str) -> tuple[str, ...]:
    """`measured_paths` less NOT_RUN, as git pathspecs."""
    return (*measured_paths(name), *(f":(exclude){path}" for path in NOT_RUN))
