"""Placement never changes numerics; live budget changes migrate; checkpoints move freely."""

from __future__ import annotations

import copy

import torch

from asteria_core.policy import Policy, PolicyError
from tests.asteria_core.tiers.conftest import Run, state_bytes


def budgets(tmp_path):
    total, w = state_bytes(tmp_path / "probe")
    return {
        "device": Policy(offload_mode="none"),
        "quarter_host": Policy(offload_mode="host", device_budget_bytes=total // 4),
        "tenth_disk": Policy(offload_mode="disk", device_budget_bytes=max(total // 10, w)),
    }, total, w


def test_same_parameters_bit_for_bit_under_any_budgets(tmp_path):
    policies, total, w = budgets(tmp_path)
    assert w <= total // 10, "the test model's working set must fit the 10% budget"
    reference = Run(None, tmp_path / "ref")
    reference.train(50)
    for name, policy in policies.items():
        run = Run(policy, tmp_path / name)
        run.train(50)
        used = run.store.tier_bytes()
        run.close()
        assert torch.equal(run.params(), reference.params()), name
        if name == "tenth_disk":
            assert used["disk"] > 0.8 * total and used["device"] <= total // 10
            assert run.store.disk.bytes_read > 0 and run.store.disk.bytes_written > 0
        if name == "quarter_host":
            assert used["host"] >= 0.7 * total and used["disk"] == 0


def test_live_budget_change_migrates_at_the_boundary_and_continues_identically(tmp_path):
    policies, total, w = budgets(tmp_path)
    reference = Run(None, tmp_path / "ref")
    reference.train(30)
    run = Run(policies["device"], tmp_path / "live")
    run.train(10)
    change = run.live.propose({"offload_mode": "disk", "device_budget_bytes": w})
    assert change.effective_step == 12
    run.train(10)
    assert run.store.tier_bytes()["disk"] > 0.8 * total
    run.live.propose({"offload_mode": "auto", "device_budget_bytes": total // 4,
                      "host_budget_bytes": total // 2, "disk_dir": str(tmp_path / "moved")})
    run.train(10)
    used = run.store.tier_bytes()
    assert used["device"] and used["host"] and used["disk"]
    assert any((tmp_path / "moved").glob("*.bin"))
    assert not any((tmp_path / "live" / "tiers").glob("*.bin"))
    run.close()
    assert torch.equal(run.params(), reference.params())


def test_budgets_that_cannot_be_met_are_rejected_whole_and_the_run_goes_on(tmp_path):
    policies, total, w = budgets(tmp_path)
    run = Run(policies["tenth_disk"], tmp_path / "run")
    run.train(3)
    version = run.live.version
    cases = {
        "device_budget_bytes": {"device_budget_bytes": w - 1},
        "host_budget_bytes": {"offload_mode": "auto", "host_budget_bytes": w // 2},
        "disk_dir": {"disk_dir": "/proc/asteria-not-writable"},
    }
    for field, change in cases.items():
        try:
            run.live.propose({**change, "refresh_interval": 7})
        except PolicyError as err:
            assert err.field == field, (field, str(err))
        else:
            raise AssertionError(f"{change} was accepted")
    assert not run.live.pending() and run.live.version == version
    run.train(3)  # the run goes on under the old policy
    assert run.store.tier_bytes()["disk"] > 0
    run.close()


def test_state_dict_holds_tiered_state_and_resumes_under_another_placement(tmp_path):
    policies, total, w = budgets(tmp_path)
    reference = Run(None, tmp_path / "ref")
    reference.train(24)
    first = Run(policies["tenth_disk"], tmp_path / "a")
    first.train(12)
    saved = first.opt.state_dict()
    model = {k: v.clone() for k, v in first.model.state_dict().items()}
    rng = first.data.get_state()
    first.close()
    assert all(t.device.type == "cpu" for s in saved["state"].values() for t in _tensors(s))
    for name in ("quarter_host", "device"):
        resumed = Run(policies[name], tmp_path / name)
        resumed.model.load_state_dict(model)
        resumed.opt.load_state_dict(copy.deepcopy(saved))  # as from a file
        resumed.data.set_state(rng)
        resumed.steps = 12
        resumed.train(12)
        resumed.close()
        assert torch.equal(resumed.params(), reference.params()), name


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict | list):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _tensors(v)


def test_a_snapshot_under_a_tier_store_is_a_copy_even_when_lending_is_asked(tmp_path):
    """The store reuses its staging buffers for other parameters, so lending would let later
    steps overwrite a refresh's input: under a store a snapshot is always copied."""
    policies, _, _ = budgets(tmp_path)
    run = Run(policies["tenth_disk"], tmp_path / "run")
    run.train(6)
    snaps = [run.opt.snapshot(b.key, lend=True) for b in run.opt.refresh_blocks()]
    kept = [s.factor.clone() for s in snaps]
    run.train(6)
    run.close()
    assert all(torch.equal(s.factor, k) for s, k in zip(snaps, kept, strict=True))
