"""Thousands of preconditioner blocks (per-block telemetry and bookkeeping).

What a model with many blocks must not grow: the metrics' series (no label per block: the
staleness of every block goes into one histogram), the step record the control plane and the
dashboard receive, and the runtime's own work per step beyond one visit per block. The work is
counted, not timed: the lines of asteria_core the training thread runs over a refresh round.
Before, finding a block scanned the parameters (snapshots, swaps and configs of a round were
quadratic in them), every use of a parameter's state walked the step's parameter order, each
step built a tensor per state entry to size it, and pacing dropped a released job by a scan.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import asteria_core as asteria

pytestmark = pytest.mark.usefixtures("one_thread")

CORE = str(Path(asteria.__file__).parent)
INTERVAL = 4


class LineCount:
    """Lines executed in asteria_core's own files on this thread while active."""

    def __init__(self) -> None:
        self.lines = 0

    def _local(self, frame, event, arg):
        if event == "line":
            self.lines += 1
        return self._local

    def _global(self, frame, event, arg):
        return self._local if frame.f_code.co_filename.startswith(CORE) else None

    def __enter__(self):
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)


def _run(n: int, tmp_path: Path):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4, bias=False) for _ in range(n)])
    policy = asteria.Policy(refresh_interval=INTERVAL, staleness_bound=INTERVAL, workers=1)
    opt = asteria.optimizer(model, "soap", policy=policy, run_dir=tmp_path / f"n{n}")
    records = []
    opt.runtime.add_listener(records.append)
    x = torch.randn(2, 4)

    def step():
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    try:
        for _ in range(INTERVAL + 1):  # first statistics, first bases
            step()
        with LineCount() as counted:
            for _ in range(INTERVAL):  # a whole round: snapshots, paced releases, swaps
                step()
        opt.runtime.end_step()
        exposition = opt.runtime.telemetry.exposition()[0].decode()
        blocks = len(opt.refresh_blocks())
    finally:
        opt.runtime.close()
    series = {re.sub(r'run_id="[^"]*"', "run_id", line.split(" ")[0])
              for line in exposition.splitlines()
              if line.startswith("asteria_") and "_created" not in line}
    record = json.dumps(records[-1].to_dict())
    return blocks, counted.lines, series, record


def test_thousands_of_blocks_cost_one_visit_each_and_no_series_or_record_bytes(tmp_path):
    small, large = 100, 1000
    blocks_small, lines_small, series_small, record_small = _run(small, tmp_path)
    blocks_large, lines_large, series_large, record_large = _run(large, tmp_path)
    assert (blocks_small, blocks_large) == (2 * small, 2 * large)
    # Ten times the blocks: about ten times the work (a quadratic part made it ~50 times).
    assert lines_large < 13 * lines_small, (lines_small, lines_large)
    # The same series whatever the model: nothing labelled per block or per parameter.
    assert series_large == series_small
    # The record the control plane stores and streams holds no per-block list.
    assert abs(len(record_large) - len(record_small)) < 64
