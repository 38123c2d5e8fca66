"""What `asteria bench` was asked for, handed to every suite."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BenchOptions:
    quick: bool
    out_dir: Path          # the suite's JSON and plots go here (default ./asteria-bench-results)
    corpus: str | None     # a corpus the user names, beside the default one (optimizers)
    device: str            # "cpu" or "cuda"
    peers: bool            # run the peers' optimizers (the `bench` extra) where a suite has them
    command: str           # the command line, as the report prints it
    progress: bool = True  # a bar per configuration
    seeds: int | None = None  # seeds per configuration where a suite runs seeds (None: its own)
    rung: str = "default"  # the model size where a suite has rungs (optimizers: default | large)
    resume: bool = False   # keep the runs of the suite's JSON in out_dir (suites with RESUMABLE)

    def pick(self, quick: Any, full: Any) -> Any:
        """A size that depends on --quick."""
        return quick if self.quick else full


def progress(total: int, desc: str, opts: BenchOptions):
    """The bar of one configuration (steps, turns or repeats)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", leave=False, dynamic_ncols=True,
                disable=not opts.progress)
