import dataclasses
import threading

import pytest

import asteria_core.policy as policy_module
from asteria_core.fields import Setting
from asteria_core.policy import (
    FIELDS,
    LivePolicy,
    Policy,
    PolicyBusy,
    PolicyError,
    policy_fields,
)


def test_defaults_are_valid_and_serialisable():
    policy = Policy()
    assert policy.to_dict()["staleness_bound"] == 10
    assert Policy(**policy.to_dict()) == policy


def test_auto_swap_delay_is_the_interval_at_most_the_bound():
    policy = Policy()
    assert (policy.swap_delay, policy.delay) == ("auto", policy.staleness_bound)  # S = 10 = I
    live = LivePolicy()
    live.propose({"staleness_bound": 3})  # nothing to lower alongside: d follows S
    live.apply_pending(1)
    assert live.current.delay == 3
    live.propose({"staleness_bound": 10, "refresh_interval": 2})  # one round in flight
    live.apply_pending(2)
    assert live.current.delay == 2
    assert Policy(staleness_bound=5, swap_delay=2).delay == 2
    assert Policy(staleness_bound=5, swap_delay=4, refresh_interval=1).delay == 4


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"staleness_bound": -1}, "staleness_bound"),
        ({"refresh_interval": 0}, "refresh_interval"),
        ({"refresh_interval": "5"}, "refresh_interval"),
        ({"workers": True}, "workers"),
        ({"swap_mode": "eager"}, "swap_mode"),
        ({"swap_delay": 11}, "swap_delay"),  # > staleness_bound 10
        ({"swap_delay": "soon"}, "swap_delay"),
        ({"swap_mode": "opportunistic", "workers": 0}, "workers"),
        ({"offload_mode": "tape"}, "offload_mode"),
        ({"stalenes_bound": 3}, "stalenes_bound"),
        ({"disk_dir": 5}, "disk_dir"),
    ],
)
def test_invalid_changes_are_rejected_whole_naming_the_field(changes, field):
    live = LivePolicy()
    before = (live.current, live.version)
    with pytest.raises(PolicyError) as err:
        live.propose({"refresh_interval": 20, **changes})
    assert err.value.field == field and str(err.value).startswith(field)
    assert (live.current, live.version) == before
    assert live.pending() == [] and live.apply_pending(1) == []


def test_cross_field_rule_applies_to_the_resulting_policy():
    live = LivePolicy(Policy(staleness_bound=4, swap_delay=3))
    with pytest.raises(PolicyError, match="swap_delay"):
        live.propose({"staleness_bound": 2})
    live.propose({"staleness_bound": 2, "swap_delay": 2})


def test_change_is_versioned_and_applied_at_the_next_boundary():
    live = LivePolicy(start_step=0)
    live.apply_pending(4)  # boundary after step 4
    change = live.propose({"staleness_bound": 3, "swap_delay": 1}, client="alice")
    assert change.version == 2 and change.effective_step == 6
    assert change.diff == {"staleness_bound": (10, 3), "swap_delay": ("auto", 1)}
    assert live.current.staleness_bound == 10  # not before the boundary
    applied = live.apply_pending(5)
    assert [c.version for c in applied] == [2] and applied[0].effective_step == 6
    assert live.current.staleness_bound == 3 and live.version == 2
    assert live.history() == applied == live.applied_after(1)
    assert live.applied_after(2) == []


def test_data_parallel_change_is_applied_at_the_step_it_was_promised():
    """Rank 0 applies what it announced at a boundary, then takes what was queued since: a
    change queued between the two is taken at this boundary, and its promise says so."""
    live = LivePolicy(start_step=0)
    live.apply_after = 2
    policy, version, taken = live.take_pending(40)
    live.apply(policy, version, taken, step=41)
    change = live.propose({"staleness_bound": 3})  # between apply and take at boundary 41
    policy, version, taken = live.take_pending(41)
    assert taken == [change]
    [applied] = live.apply(policy, version, taken, step=42)
    assert applied.effective_step == change.effective_step == 43


def test_a_change_queued_again_after_a_restart_keeps_the_step_it_was_promised():
    """Resumed from a checkpoint of step 20, a change once promised for step 31 is in force
    from 31, not from the resumed run's first boundary, and one queued behind it waits for it;
    in one process and in a data-parallel run alike."""
    live = LivePolicy(start_step=20)
    again = live.propose({"staleness_bound": 3}, version=2, not_before=31)
    later = live.propose({"swap_delay": 3})
    assert (again.effective_step, later.effective_step) == (31, 31)
    assert all(live.apply_pending(step) == [] for step in range(20, 30))
    applied = live.apply_pending(30)
    assert [(c.version, c.effective_step) for c in applied] == [(2, 31), (3, 31)]
    assert live.current.staleness_bound == 3 and live.current.swap_delay == 3

    ranked = LivePolicy(start_step=20)
    ranked.apply_after = 2
    again = ranked.propose({"staleness_bound": 3}, version=2, not_before=31)
    for step in range(20, 29):
        assert ranked.take_pending(step)[2] == []
    policy, version, taken = ranked.take_pending(29)
    assert taken == [again] and version == 2 and policy.staleness_bound == 3
    [applied] = ranked.apply(policy, version, taken, step=30)
    assert applied.effective_step == 31


