"""Refresh results in flight for blocks whose state lives on disk wait for their swap in files
of the disk tier, not in memory (a 28M-parameter tiered run held ~600 MB of them and
was killed by its cgroup at step 1), and swap in with the same numbers as results in memory."""

from __future__ import annotations

import dataclasses

import pytest

from asteria_core.tiers.disk import _MAPPINGS
from asteria_core.train.trainer import Trainer
from tests.asteria_core.tiers.test_trainer_tiers import disk_policy, soap_config, working_set

STEPS = 12


def _file_backed(t) -> bool:
    storage = t.untyped_storage()
    return _MAPPINGS.holds(storage.data_ptr(), storage.nbytes())


@pytest.mark.parametrize("workers", [0, 1])
def test_results_of_disk_homed_blocks_wait_in_files_and_swap_in_bit_for_bit(tiny, workers):
    config = soap_config(tiny, steps=STEPS, eval_interval=STEPS)  # refresh every 4 steps, d = 2
    # a window of 1: a round's results wait d = 2 steps for their swap (with the "auto" window
    # each is swapped 1 step after its read, before a result could be seen waiting)
    config = dataclasses.replace(config, policy=dataclasses.replace(config.policy,
                                                                    workers=workers,
                                                                    swap_window=1))
    w = working_set(config)
    memory = Trainer(config, run_id="memory", jsonl=False)
    expected = memory.train(progress=False).train_losses
    memory.close()

    tiered = Trainer(dataclasses.replace(config, policy=disk_policy(config, w)),
                     run_id="tiered", jsonl=False)
    store, engine = tiered.runtime.tiers, tiered.runtime.refresh
    waiting_in_files, waiting_in_memory, losses = 0, 0, []
    try:
        for _ in range(STEPS):
            tiered.train_step()
            losses.append(tiered.runtime.end_step().loss)
            for queue_ in engine.outstanding.values():
                for item in queue_:
                    if item.result is None or not store.stages_results(item.key.param):
                        continue
                    if _file_backed(item.result.basis):
                        waiting_in_files += 1
                    else:
                        waiting_in_memory += 1
    finally:
        tiered.close()
    assert store.tier_bytes()["disk"] > 0
    assert waiting_in_files > 0 and waiting_in_memory == 0
    assert store.results.staged > 0
    assert losses == expected


def test_the_memory_check_counts_one_blocks_refresh_work_inline_and_a_round_with_workers(tiny):
    config = soap_config(tiny, steps=2, eval_interval=2)
    w = working_set(config)
    counted = {}
    for workers in (0, 1):
        policy = dataclasses.replace(disk_policy(config, w), workers=workers)
        run = Trainer(dataclasses.replace(config, policy=policy), run_id=f"w{workers}",
                      jsonl=False)
        blocks = run.runtime.refresh.blocks.values()
        counted[workers] = run.runtime.tiers.refresh_bytes()
        run.close()
    widest = max(b.size for b in blocks)
    # inline: snapshot (factor, basis) and result (basis, rotation, transport) of one block,
    # plus results of memory-homed blocks waiting d steps; workers: every block's
    assert counted[0] >= 5 * 4 * widest ** 2
    assert counted[1] == sum(5 * 4 * b.size ** 2 for b in blocks) > counted[0]
