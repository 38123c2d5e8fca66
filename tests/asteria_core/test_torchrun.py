"""torchrun's environment, read in one place (asteria_core/torchrun.py): what the trainer, the
topology and the logging set-up all read."""

from __future__ import annotations

import pytest

from asteria_core.distributed.topology import Topology
from asteria_core.torchrun import Ranks


def test_a_process_group_a_script_started_stands_for_world_and_rank():
    env = {"WORLD_SIZE": "9", "RANK": "8", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}
    assert Ranks.from_env(env, group=(4, 3)) == Ranks(3, 4, 1, 2)
    assert Ranks.from_env({}, group=(4, 3)) == Ranks(3, 4, 3, 4)  # one node: the whole world


def test_the_topology_reads_the_node_layout_from_the_same_place(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert Topology.from_env(4, 3).nodes == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE is 'two'; allowed: an integer"):
        Topology.from_env(4, 3)
