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
