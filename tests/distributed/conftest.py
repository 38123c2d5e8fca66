"""The single-process reference of ddp_train.py, shared by the data-parallel test modules."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.test_ddp import single


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> tuple[dict[str, torch.Tensor], dict]:
    """The single-process run on the same global batch with the same swap schedule
    (`ddp_train.py --single`): deterministic, so one per test process serves test_ddp,
    test_sharded and test_rebalance alike."""
    return single(tmp_path_factory.mktemp("single"))
