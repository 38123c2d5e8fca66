"""Must-show: on a stochastic least-squares problem whose inputs have a randomly rotated
covariance of condition number 1e4 (16x32 weights, batch 64), SOAP and Shampoo at their best lr
reach 1e-4 of the initial loss in at least 2x fewer steps than AdamW at its best lr.

Every optimizer gets the same lr grid and the same data stream; step counts are computed here
on every run (nothing cached), and no wall-clock threshold is involved. Measured here (seed 0):
AdamW 648 steps (lr 0.16), SOAP 236 (lr 0.063), Shampoo 100 (lr 0.4), KL-Shampoo 314
(lr 0.063): SOAP 2.7x, Shampoo 6.5x, KL-Shampoo 2.1x fewer steps than AdamW.
(On a deterministic quadratic or at a loose tolerance such as 1e-2 AdamW is as fast, which is
why the test uses the stochastic problem and the 1e-4 target.)
"""

from __future__ import annotations

import pytest
import torch

from asteria_core.optim import SOAP, KLShampoo, Shampoo
from tests.asteria_core.optim.problems import Regression

LRS = (0.016, 0.025, 0.04, 0.063, 0.1, 0.16, 0.25, 0.4)
CAP = 1500  # AdamW needs ~650 at its best; runs stop at the best count found so far


@pytest.fixture(scope="module")
def adamw_steps():
    steps, per_lr = Regression().best_steps(
        lambda lr: lambda params: torch.optim.AdamW(params, lr=lr, weight_decay=0.0), LRS, CAP)
    assert steps is not None, per_lr
    return steps


@pytest.mark.parametrize("name,make,speedup", [
    ("soap", lambda lr: lambda params: SOAP(params, lr=lr, weight_decay=0.0), 2.0),
    ("shampoo", lambda lr: lambda params: Shampoo(params, lr=lr), 2.0),
    # not a must-show; a sanity bound that KL-Shampoo preconditions at all
    ("kl_shampoo", lambda lr: lambda params: KLShampoo(params, lr=lr, weight_decay=0.0), 1.5),
])
def test_second_order_reaches_1e4_in_fewer_steps_than_adamw(adamw_steps, name, make, speedup):
    steps, per_lr = Regression().best_steps(make, LRS, CAP)
    assert steps is not None, per_lr
    assert steps * speedup <= adamw_steps, (name, steps, adamw_steps, per_lr)
