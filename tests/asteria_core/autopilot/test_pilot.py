"""The autopilot inside a real runtime: SOAP on a small model whose refreshes (slowed at the seam,
40 ms each) the one worker cannot keep up with. In apply mode the autopilot lengthens the refresh
interval at a boundary, as an ordinary policy change with client "autopilot" and its reason; in
propose mode it waits for the operator; off is a kill switch. The run's records replay into the
same decisions through the pure `decide` (a recorded trace is enough to reproduce them)."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from asteria_core.autopilot import (
    AUTOPILOT,
    AutopilotConfig,
    AutopilotError,
    Outcome,
    ProposalNotOpen,
    decide,
)
from asteria_core.machine import MACHINE
from asteria_core.optim import SOAP
from asteria_core.policy import Policy, PolicyError
from asteria_core.runtime import Runtime, RuntimeConfig
from tests.asteria_core.refresh.faults import SlowRefresh

pytestmark = pytest.mark.usefixtures("one_thread")

BOUNDS = {"refresh_interval": (2, 64), "workers": (1, 1)}  # one worker on any machine


def open_(pilot) -> list:
    """The autopilot's open proposals."""
    return [p for p in pilot.proposals() if p.status == Outcome.PROPOSED]


def autopilot(mode: str) -> AutopilotConfig:
    return AutopilotConfig(mode=mode, bounds=BOUNDS, window=8, settle=2, spacing=12,
                           guard_steps=8, hold=40)


class Loop:
    """A plain training loop, one step at a time."""

    def __init__(self, tmp_path, mode: str) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 12), nn.Tanh(), nn.Linear(12, 3))
        self.opt = SOAP(self.model.parameters(), lr=1e-2)
        self.g = torch.Generator().manual_seed(1)
        self.target = torch.randn(8, 3, generator=self.g)
        self.records = []
        self.runtime = Runtime(self.opt, model=self.model, config=RuntimeConfig(
            run_dir=tmp_path, refresh_fn=SlowRefresh(0.04), autopilot=autopilot(mode),
            policy=Policy(refresh_interval=2, staleness_bound=2, workers=1)))
        self.runtime.add_listener(self.records.append)

    def steps(self, n: int) -> None:
        for _ in range(n):
            x = torch.randn(16, 8, generator=self.g)
            loss = nn.functional.mse_loss(self.model(x), x @ self.target)
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()


def test_apply_mode_lengthens_the_interval_with_its_reason_and_replays(tmp_path):
    loop = Loop(tmp_path, "apply")
    with loop.runtime:
        loop.steps(60)
    history = loop.runtime.policy.history()
    assert history, "the autopilot changed nothing although the worker could not keep up"
    first = history[0]
    assert first.client == AUTOPILOT
    assert set(first.diff) == {"refresh_interval"}  # workers are bounded to 1
    old, new = first.diff["refresh_interval"]
    assert new > old == 2
    assert "refresh_wait" in first.reason and first.reason.endswith(
        f"refresh_interval {old} -> {new}")
    # in force from its effective step, as any change: the records say so
    at = {r.step: r for r in loop.records}
    assert at[first.effective_step].policy_version == first.version
    assert at[first.effective_step - 1].policy_version == first.version - 1
    # the record's autopilot section counts it (what /metrics reads)
    last = loop.records[-1].autopilot
    assert last.mode == "apply" and last.open_proposals == 0
    assert last.decisions["refresh_interval"]["applied"] == len(history)

    # Replay: the pure decision function, fed the same records and history at each boundary,
    # decides the same changes at the same steps (a change is decided at the boundary of step
    # effective_step - 1: the records then are those of the steps before it).
    cores = loop.runtime.autopilot.cores
    assert cores == MACHINE.cores  # a single process: training and workers share them all
    config, replayed = autopilot("apply"), []
    policy = Policy(refresh_interval=2, staleness_bound=2, workers=1).to_dict()
    applied = []
    for step in range(2, 61):
        records = [r.to_dict() for r in loop.records if r.step < step]
        decision = decide(records[-100:], policy, applied, config, cores=cores)
        if decision is not None:
            replayed.append((step + 1, decision.changes, decision.reason))
            applied.append({"version": len(applied) + 2, "effective_step": step + 2,
                            "diff": {k: [policy[k], v] for k, v in decision.changes.items()},
                            "client": AUTOPILOT, "reason": decision.reason})
            policy = {**policy, **decision.changes}
    assert [(c.effective_step - 1, {k: v[1] for k, v in c.diff.items()}, c.reason)
            for c in history] == replayed


