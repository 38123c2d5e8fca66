import dataclasses
import json
import os
import threading

import pytest
import torch

from asteria_core.telemetry.timing import PHASES
from asteria_core.train import checkpoint as ckpt
from asteria_core.train.run_lock import LOCK_NAME
from asteria_core.train.trainer import Trainer
from tests.components import missing


def _resume_config(config, path):
    return dataclasses.replace(config, train=dataclasses.replace(config.train, resume=str(path)))


def test_stop_at_250_and_resume_matches_uninterrupted_bit_for_bit(tiny):
    config = tiny(steps=300, eval_interval=100)
    straight = Trainer(config, run_id="straight")
    full = straight.train(progress=False)
    straight.close()

    first = Trainer(config, run_id="stopped")
    part = first.train(stop_at=250, progress=False)
    first.close()
    assert part.stopped_early and part.step == 250

    resumed = Trainer(_resume_config(config, part.run_dir / ckpt.CHECKPOINT_NAME))
    assert resumed.step == 250 and resumed.run_id == "stopped"
    rest = resumed.train(progress=False)
    resumed.close()

    assert part.train_losses + rest.train_losses == full.train_losses  # exact float equality
    assert rest.eval_losses == {300: full.eval_losses[300]}
    for (name, a), (_, b) in zip(straight.model.state_dict().items(),
                                 resumed.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_training_reduces_loss_and_records_every_step(tiny):
    trainer = Trainer(tiny(steps=60, eval_interval=30))
    seen = []
    trainer.runtime.add_listener(seen.append)
    result = trainer.train(progress=False)
    trainer.close()
    assert [r.step for r in seen] == list(range(1, 61))
    assert result.eval_losses[60] < result.eval_losses[30] < 5.0
    lines = (result.run_dir / "steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == list(range(1, 61))
    for record in seen:
        assert set(record.phase_seconds) == set(PHASES)
        assert all(v >= 0 for v in record.phase_seconds.values())
        # Phases are disjoint slices of the step, so they cannot add up to more than it.
        assert sum(record.phase_seconds.values()) <= record.step_seconds
        assert record.tokens == 4 * 32
    assert seen[0].lr < seen[10].lr  # warmup


def test_boundary_hooks_run_once_per_step_after_the_update(tiny):
    trainer = Trainer(tiny(steps=5), jsonl=False)
    calls = []
    trainer.runtime.at_boundary(lambda step: calls.append((step, trainer.step)))
    trainer.train(progress=False)
    assert calls == [(s, s) for s in range(1, 6)]


def test_train_cpus_pins_the_training_thread_only(tiny):
    """The trainer pins the thread that builds it; the rest of the process keeps its CPUs."""
    if not hasattr(os, "sched_setaffinity"):
        missing("os.sched_setaffinity (pinning a thread needs Linux)")
    config = tiny(steps=2)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, cpus="0"))
    before, seen = os.sched_getaffinity(0), {}

    def train_in_thread() -> None:
        Trainer(config, jsonl=False).train(progress=False)
        seen["train"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=train_in_thread)
    thread.start()
    thread.join()
    assert seen["train"] == {0}
    assert os.sched_getaffinity(0) == before


def test_request_stop_ends_at_a_boundary_with_a_checkpoint(tiny):
    trainer = Trainer(tiny(steps=50), jsonl=False)
    trainer.runtime.at_boundary(lambda step: step == 7 and trainer.request_stop())
    result = trainer.train(progress=False)
    assert result.step == 7 and result.stopped_early
    assert ckpt.load(result.run_dir / ckpt.CHECKPOINT_NAME)["step"] == 7


class _ExplodesWhilePickled:
    def __reduce__(self):
        raise RuntimeError("simulated crash in the middle of writing a checkpoint")


