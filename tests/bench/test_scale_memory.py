"""`asteria bench scale-memory --quick`, end to end in a real cgroup v1 memory cgroup (root
only): all-in-memory SOAP refused up front with the shortfall named, tiered SOAP trained its
steps (a refresh round staged in the disk tier's files among them) under the same cap, and
tiered and in-memory losses equal bit for bit; the suite's JSON checked for its structure.

The bit-for-bit match compares tiered with all-in-memory state and nothing else: MKL's products
and eigendecompositions round differently with another thread count, so both children compute
with the same threads, named on their command lines, and each reports the threads it computed
with. The suite runs the match without root too: it is checked before the cap needs root."""

from __future__ import annotations

import math
import os

from asteria_bench.suites import load, scale_memory
from tests.bench.test_suites_small import check_common, finite_positive, options, worded
from tests.components import missing


def test_all_in_memory_is_refused_under_the_cap_and_tiered_trains_under_it(tmp_path):
    opts = options(tmp_path, "scale-memory")
    load("scale-memory").run(opts)
    data = worded(opts.out_dir, "scale-memory")

    match = data["config"]["tiered_match"]
    threads = len(os.sched_getaffinity(0))
    assert match["memory_threads"] == match["tiered_threads"] == threads
    assert match["steps"] == scale_memory.MATCH_QUICK.steps
    assert len(match["memory_losses"]) == match["steps"] and match["tiered_disk_bytes"] > 0
    assert match["tiered_results_staged"] > 0  # swapped in from their files at step 3
    assert match["tiered_losses"] == match["memory_losses"] and match["equal"]

    why = scale_memory.cgroup_missing()
    if why is not None:
        missing(why)
    check_common(data, "scale-memory", opts.out_dir)
    row = data["config"]["memory_headline"]
    size, cap = scale_memory.QUICK, scale_memory.QUICK.cap_bytes
    assert row["cap_bytes"] == cap and row["model"] == size.name
    assert row["state_bytes"] > 0 and row["params"] * 4 == row["param_bytes"]

    refused = row["memory"]
    assert refused["returncode"] == scale_memory.REFUSED and refused["refused"], refused
    message = refused["message"]
    assert message.startswith("optimizer state needs "), message
    assert f"the memory limit is {cap // scale_memory.MiB} MiB (cgroup)" in message
    assert " short; set a host budget and a disk tier" in message

    tiered = row["tiered"]
    assert tiered["returncode"] == 0, tiered.get("stderr_tail")
    assert row["trained_under_cap"] and tiered["steps"] == size.steps > 5  # step 6's round
    assert len(tiered["losses"]) == size.steps and all(map(math.isfinite, tiered["losses"]))
    # Both under the cap; RSS may exceed the cgroup's charge (shared library pages loaded,
    # and charged, before the child joined it).
    assert tiered["peak_rss_bytes"] <= cap and tiered["cgroup_peak_bytes"] <= cap
    assert finite_positive(tiered["disk_bytes"]) and tiered["results_staged"] > 0
    assert tiered["disk_read_bytes"] > 0 and tiered["disk_write_bytes"] > 0
    per = tiered["seconds_per_step"]
    assert set(per) == {"step", "compute", "transfer_wait", "refresh", "disk_read",
                        "disk_write"}
    assert finite_positive(per["step"]) and finite_positive(per["refresh"])
    assert per["compute"] <= per["step"]
    assert data["tables"][0]["rows"][1][1] == f"trained {size.steps} steps"
