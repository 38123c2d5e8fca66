"""Muon through the runtime and the trainer: `asteria.optimizer(model, "muon")` and
`--optim.name muon` build Muon on the hidden matrices and AdamW on the rest, and run as a
first-order optimizer (records without a refresh section, no refresh engine, no tiers)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import asteria_core as asteria
from asteria_core.optim.muon import Muon
from asteria_core.train.config import ModelConfig, OptimConfig
from asteria_core.train.config_io import build_config, parse_overrides
from asteria_core.train.model import GPT
from asteria_core.train.trainer import Trainer
from asteria_core.validation import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, tie_weights=False))


def test_asteria_optimizer_muon_is_a_first_order_run_of_muon_and_adamw(tmp_path):
    model = tiny_gpt()
    opt = asteria.optimizer(model, "muon", lr=0.02, adamw_lr=1e-3,
                            records=tmp_path / "steps.jsonl")
    assert isinstance(opt, Muon)
    runtime = opt.runtime
    assert runtime.refresh is None and runtime.tiers is None and runtime.autopilot is None
    muon = [g for g in opt.param_groups if g["use_muon"]]
    assert opt.param_groups[0] is muon[0] and muon[0]["lr"] == 0.02
    hidden = {id(p) for g in muon for p in g["params"]}
    assert id(model.wte.weight) not in hidden and id(model.lm_head.weight) not in hidden
    assert all(g["lr"] == 1e-3 for g in opt.param_groups if not g["use_muon"])
    records = []
    runtime.add_listener(records.append)
    g = torch.Generator().manual_seed(0)
    with runtime:
        for _ in range(4):
            x = torch.randint(0, 256, (4, 16), generator=g)
            _, loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad()
    assert [r.step for r in records] == [1, 2, 3, 4]
    assert all(r.refresh is None and r.lr == pytest.approx(0.02) for r in records)
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["step"] == 1


def test_the_callers_hidden_matrices_win():
    model = tiny_gpt()
    only = [model.blocks[0].mlp.fc.weight]
    opt = asteria.optimizer(model, "muon", hidden=only)
    assert [g["params"] for g in opt.param_groups if g["use_muon"]] == [only]
    opt.runtime.close()


def test_second_order_options_are_refused_for_muon():
    with pytest.raises(ValueError, match="^block_size: not a Muon option"):
        asteria.build_optimizer("muon", tiny_gpt().parameters(), block_size=8)


def test_the_trainer_trains_muon_from_its_config_keys(tiny):
    config = tiny(steps=12, eval_interval=12)
    config = dataclasses.replace(config, optim=dataclasses.replace(
        config.optim, name="muon", lr=0.02, adamw_lr=2e-3, muon_scale="match_rms_adamw"))
    trainer = Trainer(config, jsonl=False)
    opt = trainer.optimizer
    assert isinstance(opt, Muon)
    assert {g["adjust_lr_fn"] for g in opt.param_groups} == {"match_rms_adamw"}
    assert [g["use_muon"] for g in opt.param_groups] == [True, False, False]
    assert opt.param_groups[1]["initial_lr"] == 2e-3  # the schedule scales each part's own
    result = trainer.train(progress=False)
    trainer.close()
    assert trainer.runtime.refresh is None
    assert result.eval_losses[12] < result.train_losses[0]


def test_command_line_keys_and_their_checks():
    config = build_config(parse_overrides([("optim.name", "muon"), ("optim.adamw_lr", "0.001"),
                                           ("optim.muon_scale", "match_rms_adamw")]))
    assert (config.optim.name, config.optim.adamw_lr, config.optim.muon_scale) == \
        ("muon", 0.001, "match_rms_adamw")
    assert OptimConfig().adamw_lr == -1.0 and OptimConfig().muon_scale == "original"
    with pytest.raises(ConfigError, match="optim.muon_scale"):
        OptimConfig(muon_scale="rms")
    with pytest.raises(ConfigError, match="optim.adamw_lr"):
        OptimConfig(adamw_lr=0.0)


def test_a_muon_run_resumes_bit_for_bit(tiny):
    from asteria_core.train import checkpoint as ckpt

    config = tiny(steps=12, eval_interval=12)
    config = dataclasses.replace(config, optim=dataclasses.replace(
        config.optim, name="muon", lr=0.02, adamw_lr=2e-3))
    straight = Trainer(config, run_id="straight", jsonl=False)
    full = straight.train(progress=False)
    straight.close()
    first = Trainer(config, run_id="stopped", jsonl=False)
    part = first.train(stop_at=5, progress=False)
    first.close()
    resumed = Trainer(dataclasses.replace(config, train=dataclasses.replace(
        config.train, resume=str(part.run_dir / ckpt.CHECKPOINT_NAME))), jsonl=False)
    rest = resumed.train(progress=False)
    resumed.close()
    assert part.train_losses + rest.train_losses == full.train_losses
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)
