"""Muon (asteria_core/optim/muon.py) against torch.optim.Muon (hidden matrices) with
torch.optim.AdamW (the rest), the reference arrangement, over 100 steps of a small GPT."""

from __future__ import annotations

import copy

import pytest
import torch

from asteria_core.optim.muon import NS_COEFFICIENTS, Muon, hidden_matrices
from asteria_core.train.config import ModelConfig
from asteria_core.train.model import GPT
from tests.components import missing

if not hasattr(torch.optim, "Muon"):
    missing("torch.optim.Muon, the reference Muon is held to (torch 2.9 and later have it)")


def small_gpt(dtype: torch.dtype, tie: bool = True) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16, block_size=8,
                           tie_weights=tie)).to(dtype)


def batches(count: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (4, 8), generator=g) for _ in range(count)]


def train(model: GPT, opts: list[torch.optim.Optimizer], data: list[torch.Tensor]) -> None:
    for idx in data:
        _, loss = model(idx, idx)
        loss.backward()
        for opt in opts:
            opt.step()
        for opt in opts:
            opt.zero_grad(set_to_none=True)


def ours_and_torchs(dtype: torch.dtype, **muon: object) -> tuple[float, float]:
    """Largest |difference| over every parameter after 100 steps, and the largest |value|."""
    kw = {"lr": 0.02, "weight_decay": 0.1, **muon}
    ours_model = small_gpt(dtype)
    theirs_model = copy.deepcopy(ours_model)
    hidden_ids = {id(p) for p in hidden_matrices(ours_model)}
    ours = Muon(ours_model.parameters(), hidden=hidden_matrices(ours_model), adamw_lr=3e-3,
                adamw_betas=(0.9, 0.95), adamw_eps=1e-8, **kw)
    # Same parameter order on the other copy: index by position.
    pairs = list(zip(ours_model.parameters(), theirs_model.parameters(), strict=True))
    hidden = [t for o, t in pairs if id(o) in hidden_ids]
    rest = [t for o, t in pairs if id(o) not in hidden_ids]
    theirs = [torch.optim.Muon(hidden, **kw),
              torch.optim.AdamW(rest, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)]
    data = batches(100)
    train(ours_model, [ours], data)
    train(theirs_model, theirs, data)
    diff = max(float((o - t).detach().abs().max()) for o, t in zip(ours_model.parameters(),
                                                          theirs_model.parameters(), strict=True))
    scale = max(float(t.detach().abs().max()) for t in theirs_model.parameters())
    return diff, scale


@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw"])
def test_float64_equals_torch_muon_with_adamw_over_100_steps(adjust_lr_fn):
    diff, _ = ours_and_torchs(torch.float64, adjust_lr_fn=adjust_lr_fn)
    assert diff <= 1e-10


def test_float32_equals_torch_muon_with_adamw_to_float32_tolerance():
    diff, scale = ours_and_torchs(torch.float32, momentum=0.9, nesterov=False, ns_steps=4)
    assert diff <= 1e-5 * max(1.0, scale)


def test_the_reference_settings_are_the_defaults():
    group = Muon([torch.zeros(3, 4, requires_grad=True)]).param_groups[0]
    assert group["ns_coefficients"] == NS_COEFFICIENTS == (3.4445, -4.7750, 2.0315)
    assert (group["ns_steps"], group["momentum"], group["nesterov"]) == (5, 0.95, True)
    assert group["adjust_lr_fn"] == "original" and group["ns_dtype"] == "bfloat16"


@pytest.mark.parametrize("tie", [True, False])
def test_hidden_matrices_leave_out_embeddings_head_and_vectors(tie):
    model = small_gpt(torch.float32, tie=tie)
    hidden = {id(p) for p in hidden_matrices(model)}
    names = {n for n, p in model.named_parameters() if id(p) in hidden}
    assert names == {f"blocks.{i}.{m}.weight" for i in range(2)
                     for m in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")}
    assert id(model.lm_head.weight) not in hidden and id(model.wte.weight) not in hidden


def test_groups_split_muon_first_and_keep_their_own_settings():
    model = small_gpt(torch.float32, tie=False)
    opt = Muon([{"params": [p for p in model.parameters() if p.dim() >= 2],
                 "weight_decay": 0.1},
                {"params": [p for p in model.parameters() if p.dim() < 2],
                 "weight_decay": 0.0}],
               lr=0.02, adamw_lr=1e-3, hidden=hidden_matrices(model))
    flags = [(g["use_muon"], g["lr"], g["weight_decay"], len(g["params"]))
             for g in opt.param_groups]
    assert flags == [(True, 0.02, 0.1, 8), (False, 1e-3, 0.1, 3), (False, 1e-3, 0.0, 5)]


def test_without_hidden_every_matrix_is_muons_as_in_torch():
    w, b = torch.zeros(3, 4, requires_grad=True), torch.zeros(3, requires_grad=True)
    opt = Muon([w, b])
    assert [(g["use_muon"], g["params"]) for g in opt.param_groups] == [(True, [w]),
                                                                         (False, [b])]


def test_checkpoint_round_trip_continues_as_uninterrupted():
    model = small_gpt(torch.float64)
    other = copy.deepcopy(model)
    data = batches(12)
    straight = Muon(model.parameters(), lr=0.02, hidden=hidden_matrices(model))
    train(model, [straight], data)
    first = Muon(other.parameters(), lr=0.02, hidden=hidden_matrices(other))
    train(other, [first], data[:6])
    resumed = Muon(other.parameters(), lr=0.02, hidden=hidden_matrices(other))
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    train(other, [resumed], data[6:])
    for a, b in zip(model.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"momentum": 1.0}, "momentum"),
    ({"ns_steps": 0}, "ns_steps"),
    ({"ns_steps": 100}, "ns_steps"),
    ({"adjust_lr_fn": "rms"}, "adjust_lr_fn"),
    ({"ns_dtype": "float16"}, "ns_dtype"),
    ({"lr": -1.0}, "lr"),
    ({"adamw_lr": -1.0}, "adamw_lr"),
    ({"adamw_betas": (0.9, 1.0)}, "adamw_betas"),
])
def test_bad_settings_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}: got .*; allowed: "):
        Muon([torch.zeros(3, 4, requires_grad=True)], **kwargs)


def test_a_muon_group_of_a_non_matrix_is_refused():
    with pytest.raises(ValueError, match="params: Muon steps 2-D matrices"):
        Muon([{"params": [torch.zeros(2, 3, 4, requires_grad=True)], "use_muon": True}])
