"""The cores one process of a node's data-parallel ranks has: what the autopilot models as
shared between its training thread and its refresh workers."""

from __future__ import annotations

from asteria_core.machine import Machine


def test_local_ranks_split_the_cores_a_single_process_has_them_all():
    machine = Machine(cores=16, memory_bytes=1 << 34)
    assert machine.rank_cores(1) == 16
    assert machine.rank_cores(4) == 4
    assert machine.rank_cores(32) == 1  # never below one core