def test_a_change_promised_for_a_step_already_passed_takes_the_first_free_one():
    live = LivePolicy(start_step=40)
    change = live.propose({"staleness_bound": 3}, version=2, not_before=31)
    assert change.effective_step == 42
    assert [c.effective_step for c in live.apply_pending(41)] == [42]


def test_changes_queued_together_build_on_each_other():
    live = LivePolicy()
    live.propose({"staleness_bound": 5})
    with pytest.raises(PolicyError, match="swap_delay"):
        live.propose({"swap_delay": 6})  # checked against the queued bound of 5
    live.propose({"swap_delay": 5})
    applied = live.apply_pending(1)
    assert [c.version for c in applied] == [2, 3]
    assert (live.current.staleness_bound, live.current.swap_delay, live.version) == (5, 5, 3)


def test_runtime_validators_reject_whole():
    live = LivePolicy()

    def writable_only(policy: Policy) -> None:
        if policy.disk_dir == "/proc":
            raise PolicyError("disk_dir", "'/proc' is not writable")

    live.add_validator(writable_only)
    with pytest.raises(PolicyError, match="disk_dir: '/proc' is not writable"):
        live.propose({"disk_dir": "/proc", "workers": 2})
    assert live.current.workers == 1 and live.pending() == []


def test_concurrent_proposals_get_distinct_versions():
    live = LivePolicy()
    threads = [threading.Thread(target=live.propose, args=({"refresh_interval": i + 1},))
               for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = [c.version for c in live.apply_pending(1)]
    assert sorted(versions) == list(range(2, 22)) and live.version == 21


def _bad_values(field: Setting) -> list:
    """Values each kind must refuse: out of range, the wrong JSON type, bool for int."""
    match field.kind:
        case "int" | "auto_or_int":
            return [field.minimum - 1, field.maximum + 1, True, "5", 1.0]
        case "choice":
            return ["nope", 1, None]
        case "bool":
            return [1, "true", None]
        case _:
            return [5, "x" * (field.max_length + 1), None]


@pytest.mark.parametrize("field", policy_fields(), ids=lambda f: f.name)
def test_each_field_is_validated_by_its_description(field):
    assert field.help and field.title and getattr(Policy(), field.name) == field.default
    for value in _bad_values(field):
        with pytest.raises(PolicyError) as err:
            Policy(**{field.name: value})
        assert err.value.field == field.name
        assert str(err.value).endswith(f"; allowed: {field.allowed()}")
    if field.kind in ("int", "auto_or_int"):  # the bounds themselves are allowed
        bound = {"staleness_bound": field.maximum} if field.name == "swap_delay" else {}
        Policy(**{**bound, field.name: field.minimum})
        Policy(**{**bound, field.name: field.maximum})


def test_a_field_added_to_a_subclass_is_described_and_validated():
    @dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
    class Wider(Policy):
        prefetch: int = policy_module._int(2, 0, 8, "Prefetch", "Blocks fetched ahead.")

    described = {f.name: f for f in policy_fields(Wider)}
    assert list(described) == [*FIELDS, "prefetch"]
    assert (described["prefetch"].minimum, described["prefetch"].maximum) == (0, 8)
    with pytest.raises(PolicyError, match=r"prefetch: got 9; allowed: an integer in \[0, 8\]"):
        Wider(prefetch=9)


def test_a_change_held_by_proposing_is_queued_only_if_the_block_ends_cleanly():
    """The control plane stores a change inside `proposing`: a store that fails leaves nothing
    queued, and its version is never given to another change (a write that failed may still
    have reached the disk); one that succeeds queues exactly the change it stored."""
    live = LivePolicy(Policy())
    with pytest.raises(OSError, match="disk full"), \
            live.proposing({"staleness_bound": 3}, client="op") as change:
        assert change.version == 2  # held: not yet queued
        raise OSError("disk full")
    assert live.pending() == [] and live.apply_pending(1) == []
    assert live.current.staleness_bound == 10
    with live.proposing({"staleness_bound": 4}, client="op") as stored:
        pass
    assert live.pending() == [stored] and stored.version == 3
    [applied] = live.apply_pending(2)
    assert applied.version == 3 and live.current.staleness_bound == 4


def test_a_staged_change_holds_no_lock_the_step_boundary_takes():
    """While a change is staged (the control plane writing it to disk), the boundary applies
    and reads go on at once; a second proposal waits for the slot or is told it is busy."""
    live = LivePolicy(Policy())
    staged = live.stage({"staleness_bound": 3}, client="op")
    assert live.apply_pending(1) == [] and live.pending() == [] and live.version == 1
    with pytest.raises(PolicyBusy):
        live.propose({"refresh_interval": 5})
    live.queue(staged)
    later = live.propose({"refresh_interval": 5})
    assert (staged.version, later.version) == (2, 3)
    assert [c.version for c in live.apply_pending(2)] == [2, 3]


def test_versions_continue_above_those_a_store_has_seen():
    live = LivePolicy(Policy(), version=4, issued=9)  # versions up to 9 were given out before
    assert live.propose({"staleness_bound": 3}).version == 10
