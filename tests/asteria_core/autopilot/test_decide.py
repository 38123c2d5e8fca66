"""The autopilot's decision function on record windows: no change when nothing is wrong, the
rules in their order, hysteresis, bounds, the operator's hold, the spacing and the quality
guard. Windows are step records in their JSON form (what a run's JSONL file holds), so a recorded
run replays: tests/asteria_core/autopilot/test_pilot.py feeds one."""

from __future__ import annotations

import dataclasses
import math

import pytest

from asteria_core.autopilot import AUTOPILOT, UNDO, AutopilotConfig, AutopilotError, decide
from asteria_core.policy import Policy

CONFIG = AutopilotConfig(mode="apply", window=20, settle=5, spacing=30, hold=100,
                         guard_steps=20, bounds={"refresh_interval": (5, 100),
                                                 "staleness_bound": (1, 20),
                                                 "swap_delay": (1, 20), "workers": (1, 2)})


FRESHEN = dataclasses.replace(CONFIG, freshen=True)


def record(step: int, *, duty: float | None = 0.6, refresh_wait: float = 0.0,
           transfer_wait: float = 0.0, loss: float = 3.0, version: int = 1,
           bound: int = 10, staleness: int = 4, eval_loss: float | None = None,
           disk_bytes: int = 0, sync_wait: float = 0.0, latency: int | None = None,
           lead: int | None = None) -> dict:
    return {"step": step, "step_seconds": 0.1, "loss": loss, "tokens": 512,
            "policy_version": version, "eval_loss": eval_loss,
            "tiers": {"bytes": {"device": 1000, "host": 0, "disk": disk_bytes}},
            "timing": {"idle_seconds": {"refresh_wait": refresh_wait,
                                        "transfer_wait": transfer_wait,
                                        "sync_wait": sync_wait}},
            "refresh": {"background_load": duty, "staleness_max": staleness,
                        "staleness_bound": bound, "queue_depth": 1,
                        "refresh_latency_steps": latency, "swap_lead": lead}}


def run(steps: range, **kw) -> list[dict]:
    return [record(s, **kw) for s in steps]


def policy(**changes) -> dict:
    """The default policy with `changes`, as data (not validated against this machine's cores:
    the decision never builds a Policy)."""
    return {**Policy().to_dict(), **changes}


def change(version: int, step: int, diff: dict, client: str = AUTOPILOT,
           reason: str = "") -> dict:
    return {"version": version, "effective_step": step, "diff": diff, "client": client,
            "reason": reason}


def test_nothing_wrong_no_change():
    assert decide(run(range(1, 201)), policy(), [], CONFIG) is None


def test_too_few_records_no_change():
    # step 1 (first bases) is never read: 9 records, short of half the window
    assert decide(run(range(1, 11), duty=2.0), policy(), [], CONFIG) is None
    # nothing urgent: the whole window first
    assert decide(run(range(1, 20), duty=0.9), policy(), [], CONFIG) is None


def test_a_run_that_starts_behind_is_answered_from_its_second_step():
    """Before any change no `settle` applies, only step 1 (its first bases, a one-off) is left
    out: a duty above 1 (every round will wait) decides over half the window, records 2-11."""
    d = decide(run(range(1, 12), duty=2.0), policy(), [], CONFIG)
    assert d.step == 11 and "over 10 steps" in d.reason and d.changes["workers"] == 2
    # step 1's wait alone (the first bases, computed at once) is not read as a problem
    records = [record(1, refresh_wait=0.5), *run(range(2, 22))]
    assert decide(records, policy(), [], CONFIG) is None


def test_a_severe_wait_is_read_over_half_the_window_a_mild_one_over_all_of_it():
    """Steps waiting 20% of their time: 10 records (half the window, one round) decide; at 5%
    the whole window is read first."""
    severe = decide(run(range(1, 16), refresh_wait=0.02), policy(), [], CONFIG)
    assert severe.changes == {"workers": 2} and "over 10 steps" in severe.reason
    assert decide(run(range(1, 11), refresh_wait=0.02), policy(), [], CONFIG) is None
    assert decide(run(range(1, 16), refresh_wait=0.005), policy(), [], CONFIG) is None
    mild = decide(run(range(1, 26), refresh_wait=0.005), policy(), [], CONFIG)
    assert mild.changes == {"workers": 2} and "over 20 steps" in mild.reason


