"""The optimizer's state bytes by kind: the figure, the record's `state` section that carries it
between the boundaries where it can change, and the gauge `/metrics` reads from the record."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import asteria_core as asteria
from asteria_core.policy import LivePolicy, Policy
from asteria_core.telemetry.labels import STATE_KINDS
from asteria_core.telemetry.state_bytes import StateCount, state_bytes, tensor_bytes
from asteria_core.train.config import ModelConfig
from asteria_core.train.model import GPT
from tests.asteria_core.telemetry.conftest import families, value

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))


def train(model, opt, steps: int, after=None) -> list:
    """`steps` steps of a plain loop; `after(step)` runs after each one."""
    records = []
    opt.runtime.add_listener(records.append)
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x, y = (torch.randint(0, 256, (4, 16), generator=g) for _ in range(2))
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if after is not None:
            after(i + 1)
    opt.runtime.end_step()
    return records


def train_bare(model, opt, steps: int) -> None:
    for i in range(steps):
        g = torch.Generator().manual_seed(i)
        x, y = (torch.randint(0, 256, (4, 16), generator=g) for _ in range(2))
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()


def every_tensor(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        return [t for v in value for t in every_tensor(v)]
    return []


@pytest.mark.parametrize("name", ["soap", "adamw"])
def test_the_figure_is_the_sum_of_the_states_tensor_bytes_by_kind(name):
    model = tiny_gpt()
    opt = asteria.optimizer(model, name, policy=Policy(refresh_interval=2, staleness_bound=2))
    try:
        train(model, opt, 3)
        kinds = state_bytes(opt)
    finally:
        opt.runtime.close()
    assert tuple(kinds) == STATE_KINDS
    tensors = every_tensor(dict(opt.state))
    assert tensors and sum(kinds.values()) == sum(t.numel() * t.element_size() for t in tensors)
    params = sum(p.numel() for p in model.parameters())
    assert kinds["moments"] == 2 * 4 * params  # first and second moment, fp32, per element
    if name == "soap":
        assert kinds["factors"] > 0 and kinds["bases"] == kinds["factors"]
    else:
        assert kinds["factors"] == kinds["bases"] == 0 and kinds["other"] > 0  # AdamW's steps


@dataclasses.dataclass
class Nested:
    factor: torch.Tensor
    roots: list


def test_nested_state_counts_each_tensor_once_and_placeholders_nothing():
    shared = torch.zeros(8)
    state = {"a": shared, "b": [shared, (torch.zeros(2, dtype=torch.float64),)],
             "c": Nested(torch.zeros(3), [{"x": torch.zeros(0)}]),
             "d": torch.empty(5, device="meta"), "e": torch.empty(5, device="meta")}
    assert tensor_bytes(state) == 8 * 4 + 2 * 8 + 3 * 4 + 2 * 5 * 4


def test_every_record_carries_the_states_size_at_its_step_counted_only_where_it_changed():
    """The count is carried between boundaries; it must still be the state's true size at every
    step: after the first steps build the state and after a policy change."""
    model = tiny_gpt()
    opt = asteria.optimizer(model, "soap", policy=Policy(refresh_interval=3, staleness_bound=3))
    runtime = opt.runtime
    truth = {}

    def after(step):
        truth[step] = state_bytes(opt)
        if step == 4:
            runtime.policy.propose({"staleness_bound": 2})

    try:
        records = train(model, opt, 12, after)
    finally:
        runtime.close()
    for r in records:
        assert r.state.bytes == truth[r.step], r.step
    counted = sorted({r.state.counted_step for r in records})
    assert counted[0] == 1 and len(counted) < len(records)  # carried between counts
    policy_step = next(r.step for r in records if r.policy_version == 2)
    assert policy_step - 1 in counted  # the boundary that made the change current
    assert records[0].state.bytes["bases"] > 0  # the first bases are swapped in at step 1


def test_a_factor_handed_to_another_rank_is_counted_at_the_next_boundary():
    """A rank that stops owning a block keeps an empty placeholder for its factor (a rebalance
    hands it over): the state shrank without an entry or the policy changing."""
    model = tiny_gpt()
    opt = asteria.SOAP(model.parameters(), precondition_frequency=3)
    train_bare(model, opt, 2)
    count = StateCount(opt, LivePolicy(Policy()))
    before = count(2)
    assert count(3) is before  # nothing changed: carried
    opt.factors.hand(opt.refresh_blocks()[0].key, None)
    after = count(4)
    assert after.counted_step == 4 and after.bytes == state_bytes(opt)
    assert after.bytes["factors"] < before.bytes["factors"]


def test_metrics_show_the_newest_records_state_bytes():
    model = tiny_gpt()
    opt = asteria.optimizer(model, "adamw")
    try:
        records = train(model, opt, 2)
        fams = families(opt.runtime.telemetry)
    finally:
        opt.runtime.close()
    counted = records[-1].state.bytes
    assert counted == state_bytes(opt) and counted["moments"] > 0
    for kind in STATE_KINDS:
        assert value(fams, "asteria_optimizer_state_bytes", kind=kind) == counted[kind]