def test_crash_mid_write_keeps_the_last_good_checkpoint(tiny):
    trainer = Trainer(tiny(steps=3), jsonl=False)
    trainer.train(progress=False)
    path = trainer.run_dir / ckpt.CHECKPOINT_NAME
    good = path.read_bytes()
    state = trainer.checkpoint_state()
    state["poison"] = [torch.zeros(1000), _ExplodesWhilePickled()]
    with pytest.raises(RuntimeError, match="simulated crash"):
        ckpt.save_atomic(state, path)
    assert path.read_bytes() == good
    # no temp left: the checkpoint and the run folder's lock only
    assert {p.name for p in path.parent.iterdir()} == {ckpt.CHECKPOINT_NAME, LOCK_NAME}
    assert ckpt.load(path)["step"] == 3


def test_resume_rejects_a_file_that_is_not_a_checkpoint(tiny, tmp_path):
    bogus = tmp_path / "bogus.pt"
    torch.save({"hello": 1}, bogus)
    with pytest.raises(ValueError, match="train.resume"):
        Trainer(_resume_config(tiny(), bogus))


def test_resume_takes_the_architecture_from_the_checkpoint(tiny):
    config = tiny(steps=2)
    trainer = Trainer(config, jsonl=False)
    trainer.train(progress=False)
    other = dataclasses.replace(config, model=dataclasses.replace(config.model, n_layer=3))
    resumed = Trainer(_resume_config(other, trainer.run_dir / ckpt.CHECKPOINT_NAME), jsonl=False)
    assert resumed.config.model.n_layer == 2


@pytest.mark.parametrize("name", ["soap", "shampoo", "kl_shampoo"])
def test_second_order_run_resumes_bit_for_bit_with_refreshes_in_flight(tiny, name):
    """Stop between a refresh and its swap: the checkpoint must carry the pending result."""
    config = tiny(steps=30, eval_interval=30)
    lr = {"soap": 3e-3, "shampoo": 1e-3, "kl_shampoo": 1e-3}[name]
    config = dataclasses.replace(
        config, optim=dataclasses.replace(config.optim, name=name, lr=lr),
        policy=dataclasses.replace(config.policy, refresh_interval=4, staleness_bound=3,
                                   swap_delay=3, workers=1))
    straight = Trainer(config, run_id="straight", jsonl=False)
    full = straight.train(progress=False)
    straight.close()
    first = Trainer(config, run_id="stopped", jsonl=False)
    part = first.train(stop_at=15, progress=False)  # refreshes fell due at 13, swap at 16
    first.close()
    resumed = Trainer(_resume_config(config, part.run_dir / ckpt.CHECKPOINT_NAME), jsonl=False)
    rest = resumed.train(progress=False)
    resumed.close()
    assert part.train_losses + rest.train_losses == full.train_losses
    assert straight.runtime.refresh.failures == 0 and resumed.runtime.refresh.failures == 0


def test_a_launched_run_starts_with_the_autopilot_its_config_names(tiny):
    """The config's [autopilot] section (what `asteria train`, POST /runs and a config file set):
    the runtime's autopilot starts in that mode, with those settings and bounds."""
    from asteria_core.autopilot.section import AutopilotSection

    config = tiny(steps=40, eval_interval=40)
    config = dataclasses.replace(
        config, optim=dataclasses.replace(config.optim, name="soap"),
        policy=dataclasses.replace(config.policy, refresh_interval=2, staleness_bound=2,
                                   workers=1),
        autopilot=AutopilotSection(mode="propose", window=8, settle=2, spacing=10,
                                   workers="1..1", refresh_interval="2..20",
                                   offload_mode="disk,host"))
    trainer = Trainer(config, run_id="piloted", jsonl=False)
    pilot = trainer.runtime.autopilot
    assert pilot.mode == "propose" and pilot.config.window == 8
    assert pilot.config.bounds["workers"] == (1, 1)
    assert pilot.config.bounds["offload_mode"] == ["disk", "host"]
    assert "device_budget_bytes" not in pilot.config.bounds  # empty: never moved
    trainer.train(progress=False)
    trainer.close()
    assert trainer.runtime.policy.history() == []  # propose: nothing applied on its own
