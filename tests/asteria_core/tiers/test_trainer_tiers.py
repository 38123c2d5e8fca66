"""The trainer with tiered state: resume under another placement; a bad file keeps the last
good checkpoint."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from asteria_core.policy import LivePolicy
from asteria_core.tiers import TierFileError
from asteria_core.train import checkpoint as ckpt
from asteria_core.train.trainer import Trainer


def soap_config(tiny, **train):
    config = tiny(**train)
    return dataclasses.replace(
        config, optim=dataclasses.replace(config.optim, name="soap"),
        policy=dataclasses.replace(config.policy, refresh_interval=4, staleness_bound=2,
                                   swap_delay=2, workers=1))


def disk_policy(config, w):
    return dataclasses.replace(config.policy, offload_mode="disk", device_budget_bytes=w)


def working_set(config) -> int:
    probe = Trainer(config, run_id="probe", jsonl=False)
    w = probe.runtime.tiers.plan.slot_bytes
    probe.close()
    return w


def test_resume_with_a_different_placement_matches_the_straight_run(tiny):
    config = soap_config(tiny, steps=24, eval_interval=24)
    w = working_set(config)
    straight = Trainer(config, run_id="straight", jsonl=False)
    full = straight.train(progress=False)
    straight.close()
    first = Trainer(dataclasses.replace(config, policy=disk_policy(config, w)), run_id="disk",
                    jsonl=False)
    part = first.train(stop_at=11, progress=False)  # refreshes in flight at the stop
    assert first.runtime.tiers.tier_bytes()["disk"] > 0
    first.close()
    resume = dataclasses.replace(config, train=dataclasses.replace(
        config.train, resume=str(part.run_dir / ckpt.CHECKPOINT_NAME)))
    host = dataclasses.replace(config.policy, offload_mode="host", device_budget_bytes=w)
    resumed = Trainer(resume, jsonl=False, policy=LivePolicy(host))
    rest = resumed.train(progress=False)
    assert resumed.runtime.tiers.tier_bytes()["host"] > 0
    resumed.close()
    assert part.train_losses + rest.train_losses == full.train_losses
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_corrupt_disk_file_stops_the_run_and_keeps_the_last_good_checkpoint(tiny):
    config = soap_config(tiny, steps=30, eval_interval=30, checkpoint_interval=10)
    config = dataclasses.replace(config, policy=disk_policy(config, working_set(config)))
    trainer = Trainer(config, run_id="faulty", jsonl=False)

    def corrupt(step: int) -> None:
        if step == 13:
            trainer.runtime.tiers._drain()
            victim = sorted(trainer.run_dir.joinpath("tiers").glob("*.bin"))[-1]
            victim.write_bytes(victim.read_bytes()[:-4096])  # truncated

    trainer.runtime.at_boundary(corrupt)
    with pytest.raises(TierFileError, match=r"tiers/p\d+\..*\.bin.*truncated"):
        trainer.train(progress=False)
    trainer.runtime.tiers.traffic.errors.clear()
    trainer.close()
    assert ckpt.load(trainer.run_dir / ckpt.CHECKPOINT_NAME)["step"] == 10
