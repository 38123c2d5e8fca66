"""The bit-for-bit match of `asteria bench scale-memory` (issue 24, item 2) compares tiered with
all-in-memory state and nothing else: MKL's products and eigendecompositions round differently
with another thread count, so both children compute with the same threads, named on their
command lines, and each reports the threads it computed with."""

from __future__ import annotations

import os

from asteria_bench.suites import scale_memory
from tests.bench.test_suites_small import options


def test_both_match_children_train_with_the_named_threads_and_give_the_same_losses(tmp_path):
    match = scale_memory.tiered_matches_memory(options(tmp_path, "scale-memory"))
    threads = len(os.sched_getaffinity(0))
    assert match["memory_threads"] == match["tiered_threads"] == threads
    assert match["tiered_results_staged"] > 0  # staged results swapped in from their files
    assert len(match["memory_losses"]) == match["steps"] == scale_memory.MATCH_QUICK.steps
    assert match["tiered_losses"] == match["memory_losses"] and match["equal"]
