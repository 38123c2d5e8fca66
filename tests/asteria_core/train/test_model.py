import pytest
import torch

from asteria_core.train.config import ModelConfig
from asteria_core.train.model import GPT


def _count(config: ModelConfig) -> int:
    with torch.device("meta"):  # shapes only: a 1B model costs no memory here
        return GPT(config).num_params()


def test_default_is_about_one_million_parameters():
    assert 0.8e6 <= _count(ModelConfig()) <= 1.2e6


@pytest.mark.parametrize(
    ("config", "lo", "hi"),
    [
        (ModelConfig(n_layer=1, n_head=2, n_embd=128), 0.15e6, 0.3e6),
        (ModelConfig(n_layer=24, n_head=16, n_embd=1856, block_size=1024), 0.9e9, 1.1e9),
    ],
)
def test_size_range_from_config_alone(config, lo, hi):
    assert lo <= _count(config) <= hi


def test_attention_is_causal():
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16)).eval()
    x = torch.randint(0, 256, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 256  # change only the future
    with torch.no_grad():
        a, _ = model(x)
        b, _ = model(y)
    torch.testing.assert_close(a[0, :10], b[0, :10], rtol=0, atol=0)
    assert not torch.allclose(a[0, 10:], b[0, 10:])


def test_weight_tying_shares_one_tensor():
    tied = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, tie_weights=True))
    untied = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, tie_weights=False))
    assert tied.lm_head.weight is tied.wte.weight
    assert untied.lm_head.weight is not untied.wte.weight
    assert untied.num_params() - tied.num_params() == 256 * 32


def test_initial_loss_is_near_uniform():
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=16))
    x, y = torch.randint(0, 256, (2, 8, 16))
    _, loss = model(x, y)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.1


def test_too_long_sequence_is_rejected():
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=8))
    with pytest.raises(ValueError, match="model.block_size"):
        model(torch.zeros(1, 9, dtype=torch.long))