def test_propose_mode_waits_for_the_operator(tmp_path):
    loop = Loop(tmp_path, "propose")
    with loop.runtime:
        loop.steps(30)
        pilot = loop.runtime.autopilot
        [proposal] = open_(pilot)
        # later windows read other figures, but the same move keeps its proposal open: the
        # operator is not handed a new one under their hand
        loop.steps(15)
        assert [p.id for p in open_(pilot)] == [proposal.id]
        assert loop.runtime.policy.history() == []  # nothing applied on its own
        assert loop.records[-1].autopilot.open_proposals == 1
        accepted = pilot.accept(proposal.id)
        assert accepted.status == Outcome.ACCEPTED and accepted.version == 2
        with pytest.raises(AutopilotError, match="accepted, not open"):
            pilot.accept(proposal.id)
        loop.steps(40)
        [change] = loop.runtime.policy.history()
        assert change.client == AUTOPILOT and change.reason == proposal.reason
        # still behind (a refresh outlasts the S = 2 steps it may lag): the next proposal;
        # dismissed, its field is held and nothing else is proposed in its place
        [second] = open_(pilot)
        pilot.dismiss(second.id)
        loop.steps(20)
        assert open_(pilot) == []
        counts = loop.records[-1].autopilot.decisions
        assert counts[next(iter(proposal.changes))]["accepted"] == 1
        assert counts[next(iter(second.changes))]["dismissed"] == 1


def test_off_is_a_kill_switch(tmp_path):
    loop = Loop(tmp_path, "propose")
    with loop.runtime:
        loop.steps(30)
        pilot = loop.runtime.autopilot
        assert open_(pilot)
        pilot.set_mode("off")
        assert not open_(pilot)
        loop.steps(30)
        assert not open_(pilot)
        assert loop.runtime.policy.history() == []
        assert loop.records[-1].autopilot.mode == "off"


def test_an_operator_change_queued_first_wins_over_an_accept(tmp_path):
    loop = Loop(tmp_path, "propose")
    with loop.runtime:
        loop.steps(30)
        pilot = loop.runtime.autopilot
        [proposal] = open_(pilot)
        # later windows read other figures, but the same move keeps its proposal open: the
        # operator is not handed a new one under their hand
        loop.steps(15)
        assert [p.id for p in open_(pilot)] == [proposal.id]
        loop.runtime.policy.propose({"staleness_bound": 3}, client="operator")  # queued
        with pytest.raises(ProposalNotOpen, match="comes first"):
            pilot.accept(proposal.id)
        loop.steps(3)
        [change] = loop.runtime.policy.history()  # the operator's alone
        assert change.client == "operator" and change.diff == {"staleness_bound": (2, 3)}


def test_a_refused_change_is_held_not_asked_again_at_every_boundary(tmp_path):
    def keep_the_interval(policy) -> None:  # a runtime part's check, as tier stores add
        if policy.refresh_interval != 2:
            raise PolicyError("refresh_interval", "got a change; allowed: 2 in this test")

    loop = Loop(tmp_path, "apply")
    loop.runtime.policy.add_validator(keep_the_interval)
    with loop.runtime:
        loop.steps(60)
    assert loop.runtime.policy.history() == []  # nothing half-applied
    refused = [p for p in loop.runtime.autopilot.proposals() if p.status == Outcome.REJECTED]
    assert refused and all("refused: refresh_interval" in p.reason for p in refused)
    # asked again only once its hold is over, not at every boundary
    steps = [p.step for p in refused]
    assert all(b - a >= autopilot("apply").hold for a, b in itertools.pairwise(steps))
    assert loop.records[-1].autopilot.decisions["refresh_interval"]["rejected"] == len(steps)
