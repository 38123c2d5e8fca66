"""The sharded mode (asteria_core/distributed/sharded.py) under torchrun on gloo: each rank keeps
only its own parameters' state, replicas stay identical bit for bit, the run equals the
single-process one on the same global batch, and a killed job resumes exactly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from asteria_core.distributed.sharded import ShardedState, assign_param_owners, device_backend
from tests.backend.conftest import free_port
from tests.distributed.test_ddp import SCRIPT, STEPS, ranks, relative, torchrun

pytestmark = pytest.mark.multiproc
SHARDED = ("--state", "sharded")


@pytest.fixture(scope="module")
def exact(tmp_path_factory):
    """One sharded run with exact updates, read by the tests below (one torchrun job less)."""
    out = tmp_path_factory.mktemp("sharded-exact")
    torchrun(out, *SHARDED)
    return out


def test_each_rank_keeps_only_its_parameters_state_and_replicas_stay_identical(exact,
                                                                              reference):
    params, reports = ranks(exact, 2)
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    single_params, single_report = reference
    assert relative(params[0], single_params) < 1e-5
    # Every parameter's state lives on exactly one rank, and together they are one process's.
    owned = [set(r["stateful_params"]) for r in reports]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    assert owned[0] | owned[1] == set(single_report["stateful_params"])
    assert sum(r["state_bytes"] for r in reports) == single_report["state_bytes"]
    assert all(r["state_bytes"] < single_report["state_bytes"] for r in reports)
    for r in reports:  # no basis travels: each rank refreshes its own parameters' blocks
        assert r["bytes_sent"] is None and r["distributed"]["owned_blocks"] > 0
        sent, received = r["distributed"]["bytes_sent"], r["distributed"]["bytes_received"]
        assert sent > 0 and received > 0  # its parameters out, the other's in, every step
        assert max(s["staleness_max"] for s in r["steps"]) <= 3  # the bound after the change


def test_bf16_updates_keep_replicas_identical_with_half_the_bytes(tmp_path, exact, reference):
    bf16 = tmp_path / "bf16"
    torchrun(bf16, *SHARDED, "--update-dtype", "bf16")
    params, reports = ranks(bf16, 2)
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    assert 0 < relative(params[0], reference[0]) < 0.05  # rounded updates: close, not equal
    _, exact_reports = ranks(exact, 2)
    # float64 parameters here: their exact values take 8 bytes, a bf16 change 2 (the policy
    # sync's bytes, the same in both, aside).
    def updates(reports):
        return [r["distributed"]["bytes_sent"] + r["distributed"]["bytes_received"]
                - sum(r["policy_bytes"]) for r in reports]

    assert [4 * u for u in updates(reports)] == updates(exact_reports)
    assert all(u > 0 for u in updates(reports))


def test_a_killed_sharded_job_resumes_exactly(tmp_path):
    straight = tmp_path / "straight"
    torchrun(straight, *SHARDED, "--checkpoint-every", "10")
    expected = [torch.load(straight / f"rank{r}.pt") for r in range(2)]
    died = tmp_path / "died"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(SCRIPT), "--steps", str(STEPS), "--out",
         str(died), *SHARDED, "--checkpoint-every", "10", "--die-at-step", "15"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Signal 9 (SIGKILL)" in proc.stderr
    torchrun(died, *SHARDED, "--checkpoint-every", "10")
    params, reports = ranks(died, 2)
    for got, want in zip(params, expected, strict=True):
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert reports[0]["steps"][0]["step"] == 11


def test_parameter_owners_balance_state_and_agree_everywhere():
    costs = [100, 10, 100, 10, 60, 40]
    owners = assign_param_owners(costs, 2)
    assert owners == assign_param_owners(list(costs), 2)
    load = [sum(c for c, o in zip(costs, owners, strict=True) if o == r) for r in range(2)]
    assert abs(load[0] - load[1]) <= max(costs) and owners[0] == 0 and owners[2] == 1


def test_per_step_broadcasts_go_over_the_backend_of_the_parameters_device():
    """CUDA tensors over NCCL (gloo would stage every step's parameters through host memory),
    host tensors over gloo; a device without a backend is refused, naming it."""
    assert device_backend(torch.device("cuda", 1)) == "nccl"
    assert device_backend(torch.device("cpu")) == "gloo"
    with pytest.raises(ValueError, match="device: got meta"):
        device_backend(torch.device("meta"))


def one_rank_group(backend: str):
    """A real one-rank process group (torch.distributed, in this process)."""
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def test_host_parameters_step_group_is_gloo_made_at_the_first_step():
    one_rank_group("gloo")
    try:
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = ShardedState(opt, 0, 1)
        assert state.backend is None  # not before the parameters are where they train
        model(torch.ones(2, 4)).sum().backward()
        state.before_step()
        opt.step()
        state.after_step()
        assert state.backend == "gloo"
        assert dist.get_backend(state.step_group()) == "gloo"
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_cuda_parameters_step_group_is_nccl_even_when_built_on_the_host():
    """The optimizer is built before `model.cuda()`: the group follows where the parameters
    are at the first step."""
    one_rank_group("nccl")
    try:
        model = torch.nn.Linear(4, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = ShardedState(opt, 0, 1)
        model.cuda()
        model(torch.ones(2, 4, device="cuda")).sum().backward()
        state.before_step()
        opt.step()
        state.after_step()
        assert state.backend == "nccl"
        assert dist.get_backend(state.step_group()) == "nccl"
    finally:
        dist.destroy_process_group()