def test_duty_above_one_adds_workers_with_a_reason_citing_it():
    decision = decide(run(range(1, 41), duty=1.6), policy(), [], CONFIG)
    assert decision.changes == {"workers": 2}  # ceil(1 x 1.6 / 0.8), the target met exactly
    assert decision.reason.startswith("refresh duty 1.60 over 20 steps")  # the whole window
    assert decision.reason.endswith("workers 1 -> 2")
    assert decision.step == 40 and not decision.undo
    # four workers' worth at a bound of two: the time still missing comes in the same change,
    # a longer interval (3.2 / 2 / 0.8 = 2x) with S along
    decision = decide(run(range(1, 41), duty=3.2), policy(), [], CONFIG)
    assert decision.changes == {"workers": 2, "refresh_interval": 20, "staleness_bound": 20}
    assert decision.reason.endswith(
        "workers 1 -> 2, refresh_interval 10 -> 20, staleness_bound 10 -> 20")
    # two workers would leave the duty above the target (1.8 / 2 = 0.9 > 0.8): no headroom
    # for a slower round, so the rest of the time comes along (interval x 1.25, S along)
    decision = decide(run(range(1, 41), duty=1.8), policy(), [], CONFIG)
    assert decision.changes == {"workers": 2, "refresh_interval": 13, "staleness_bound": 13}
    # no longer than S can follow (its bound, 20), where that is longer at all
    decision = decide(run(range(1, 41), duty=4.0), policy(), [], CONFIG)
    assert decision.changes == {"workers": 2, "refresh_interval": 20, "staleness_bound": 20}


def test_a_worker_on_the_training_threads_core_brings_the_time_still_needed_along():
    """On 2 cores the training thread keeps one: a second worker shares its core and adds no
    capacity of its own (what it refreshes, the training loses), so the change that adds it
    also takes the time the work needs (1.6 / 0.8 = 2x: interval 20, S along). With a core
    of its own (4 cores, or no model of the cores) the worker alone meets the target."""
    records = run(range(1, 41), duty=1.6)
    shared = decide(records, policy(), [], CONFIG, cores=2)
    assert shared.changes == {"workers": 2, "refresh_interval": 20, "staleness_bound": 20}
    assert decide(records, policy(), [], CONFIG, cores=4).changes == {"workers": 2}
    assert decide(records, policy(), [], CONFIG).changes == {"workers": 2}
    # one core for training and workers alike: the one worker measured is all there is
    alone = decide(run(range(1, 41), duty=0.6, refresh_wait=0.05), policy(), [], CONFIG,
                   cores=1)
    assert alone.changes == {"workers": 2}  # a wait well within capacity: a worker only


def test_pinned_swap_delay_goes_back_up_first():
    d = decide(run(range(1, 41), duty=1.3), policy(swap_delay=3), [], CONFIG)
    assert d.changes == {"swap_delay": 10}
    # up to the interval only: a round has its interval whatever a later swap, so past it d
    # would give the workers no more time (on "auto" d is the interval already)
    d = decide(run(range(1, 41), duty=1.3), policy(swap_delay=3, refresh_interval=5), [],
               CONFIG)
    assert d.changes == {"swap_delay": 5}
    d = decide(run(range(1, 41), duty=1.3), policy(refresh_interval=5), [], CONFIG)
    assert d.changes == {"workers": 2}


def test_workers_at_their_bound_the_interval_grows_instead():
    config = AutopilotConfig(mode="apply", window=20, settle=5,
                             bounds={"workers": (1, 1), "refresh_interval": (5, 30)})
    d = decide(run(range(1, 41), duty=2.0), policy(), [], config)
    assert d.changes == {"refresh_interval": 25}  # ceil(10 x 2.0 / 0.8)
    d = decide(run(range(1, 41), duty=8.0), policy(), [], config)
    assert d.changes == {"refresh_interval": 30}  # clipped to the operator's bound


def test_a_round_that_needs_more_than_its_d_steps_gets_a_larger_s_not_a_longer_interval():
    """A round is swapped in by d steps after it falls due: at interval 20 and d = S = 10 a
    duty of 0.6 per interval is 1.2 in the round's 10 steps. A longer interval gives it no
    more time; a larger S does (d follows it), up to the interval."""
    d = decide(run(range(1, 61), duty=0.6), policy(workers=2, refresh_interval=20), [], CONFIG)
    assert d.changes == {"staleness_bound": 15}  # ceil(10 x 1.2 / 0.8)
    assert d.reason.startswith("refresh duty 0.60 over 40 steps")  # two rounds of 20
    # at d = interval the duty per interval is the round's: 0.6 is in hand
    assert decide(run(range(1, 61), duty=0.6), policy(workers=2, refresh_interval=10), [],
                  CONFIG) is None


