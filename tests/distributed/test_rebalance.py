"""Owners move off a straggler (asteria_core/distributed/rebalance.py): the owner map as a pure
function of measured refresh speeds, and a real 2-rank run whose rank 1 refreshes slowly."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys

import pytest
import torch

from asteria_core.distributed.rebalance import rebalanced_owners
from asteria_core.distributed.topology import Topology, assign_owners
from asteria_core.optim.seam import BlockInfo, BlockKey
from tests.backend.conftest import free_port
from tests.distributed.test_ddp import BOUND, SCRIPT, STEPS, ranks, relative, torchrun

BLOCKS = [BlockInfo(BlockKey(p, d, 0), size, float(size) ** 3)
          for p, sizes in enumerate([(32, 16), (32, 32), (16, 16), (24, 8)])
          for d, size in enumerate(sizes)]


def owners_of(world: int) -> dict[BlockKey, int]:
    return assign_owners(BLOCKS, Topology(world=world, rank=0, local_world=world))


def round_seconds(owners: dict[BlockKey, int], rates: list[float]) -> list[float]:
    load = [0.0] * len(rates)
    for b in BLOCKS:
        load[owners[b.key]] += b.cost * rates[owners[b.key]]
    return load


def test_equal_speeds_keep_the_owners():
    owners = owners_of(2)
    assert rebalanced_owners(BLOCKS, owners, [1e-9, 1e-9]) is owners
    assert rebalanced_owners(BLOCKS, owners, [1e-9, 1.1e-9]) is owners  # within the gain
    assert rebalanced_owners(BLOCKS, owners, [math.nan, math.nan]) is owners  # none measured


@pytest.mark.parametrize("world,slow", [(2, 1), (3, 0), (4, 2)])
def test_a_slow_rank_gives_blocks_away_until_the_rounds_even_out(world, slow):
    owners = owners_of(world)
    rates = [1e-9] * world
    rates[slow] = 4e-9
    moved = rebalanced_owners(BLOCKS, owners, rates)
    assert moved is not owners and set(moved) == set(owners)
    before, after = round_seconds(owners, rates), round_seconds(moved, rates)
    assert max(after) <= 0.8 * max(before)
    assert after[slow] < before[slow]
    # Deterministic: every rank computes the same map from the same numbers.
    assert rebalanced_owners(BLOCKS, dict(owners), list(rates)) == moved
    # An unmeasured rank counts as the median of the measured ones.
    other = (slow + 1) % world
    unmeasured = [math.nan if r == other else x for r, x in enumerate(rates)]
    median = statistics.median(x for r, x in enumerate(rates) if r != other)
    as_median = [median if r == other else x for r, x in enumerate(rates)]
    assert rebalanced_owners(BLOCKS, owners, unmeasured) == \
        rebalanced_owners(BLOCKS, owners, as_median)


def test_a_recovered_rank_takes_blocks_back():
    owners = owners_of(2)
    moved = rebalanced_owners(BLOCKS, owners, [1e-9, 5e-9])
    back = rebalanced_owners(BLOCKS, moved, [1e-9, 1e-9])
    assert max(round_seconds(back, [1, 1])) <= 0.8 * max(round_seconds(moved, [1, 1]))


@pytest.mark.multiproc
def test_owners_move_off_a_slow_rank_and_replicas_stay_identical(tmp_path, reference):
    """Rank 1's refreshes take 50 ms more each: after the first share of speeds its blocks move
    to rank 0, factor statistics with them. The run still equals the single-process run on the
    same global batch (a moved factor that lost its history would change every later basis),
    replicas are identical, and staleness stays within S through the move."""
    torchrun(tmp_path, "--slow-rank", "1", "--slow-seconds", "0.05", "--rebalance-rounds", "1")
    params, reports = ranks(tmp_path, 2)
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    single_params, _ = reference
    assert relative(params[0], single_params) < 1e-5
    owned = [[s["owned_blocks"] for s in r["steps"]] for r in reports]
    blocks = reports[0]["blocks"]
    assert owned[0][0] + owned[1][0] == blocks and owned[0][0] == owned[1][0]  # cost-balanced
    assert owned[1][-1] < owned[1][0] and owned[0][-1] + owned[1][-1] == blocks  # moved off
    for r in reports:
        assert max(s["staleness_max"] for s in r["steps"]) <= BOUND + 1  # S = 3 after step 7
        assert all(s["failures"] == 0 for s in r["steps"])


@pytest.mark.multiproc
def test_a_job_that_moved_owners_resumes_exactly_from_its_checkpoints(tmp_path):
    """Owners moved before the checkpoint at step 10 (rank 1 is slow); the job is killed at 15
    and launched again: each rank finds the factors it held at the checkpoint, the owner map
    follows them, and the run ends where the uninterrupted one ends, bit for bit."""
    args = ("--slow-rank", "1", "--slow-seconds", "0.05", "--rebalance-rounds", "1",
            "--checkpoint-every", "10")
    straight = tmp_path / "straight"
    torchrun(straight, *args)
    expected = [torch.load(straight / f"rank{r}.pt") for r in range(2)]
    died = tmp_path / "died"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(SCRIPT), "--steps", str(STEPS), "--out",
         str(died), *args, "--die-at-step", "15"], capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Signal 9 (SIGKILL)" in proc.stderr
    torchrun(died, *args)
    params, reports = ranks(died, 2)
    for got, want in zip(params, expected, strict=True):
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert reports[0]["steps"][0]["step"] == 11
