"""Shared fixtures: tiny configs that train in milliseconds per step on CPU."""

from __future__ import annotations

import pytest
import torch

from asteria_core.train.config import DataConfig, ModelConfig, OptimConfig, RunConfig, TrainConfig


def tiny_config(tmp_path, **train) -> RunConfig:
    """A ~30K-parameter GPT on the embedded corpus, with dropout so RNG state matters."""
    train_kw = {"steps": 40, "eval_interval": 20, "eval_batches": 2, "out_dir": str(tmp_path),
                "threads": 1}
    train_kw.update(train)
    return RunConfig(
        model=ModelConfig(n_layer=2, n_head=2, n_embd=32, block_size=32, dropout=0.1),
        optim=OptimConfig(lr=3e-3, warmup_steps=5),
        data=DataConfig(batch_size=4),
        train=TrainConfig(**train_kw),
    )


@pytest.fixture
def tiny(tmp_path):
    return lambda **train: tiny_config(tmp_path, **train)


@pytest.fixture
def one_thread():
    """One torch intra-op thread for the test: bit-exact comparisons need the same thread count
    on both sides (modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
