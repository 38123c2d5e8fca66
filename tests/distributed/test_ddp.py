"""Data-parallel SOAP on real torch.distributed process groups (gloo), launched by torchrun
(`python -m torch.distributed.run`): owner ranks refresh their blocks, versioned bases travel in
the background, every rank swaps them at the same step."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from asteria_core.distributed import Topology, assign_owners
from asteria_core.distributed.policy_sync import HEADER_BYTES, MESSAGE_BYTES
from asteria_core.optim.seam import BlockInfo, BlockKey
from backend.store import RunStore
from tests.backend.conftest import free_port

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("ddp_train.py")
STEPS = 30
BOUND = 2  # ddp_train.POLICY's staleness bound


def torchrun(out: Path, *extra: str, nproc: int = 2, nnodes: int = 1) -> None:
    """Launch the run's nodes (each a torchrun of `nproc` ranks) and wait for all of them."""
    port = free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes),
         "--node-rank", str(node), "--nproc-per-node", str(nproc), "--master-addr",
         "127.0.0.1", "--master-port", str(port), str(SCRIPT), "--steps", str(STEPS),
         "--out", str(out), *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True) for node in range(nnodes)]
    for proc in nodes:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, output[-4000:]


def run_single(out: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--single", "--steps", str(STEPS), "--out",
                    str(out)], check=True, timeout=300)


def ranks(out: Path, world: int) -> tuple[list[dict], list[dict]]:
    params = [torch.load(out / f"rank{r}.pt") for r in range(world)]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return params, reports


def relative(a: dict, b: dict) -> float:
    return max(((a[k] - b[k]).norm() / b[k].norm()).item() for k in b)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """One job of 2 ranks, each serving its /metrics on any free port (base + rank could land
    on a port torchrun or gloo holds): the replicas test's and the coherence test's baseline."""
    out = tmp_path_factory.mktemp("two-ranks")
    torchrun(out, "--metrics-port", "0")
    return out


