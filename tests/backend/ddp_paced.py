"""examples/ddp_loop.py as it is, each batch drawn PACE_SECONDS late: the per-rank view's tests
read a job that trains on while they run, and unpaced its two ranks would take both cores for the
whole module. Arguments are the example's."""

import runpy
import sys
import time
from pathlib import Path

from asteria_core.train.data import BatchLoader

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ddp_loop.py"
PACE_SECONDS = 0.25
"""Steps (4 a second at most) still come far faster than the tests read them."""

_next_batch = BatchLoader.next_batch


def paced(self: BatchLoader):
    time.sleep(PACE_SECONDS)
    return _next_batch(self)


BatchLoader.next_batch = paced
sys.argv[0] = str(EXAMPLE)
runpy.run_path(str(EXAMPLE), run_name="__main__")
