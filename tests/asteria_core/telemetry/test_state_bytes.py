"""The optimizer's state bytes by kind: the figure, the record's `state` section that carries it
at its cadence, and the gauge `/metrics` reads from the record."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import asteria_core as asteria
from asteria_core.policy import Policy
from asteria_core.telemetry.labels import STATE_KINDS
from asteria_core.telemetry.state_bytes import state_bytes, tensor_bytes
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


def test_records_carry_the_count_of_the_first_step_of_each_interval_and_of_a_policy_change():
    model = tiny_gpt()
    opt = asteria.optimizer(model, "soap", policy=Policy(refresh_interval=3, staleness_bound=3))
    runtime = opt.runtime
    counts = {}

    def after(step):
        counts[step] = state_bytes(opt)
        if step == 4:
            runtime.policy.propose({"staleness_bound": 2})

    try:
        records = train(model, opt, 8, after)
    finally:
        runtime.close()
    assert [r.state.counted_step for r in records] == [1, 1, 3, 3, 5, 6, 6, 6]
    for r in records:
        assert r.state.bytes == counts[r.state.counted_step]
    assert records[0].state.bytes["bases"] > 0  # the first bases are swapped in at step 1


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