@pytest.mark.parametrize(("nnodes", "nproc"), [(1, 2), (2, 2)], ids=["2 ranks", "2 nodes x 2"])
def test_replicas_stay_identical_and_equal_the_single_process_run(request, tmp_path, reference,
                                                                  nnodes, nproc):
    world = nnodes * nproc
    if nnodes == 1:
        out = request.getfixturevalue("two_ranks")
    else:
        out = tmp_path
        torchrun(out, "--metrics-port", "0", nproc=nproc, nnodes=nnodes)
    params, reports = ranks(out, world)
    for other in params[1:]:
        assert all(torch.equal(params[0][k], other[k]) for k in params[0])
    single_params, single_report = reference
    assert relative(params[0], single_params) < 1e-5
    # Every block has one owner: refresh work and factor memory are shared, not repeated
    # (the four blocks are alike, so each rank holds 1/world of them).
    assert sum(r["owned"] for r in reports) == reports[0]["blocks"]
    assert sum(r["refreshes"] for r in reports) == single_report["refreshes"]
    for r in reports:
        assert r["owned"] == reports[0]["blocks"] // world
        assert r["factor_bytes"] == single_report["factor_bytes"] // world
    for r in reports:
        assert r["local_world"] == nproc
        # Closing the runtime ended every thread it brought: its gloo groups' threads too
        # (left to the interpreter's exit, they now and then abort the process there).
        assert r["threads_left"] <= 0, r["threads_left"]
        assert [s["step"] for s in r["steps"]] == list(range(1, STEPS + 1))
        assert max(s["staleness_max"] for s in r["steps"]) <= BOUND
        assert all(s["failures"] == 0 for s in r["steps"])
        assert r["bytes_received"] > 0 and r["bytes_sent"] > 0
        # One run, every rank observable: its record section, its own /metrics and target.
        assert r["run_id"] == "ddp-rank0"
        section = r["distributed"]  # at the last boundary; the last round travels on after it
        assert (section["rank"], section["world"], section["node"], section["owned_blocks"]) \
            == (r["rank"], world, r["rank"] // nproc, r["owned"])
        policy_sent, policy_received = r["policy_bytes"]
        assert 0 < section["bytes_received"] <= r["bytes_received"] + policy_received
        # The policy sync: an 8-byte header per boundary, and the one change's JSON once.
        change = (policy_sent / (world - 1) if r["rank"] == 0 else policy_received) \
            - HEADER_BYTES * r["boundaries"]
        assert 0 < change <= MESSAGE_BYTES
        moved = HEADER_BYTES * r["boundaries"] + change
        expected = ((world - 1) * moved, 0) if r["rank"] == 0 else (0, moved)
        assert (policy_sent, policy_received) == expected
        assert 'run_id="ddp-rank0"' in r["metrics"]
        assert 'asteria_device_idle_seconds_total{cause="sync_wait"}' in r["metrics"]
        target = (out / "targets" / f"asteria-rank{r['rank']}.yml").read_text()
        assert f'127.0.0.1:{r["metrics_port"]}' in target and f'rank: "{r["rank"]}"' in target
    # A policy change proposed on rank 0 (whose control plane takes PATCHes) is in force from
    # the step it answered, on every rank; the other ranks refuse changes of their own.
    effective = reports[0]["policy_change_effective_step"]
    assert effective == 5 + 3  # proposed after step 5's boundary: taken at 6, applied at 7
    for r in reports:
        versions = [s["policy_version"] for s in r["steps"]]
        assert versions == [1] * (effective - 1) + [2] * (STEPS - effective + 1)
        assert r["history"] == [[2, effective]]
    for r in reports[1:]:
        assert "go through rank 0" in r["policy_change_refused"]


def test_a_slow_owner_makes_only_the_others_wait_and_never_past_the_bound(tmp_path):
    torchrun(tmp_path, "--slow-rank", "1", "--slow-seconds", "0.3")
    params, reports = ranks(tmp_path, 2)
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    fast, slow = reports
    for r in reports:
        assert max(s["staleness_max"] for s in r["steps"]) <= BOUND
    waited = sum(s["sync_wait"] for s in fast["steps"])
    assert waited > 1.0, waited  # 10 rounds, each late by most of 0.3 s
    assert sum(s["refresh_wait"] for s in fast["steps"]) < 0.1 * waited
    # The slow owner waits for its own workers (refresh_wait), not for the others.
    own = sum(s["refresh_wait"] for s in slow["steps"])
    assert own > 1.0, own
    assert sum(s["sync_wait"] for s in slow["steps"]) < 0.1 * own


@pytest.mark.parametrize(("slow_rank", "wait"), [(0, "refresh_wait"), (1, "sync_wait")],
                         ids=["rank-0-slowed", "rank-1-slowed"])
def test_rank_0_decides_and_every_rank_applies_the_autopilot_change_at_one_step(
        tmp_path, slow_rank, wait):
    """One rank's refreshes are slow: rank 0's own steps wait for them (refresh_wait), or, when
    rank 1 is the slow one, rank 0 waits at the swap steps of rank 1's blocks (sync_wait).
    Either way rank 0's autopilot lengthens the refresh interval, citing that wait; the policy
    sync carries each change, so both ranks apply it at the same step with the same version
    and reason, and the replicas stay identical."""
    torchrun(tmp_path, "--slow-rank", str(slow_rank), "--slow-seconds", "0.2", "--autopilot",
             "--steps", "40")
    params, (zero, one) = ranks(tmp_path, 2)
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    assert zero["changes"], "rank 0's autopilot changed nothing although it waited"
    assert zero["changes"] == one["changes"]
    for _version, _step, client, reason, diff in zero["changes"]:
        assert client == "autopilot" and wait in reason
        assert set(diff) == {"refresh_interval"} and diff["refresh_interval"][1] > \
            diff["refresh_interval"][0]
    assert [s["policy_version"] for s in zero["steps"]] == \
        [s["policy_version"] for s in one["steps"]]


def test_owners_balance_refresh_cost_over_nodes_then_ranks():
    sizes = [128, 128, 96, 96, 64, 64, 64, 64, 32, 32, 16]
    blocks = [BlockInfo(BlockKey(i, 0, 0), b, float(b) ** 3) for i, b in enumerate(sizes)]
    topology = Topology(world=4, rank=0, local_world=2)
    owners = assign_owners(blocks, topology)
    assert owners == assign_owners(reversed(blocks), topology)  # the same on every rank
    per_rank = [sum(b.cost for b in blocks if owners[b.key] == r) for r in range(4)]
    per_node = [per_rank[0] + per_rank[1], per_rank[2] + per_rank[3]]
    assert owners[BlockKey(0, 0, 0)] == 0  # the largest block first, to node 0's first rank
    assert owners[BlockKey(1, 0, 0)] == 2  # the next to the other node
    # Greedy packing keeps nodes, and ranks inside a node, within one block of each other.
    largest = max(b.cost for b in blocks)
    assert abs(per_node[0] - per_node[1]) <= largest
    assert abs(per_rank[0] - per_rank[1]) <= largest and abs(per_rank[2] - per_rank[3]) <= largest
    assert all(load > 0 for load in per_rank)
    with pytest.raises(ValueError, match="not a torchrun layout"):
        Topology(world=3, rank=0, local_world=2)


@pytest.mark.parametrize("mode", [[], ["--fsdp"]], ids=["DDP", "FSDP2"])
def test_the_ddp_example_trains_with_the_control_plane_on_rank_0(tmp_path, mode):
    """examples/ddp_loop.py under torchrun: rank 0 serves the run, rank 1 its own /metrics."""
    example = Path(__file__).parents[2] / "examples" / "ddp_loop.py"
    data = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port()), str(example), "--steps", "12", "--port", "0",
         "--metrics-port", "0", "--data-dir", str(data), *mode],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rank 0: final loss" in proc.stdout and "rank 1: final loss" in proc.stdout
    store = RunStore(data / "asteria.db")
    try:
        [run] = store.list_runs()
        assert run["status"] == "finished" and run["config"]["optim"]["name"] == "soap"
        steps = store.steps(run["id"], 0, 100)
        assert [s["step"] for s in steps] == list(range(1, 13))
        assert {s["distributed"]["world"] for s in steps} == {2}
        if mode:  # FSDP2: each rank preconditions its own shards, so no basis travels;
            # rank 0 sends only the policy sync's 8-byte header per boundary (no change here)
            assert [s["distributed"]["bytes_sent"] + s["distributed"]["bytes_received"]
                    for s in steps] == [HEADER_BYTES * s["step"] for s in steps]
    finally:
        store.close()
    target = (data / "targets" / "asteria-rank1.yml").read_text()
    assert 'rank: "1"' in target


