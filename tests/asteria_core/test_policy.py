import threading

import pytest

from asteria_core.policy import LivePolicy, Policy, PolicyError


def test_defaults_are_valid_and_serialisable():
    policy = Policy()
    assert policy.to_dict()["staleness_bound"] == 10
    assert Policy(**policy.to_dict()) == policy


def test_auto_swap_delay_follows_the_bound():
    policy = Policy()
    assert (policy.swap_delay, policy.delay) == ("auto", policy.staleness_bound)
    live = LivePolicy()
    live.propose({"staleness_bound": 3})  # nothing to lower alongside: d follows S
    live.apply_pending(1)
    assert live.current.delay == 3
    assert Policy(staleness_bound=5, swap_delay=2).delay == 2


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
    seen = []
    live.add_listener(seen.append)
    applied = live.apply_pending(5)
    assert [c.version for c in applied] == [2] and applied[0].effective_step == 6
    assert live.current.staleness_bound == 3 and live.version == 2
    assert seen == applied and live.history() == applied


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