def test_inline_refreshes_that_block_get_a_worker():
    d = decide(run(range(1, 41), duty=None, refresh_wait=0.02), policy(workers=0), [], CONFIG)
    assert d.changes == {"workers": 1}
    assert "refresh_wait 20% of step time" in d.reason


def test_waiting_for_another_ranks_late_refreshes_gives_refreshes_time():
    """Rank 0 decides for every rank: waits at the swap steps of a slowed rank's blocks
    (sync_wait) get the remedies of its own waits; ranks' usual drift (under 5%) does not."""
    d = decide(run(range(1, 41), sync_wait=0.02), policy(), [], CONFIG)
    assert d.changes == {"workers": 2}
    assert "sync_wait 20% of step time" in d.reason
    assert decide(run(range(1, 41), sync_wait=0.004), policy(), [], CONFIG) is None


def test_a_refresh_that_outlasts_its_lead_gets_a_longer_lead_not_more_workers():
    """The workers keep up (duty 0.7) but steps wait: refreshes take 4 steps against a lead of
    2 (one block alone takes that long). A narrower swap window makes the lead 4 (d 10: V 9 ->
    7); neither a worker nor a longer interval would."""
    waiting = {"duty": 0.7, "refresh_wait": 0.02, "latency": 4, "lead": 2}
    bounds = {**CONFIG.bounds, "swap_window": (1, 20)}
    config = dataclasses.replace(CONFIG, bounds=bounds)
    d = decide(run(range(1, 41), **waiting), policy(), [], config)
    assert d.changes == {"swap_window": 7}
    assert "refresh latency (p90) 4 steps against a lead of 2" in d.reason
    # d too short for that lead even at V = 1 (d 15, V 2): a larger S, d follows it on auto
    # up to the interval
    d = decide(run(range(1, 41), **{**waiting, "latency": 16}),
               policy(staleness_bound=15, swap_window=2, refresh_interval=20), [], config)
    assert d.changes == {"staleness_bound": 17}  # lead 16 at the V 2 in force
    # past the interval S alone would not move d (auto is min(S, interval)): d is set, S along
    d = decide(run(range(1, 41), **{**waiting, "latency": 5}),
               policy(staleness_bound=3, swap_window=2, refresh_interval=3), [], config)
    assert d.changes == {"swap_delay": 6, "staleness_bound": 6}
    # the operator leaves V alone: d instead, by the widest the auto window may take (the
    # interval): lead 4 at V up to 10
    d = decide(run(range(1, 41), **waiting), policy(), [], CONFIG)
    assert d.changes == {"swap_delay": 13, "staleness_bound": 13}
    # the workers cannot keep up (duty above 1): latency is queueing, capacity comes first
    d = decide(run(range(1, 41), **{**waiting, "duty": 1.3}), policy(), [], config)
    assert d.changes == {"workers": 2}
    # a p90 latency at the lead while steps wait: the tenth above it are waited for, so one
    # step more of lead (V 9 -> 8)
    d = decide(run(range(1, 41), **{**waiting, "latency": 2}), policy(), [], config)
    assert d.changes == {"swap_window": 8}
    # latency within the lead: nothing outlasts it, the usual remedies
    d = decide(run(range(1, 41), **{**waiting, "latency": 1}), policy(), [], config)
    assert d.changes == {"workers": 2}


def test_a_field_without_bounds_is_never_moved():
    config = AutopilotConfig(mode="apply", window=20, settle=5, bounds={})
    assert decide(run(range(1, 41), duty=3.0), policy(), [], config) is None


def test_transfer_waits_raise_a_budget_the_operator_bounded():
    records = run(range(1, 41), transfer_wait=0.02)
    assert decide(records, policy(host_budget_bytes=1000), [], CONFIG) is None  # not bounded
    config = AutopilotConfig(mode="apply", window=20, settle=5,
                             bounds={"host_budget_bytes": (0, 3000)})
    assert decide(records, policy(host_budget_bytes=1000), [], config).changes == \
        {"host_budget_bytes": 2000}
    config = AutopilotConfig(mode="apply", window=20, settle=5,
                             bounds={"offload_mode": ["host", "disk"]})
    assert decide(records, policy(offload_mode="disk"), [], config).changes == \
        {"offload_mode": "host"}