def test_a_killed_rank_stops_the_job_naming_it_and_a_restart_resumes_exactly(tmp_path,
                                                                            checkpointed):
    """Each rank checkpoints every 10 steps (its own optimizer shard: only owners hold factor
    statistics). Rank 1 is SIGKILLed at step 15: torchrun (without --max-restarts) stops the
    job with an error naming the rank, and the checkpoints stay; the job launched again resumes
    from step 10 and ends where an uninterrupted run ends, bit for bit. (torchrun's in-place
    restart, --max-restarts, resumes the same way: test_restart.py.)"""
    expected = [torch.load(checkpointed / f"rank{r}.pt") for r in range(2)]

    died = tmp_path / "died"
    port = free_port()
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(port), str(SCRIPT), "--steps", str(STEPS), "--out", str(died),
         "--checkpoint-every", "10", "--die-at-step", "15"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 120
    assert "rank      : 1" in proc.stderr and "Signal 9 (SIGKILL)" in proc.stderr
    assert all((died / "ckpt" / f"rank{r}.pt").is_file() for r in range(2))  # kept

    # Launched again on the same folder (what `torchrun --max-restarts` does in place), the job
    # resumes from the checkpoints the dead one kept.
    torchrun(died, "--checkpoint-every", "10")
    params, reports = ranks(died, 2)
    for got, want in zip(params, expected, strict=True):
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert reports[0]["steps"][0]["step"] == 11  # the restarted attempt began at the checkpoint


def test_selective_coherence_sends_only_bases_that_moved_on_every_rank_alike(tmp_path,
                                                                           two_ranks):
    """The owner decides a refresh barely moved its basis: only a header travels, and every
    rank keeps the basis in use at that step, so replicas stay identical with fewer bytes
    (against the same job with every refresh sent: `two_ranks`; serving /metrics moves no
    collective byte)."""
    selective = tmp_path / "selective"
    torchrun(selective, "--coherence", "0.2")
    _, full = ranks(two_ranks, 2)
    params, reports = ranks(selective, 2)
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    skipped = [r["unchanged"] for r in reports]
    assert skipped[0] == skipped[1] > 0 and all(r["unchanged"] == 0 for r in full)
    assert sum(r["bytes_sent"] for r in reports) < sum(r["bytes_sent"] for r in full)
