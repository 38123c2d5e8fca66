"""Idle attribution: compute phases plus waits by cause sum to each step's wall time."""

from __future__ import annotations

import time

import pytest

from asteria_core.telemetry.idle import WaitLedger, breakdown
from asteria_core.telemetry.reporter import IDLE_CAUSES, WAIT_CAUSES
from asteria_core.telemetry.timing import PHASES
from tests.asteria_core.telemetry.conftest import NO_METERS, families, value


def add_real_waits(trainer):
    """Real parts blocking the training thread inside three phases, reported by cause."""
    reporter = trainer.runtime.reporter

    def in_forward(module, args):
        if module.training:  # evaluation forwards are outside any step
            with reporter.wait("sync_wait"):
                time.sleep(0.0005)

    def in_optimizer(optimizer, args, kwargs):
        with reporter.wait("transfer_wait"):
            time.sleep(0.0005)

    def at_boundary(step):
        with reporter.wait("refresh_wait"):
            time.sleep(0.001)

    trainer.model.register_forward_pre_hook(in_forward)
    trainer.optimizer.register_step_pre_hook(in_optimizer)
    trainer.runtime.at_boundary(at_boundary)


def test_phases_plus_idle_causes_sum_to_step_wall_time_within_5_percent(telemetry_run):
    trainer = telemetry_run(steps=12, eval_interval=6, telemetry=NO_METERS)
    add_real_waits(trainer)
    trainer.train(progress=False)
    records = trainer.records
    assert [r.step for r in records] == list(range(1, 13))
    for r in records:
        compute, idle = r.timing.compute_seconds, r.timing.idle_seconds
        assert set(compute) == set(PHASES) and set(idle) == set(IDLE_CAUSES)
        total = sum(compute.values()) + sum(idle.values())
        assert abs(total - r.step_seconds) <= 0.05 * r.step_seconds, (r.step, total)
        for cause in WAIT_CAUSES:
            assert idle[cause] > 0, (r.step, cause)
        # Each wait is taken out of the phase it happened in, and only that phase.
        for phase, cause in (("data", "data_wait"), ("forward", "sync_wait"),
                             ("optimizer", "transfer_wait"), ("boundary", "refresh_wait")):
            assert compute[phase] == pytest.approx(max(0.0, r.phase_seconds[phase] -
                                                       idle[cause]), abs=1e-12)
        assert compute["backward"] == r.phase_seconds["backward"]
        assert r.timing.device_busy_ratio == pytest.approx(
            sum(compute.values()) / r.step_seconds)

    # The exported counters add up the same way over the run.
    fams = families(trainer.telemetry)
    phase_total = sum(s.value for s in fams["asteria_step_phase_seconds"].samples
                      if s.name.endswith("_total"))
    idle_total = sum(s.value for s in fams["asteria_device_idle_seconds"].samples
                     if s.name.endswith("_total"))
    wall_total = value(fams, "asteria_step_seconds", "_sum")
    assert abs(phase_total + idle_total - wall_total) <= 0.05 * wall_total
    assert value(fams, "asteria_device_idle_seconds", "_total", cause="refresh_wait") == \
        pytest.approx(sum(r.timing.idle_seconds["refresh_wait"] for r in records))


def test_breakdown_subtracts_waits_from_their_phase_and_derives_other():
    phases = {"data": 1.0, "forward": 2.0, "backward": 3.0, "optimizer": 1.5, "boundary": 0.5}
    waits = {("data", "data_wait"): 0.75, ("boundary", "refresh_wait"): 0.5,
             (None, "sync_wait"): 0.25}  # between phases: counted, taken from no phase
    compute, idle = breakdown(phases, 9.0, waits)
    assert compute == {"data": 0.25, "forward": 2.0, "backward": 3.0, "optimizer": 1.5,
                       "boundary": 0.0}
    assert idle == {"refresh_wait": 0.5, "transfer_wait": 0.0, "sync_wait": 0.25,
                    "data_wait": 0.75, "other": 0.75}
    assert sum(compute.values()) + sum(idle.values()) == 9.0


def test_waits_outside_a_step_go_to_the_idle_counter_but_into_no_step():
    ledger = WaitLedger()
    ledger.add("sync_wait", 0.5, in_step=False, phase=None)
    ledger.add("refresh_wait", 0.25, in_step=True, phase="boundary")
    assert ledger.take_step() == {("boundary", "refresh_wait"): 0.25}
    assert ledger.take_step() == {}
    assert ledger.take_outside() == {"sync_wait": 0.5}


def test_unknown_causes_are_rejected(telemetry_run):
    reporter = telemetry_run(steps=1, telemetry=NO_METERS).runtime.reporter
    with pytest.raises(ValueError, match="cause"):
        reporter.add_wait("other", 1.0)  # derived, never reported
    with pytest.raises(ValueError, match="cause"), reporter.wait("coffee_break"):
        pass