def test_state_on_disk_comes_nearer_in_one_move_the_bounds_allow():
    records = run(range(1, 41), transfer_wait=0.03, disk_bytes=5000)
    tight = policy(offload_mode="disk", device_budget_bytes=1000, host_budget_bytes=2000)

    def bounded(device_high: int) -> AutopilotConfig:
        return AutopilotConfig(mode="apply", window=20, settle=5, bounds={
            "device_budget_bytes": (1000, device_high), "host_budget_bytes": (2000, 16000),
            "offload_mode": ["disk", "host"]})

    # a device budget that holds the disk's share too: one move, nothing left on disk
    decision = decide(records, tight, [], bounded(8000))
    assert decision.changes == {"device_budget_bytes": 6000}
    assert "transfer_wait 30% of step time" in decision.reason
    # the bound cannot hold it all: the state goes to the host tier (no disk at all)
    assert decide(records, tight, [], bounded(4000)).changes == {"offload_mode": "host"}
    # host not allowed either: a doubled device budget, within its bound
    config = dataclasses.replace(bounded(4000), bounds={"device_budget_bytes": (1000, 4000)})
    assert decide(records, tight, [], config).changes == {"device_budget_bytes": 2000}
    # waits under 5% of the step: left alone
    calm = run(range(1, 41), transfer_wait=0.004, disk_bytes=5000)
    assert decide(calm, tight, [], bounded(8000)) is None


def test_spare_room_swaps_earlier_then_drops_a_worker():
    assert decide(run(range(1, 41), duty=0.2), policy(workers=2), [], CONFIG).changes == \
        {"workers": 1}  # fresher bases only when asked for
    # the "auto" swap window already swaps each basis as early as the blocks allow
    d = decide(run(range(1, 41), duty=0.2), policy(workers=2), [], FRESHEN)
    assert d.changes == {"workers": 1}
    d = decide(run(range(1, 41), duty=0.2), policy(workers=2, swap_window=5), [], FRESHEN)
    assert d.changes == {"swap_delay": 3}  # ceil(10 x 0.2 / 0.8): fresher bases first
    d = decide(run(range(1, 41), duty=0.05), policy(workers=2, swap_delay=2, swap_window=5),
               [], FRESHEN)
    # the duty against the round's d steps, 0.05 x 10 / 2 = 0.25, is 0.5 on one worker: under
    # 0.8; and d 1 would not be 2 steps earlier
    assert d.changes == {"workers": 1}
    # a duty of 0.2 per interval is 0.2 x 10 / 1 = 2.0 against d 1: behind, the swap delay
    # back up to S
    d = decide(run(range(1, 41), duty=0.2), policy(workers=2, swap_delay=1, swap_window=5), [],
               FRESHEN)
    assert d.changes == {"swap_delay": 10}


def test_hysteresis_a_change_does_not_call_for_its_own_undoing():
    """From duty 1.6 the autopilot aims at 0.8; at 0.8 (what the change brings) no rule acts,
    in either direction, under any objective."""
    up = decide(run(range(1, 41), duty=1.6), policy(), [], CONFIG)
    after = policy(**up.changes)
    history = [change(2, 41, {"workers": [1, 2]})]
    for objective in ("time", "energy"):
        config = AutopilotConfig(mode="apply", window=20, settle=5, spacing=30, hold=100,
                                 guard_steps=20, objective=objective)
        records = run(range(1, 41), duty=1.6) + run(range(41, 120), duty=0.8, version=2)
        assert decide(records, after, history, config) is None


def test_spacing_between_changes():
    history = [change(2, 41, {"staleness_bound": [10, 12]})]
    records = run(range(1, 41), duty=1.6) + run(range(41, 66), duty=1.6, version=2)
    assert decide(records, policy(staleness_bound=12), history, CONFIG) is None  # 25 < 30 steps
    records += run(range(66, 71), duty=1.6, version=2)
    assert decide(records, policy(staleness_bound=12), history, CONFIG).changes == {"workers": 2}


def test_operator_change_holds_its_field():
    history = [change(2, 50, {"workers": [1, 1]}, client="operator")]
    records = run(range(1, 50), duty=1.6) + run(range(50, 100), duty=1.6, version=2)
    d = decide(records, policy(), history, CONFIG)
    # workers are the operator's for now; S comes along with the interval (d = S = 10 steps
    # would be all the round has of an interval of 20)
    assert d.changes == {"refresh_interval": 20, "staleness_bound": 20}
    records += run(range(100, 151), duty=1.6, version=2)
    assert decide(records, policy(), history, CONFIG).changes == {"workers": 2}  # hold over


