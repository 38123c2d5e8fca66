"""The runtime in a loop that tells it nothing: what its hooks see, and what a loop may add."""

from __future__ import annotations

import pytest
import torch

import asteria_core as asteria
from asteria_core.telemetry.timing import PHASES
from asteria_core.train.config import ModelConfig
from asteria_core.train.model import GPT

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (4, 16), generator=g),
            torch.randint(0, 256, (4, 16), generator=g))


def train(model, opt, steps: int, **kw) -> list:
    records = []
    opt.runtime.add_listener(records.append)
    with opt.runtime:
        for i in range(steps):
            x, y = batch(i)
            _, loss = model(x, y)
            loss.backward()
            opt.step(**kw)
            opt.zero_grad()
    return records


@pytest.mark.parametrize("name", ["adamw", "soap"])
def test_a_plain_loop_gets_a_record_per_step_with_phases_tokens_and_loss(name):
    model = tiny_gpt()
    opt = asteria.optimizer(model, name, policy=asteria.Policy(refresh_interval=2,
                                                                staleness_bound=2))
    runtime = opt.runtime
    records = train(model, opt, 6)
    assert [r.step for r in records] == [1, 2, 3, 4, 5, 6]
    for r in records:
        assert r.tokens == 4 * 16 and r.loss is not None and r.loss > 0
        assert r.phase_seconds["data"] == 0.0  # not marked: the runtime cannot see it
        for phase in ("forward", "backward", "optimizer", "boundary"):
            assert r.phase_seconds[phase] > 0, (r.step, phase)
        assert sum(r.phase_seconds.values()) <= r.step_seconds
        assert set(r.timing.idle_seconds) >= {"refresh_wait", "other"}
        assert r.lr == pytest.approx(3e-3)
    assert (records[-1].refresh is None) == (name == "adamw")
    if name == "soap":
        assert all(r.refresh.staleness_max <= 2 for r in records)
        assert runtime.refresh is not None and runtime.tiers is not None
    assert runtime.closed and opt.runtime is None


def test_the_loss_is_the_one_the_model_returned_and_a_logged_one_wins():
    model = tiny_gpt()
    opt = asteria.optimizer(model, "adamw")
    seen, logged = [], []
    opt.runtime.add_listener(logged.append)
    with opt.runtime:
        for i in range(3):
            x, y = batch(i)
            _, loss = model(x, y)
            loss.backward()
            seen.append(loss.item())
            opt.step()
            opt.zero_grad()
            if i == 2:
                opt.runtime.log(loss=10.0, custom=torch.tensor(2.5))  # after step(): step 3's
    assert [r.loss for r in logged[:2]] == seen[:2]
    assert logged[2].loss == 10.0 and logged[2].extra == {"custom": 2.5}


def test_figures_logged_after_end_step_go_to_the_next_step():
    model = tiny_gpt()
    opt = asteria.optimizer(model, "adamw")
    records = []
    opt.runtime.add_listener(records.append)
    with opt.runtime:
        for i in range(2):
            opt.runtime.log(note=i)  # before the step's forward: this step's
            x, y = batch(i)
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
            opt.runtime.end_step()
    assert [r.extra["note"] for r in records] == [0, 1]


def test_an_evaluation_forward_is_no_step_and_a_marked_phase_wins():
    model = tiny_gpt()
    opt = asteria.optimizer(model, "adamw")
    records = []
    opt.runtime.add_listener(records.append)
    with opt.runtime:
        x, y = batch(0)
        with opt.runtime.phase("data"):
            x, y = batch(1)
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        model.eval()
        with torch.no_grad():
            model(x, y)
    assert len(records) == 1 and records[0].phase_seconds["data"] > 0
    assert set(records[0].phase_seconds) == set(PHASES)


def test_a_closure_step_times_forward_and_backward_inside_step():
    """Lightning's way: forward and backward run inside optimizer.step(closure)."""
    model = tiny_gpt()
    opt = asteria.optimizer(model, "soap")
    records = []
    opt.runtime.add_listener(records.append)

    def closure(i):
        def run():
            x, y = batch(i)
            _, loss = model(x, y)
            loss.backward()
            return loss
        return run

    with opt.runtime:
        for i in range(3):
            opt.step(closure(i))
            opt.zero_grad()
    assert [r.step for r in records] == [1, 2, 3]
    for r in records:
        assert r.phase_seconds["forward"] > 0 and r.phase_seconds["backward"] > 0
        assert r.phase_seconds["optimizer"] > 0 and r.loss is not None


def test_closing_detaches_every_hook_and_a_second_runtime_is_refused():
    model = tiny_gpt()
    opt = asteria.optimizer(model, "adamw")
    runtime = opt.runtime
    with pytest.raises(ValueError, match="already has a runtime"):
        asteria.Runtime(opt, model=model)
    runtime.close()
    runtime.close()  # idempotent
    x, y = batch(0)
    model(x, y)[1].backward()
    opt.step()  # a bare optimizer again: no hook runs
    assert runtime.step == 0


def test_names_and_options_are_checked():
    model = tiny_gpt()
    with pytest.raises(ValueError, match="optimizer: got 'lamb'; allowed: adamw"):
        asteria.optimizer(model, "lamb")
    with pytest.raises(ValueError, match="block_size: not an AdamW option"):
        asteria.optimizer(model, "adamw", block_size=64)
