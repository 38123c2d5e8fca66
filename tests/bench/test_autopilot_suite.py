"""`asteria bench autopilot --quick`: its four scenarios, each beside its starting policy and a
static grid; the target loss, the times to it and the headline figures (a file of its own: it
is one of the suite's longest tests, and xdist spreads files, not tests)."""

from __future__ import annotations

import pytest

from tests.bench.test_suites_small import check_common, finite_positive, load, options, worded


def test_autopilot_suite_runs_its_scenarios_beside_the_start_and_a_static_grid(tmp_path,
                                                                               monkeypatch):
    suite = load("autopilot")
    # Smaller than --quick: two turns of a narrower model (scenario d's torchrun jobs as quick)
    monkeypatch.setitem(suite.STEPS, "quick", 20)
    monkeypatch.setitem(suite.MODEL, "quick", ["--model.n_embd", "64", "--model.n_head", "4",
                                               "--model.n_layer", "2", "--data.batch_size", "4"])
    opts = options(tmp_path, "autopilot")
    suite.run(opts)
    data = worded(opts.out_dir, "autopilot")
    check_common(data, "autopilot", opts.out_dir)
    assert [sc["name"] for sc in data["runs"]] == [
        "a: refresh-bound", "b: CPU hog mid-run", "c: tier budget too tight",
        "d: two ranks, one slowed"]
    for sc in data["runs"]:
        labels = [r["label"] for r in sc["runs"]]
        assert labels[1] == f"autopilot (from {labels[0]})"
        best = min(r["final_turn_loss"] for r in sc["runs"])
        assert sc["target_loss"] == pytest.approx(best + 0.02)  # the best final + tolerance
        for r in sc["runs"]:
            assert len(r["loss"]) == sc["steps"]
            if r["final_turn_loss"] <= sc["target_loss"]:  # by its last turn at the latest
                assert finite_positive(r["to_target_s"])
            for change in r["policy_changes"]:  # only the autopilot changes a policy here
                assert r["label"] == labels[1] and change["client"] == "autopilot"
                assert change["reason"]
    tiers = data["runs"][2]["runs"]
    assert tiers[0]["idle_s"].get("transfer_wait", 0) > 0  # the tight tiers do wait
    ranks = data["runs"][3]["runs"]
    assert ranks[0]["idle_s"]["sync_wait"] > 0  # rank 0 waits for the slowed rank 1
    assert sum(sc["met"] for sc in data["runs"]) == data["headline"]["autopilot_goals_met"][
        "value"]
    assert any("the autopilot made" in f for f in data["findings"])