def test_dismissed_fields_are_held_until_the_step_given():
    records = run(range(1, 41), duty=1.6)
    d = decide(records, policy(), [], CONFIG, holds={"workers": 41})
    assert d.changes == {"refresh_interval": 20, "staleness_bound": 20}
    assert decide(records, policy(), [], CONFIG, holds={"workers": 40}).changes == {"workers": 2}


def test_quality_guard_undoes_a_change_the_loss_regressed_after():
    ups = [change(2, 41, {"swap_delay": ["auto", 2]}, reason="refresh duty 0.20 ...")]
    before = [record(s, loss=3.0 + 0.01 * (s % 2)) for s in range(21, 41)]
    worse = [record(s, loss=3.2 + 0.01 * (s % 2), version=2) for s in range(41, 61)]
    d = decide(before + worse, policy(swap_delay=2), ups, CONFIG)
    assert d.undo and d.changes == {"swap_delay": "auto"}
    assert d.reason.startswith(f"{UNDO}: train loss 3.2050 after against 3.0050 before")
    assert d.reason.endswith("after v2: swap_delay 2 -> auto")
    # noise: the same shift within the losses' spread is no regression
    noisy = [record(s, loss=3.0 + 1.0 * (s % 2)) for s in range(21, 41)]
    noisier = [record(s, loss=3.2 + 1.0 * (s % 2), version=2) for s in range(41, 61)]
    assert decide(noisy + noisier, policy(swap_delay=2), ups, CONFIG) is None
    # judged only once the guard's steps after the change are all recorded
    assert decide(before + worse[:-1], policy(swap_delay=2), ups, CONFIG) is None


def test_quality_guard_reads_eval_loss_where_there_is_one():
    ups = [change(2, 41, {"refresh_interval": [10, 25]})]
    before = run(range(21, 41)) + []
    before[-1]["eval_loss"] = 2.50
    after = run(range(41, 61), version=2)
    after[5]["eval_loss"] = 2.55  # train loss flat, eval worse by more than the tolerance
    d = decide(before + after, policy(refresh_interval=25), ups, CONFIG)
    assert d.undo and d.changes == {"refresh_interval": 10} and "eval loss 2.5500" in d.reason
    after[5]["eval_loss"] = 2.51
    assert decide(before + after, policy(refresh_interval=25), ups, CONFIG) is None


def test_an_undone_field_is_held():
    history = [change(2, 41, {"workers": [1, 2]}),
               change(3, 61, {"workers": [2, 1]}, reason=f"{UNDO}: ...")]
    records = run(range(1, 61), duty=1.6) + run(range(61, 120), duty=1.6, version=3)
    assert decide(records, policy(), history, CONFIG).changes == {"refresh_interval": 20,
                                                                  "staleness_bound": 20}


def test_operator_changes_are_never_judged_by_the_guard():
    history = [change(2, 41, {"staleness_bound": [10, 2]}, client="operator")]
    records = run(range(21, 41)) + run(range(41, 61), loss=9.0, version=2)
    assert decide(records, policy(staleness_bound=2), history, CONFIG) is None


def test_same_window_same_decision():
    records = run(range(1, 41), duty=1.37)
    first = decide(records, policy(), [], CONFIG)
    assert all(decide(records, policy(), [], CONFIG) == first for _ in range(3))
    assert first.changes == {"workers": math.ceil(1.37 / 0.8)}


@pytest.mark.parametrize("bad, field", [
    ({"mode": "auto"}, "mode"),
    ({"objective": "speed"}, "objective"),
    ({"bounds": {"lr": (1, 2)}}, "bounds.lr"),
    ({"bounds": {"workers": (2, 1)}}, "bounds.workers"),
    ({"bounds": {"workers": (0, 10**9)}}, "bounds.workers.1"),
    ({"bounds": {"offload_mode": ["host", "tape"]}}, "bounds.offload_mode.1"),
    ({"window": 0}, "window"),
    ({"freshen": 1}, "freshen"),
    ({"guard_tolerance": float("nan")}, "guard_tolerance"),
])
def test_bad_settings_name_the_field(bad, field):
    with pytest.raises(AutopilotError) as err:
        AutopilotConfig(**bad)
    assert err.value.field == field
    assert "allowed" in str(err.value)
