"""FSDP2 (`fully_shard`) SOAP on real torch.distributed process groups (gloo), launched by
torchrun: every rank preconditions the blocks of its own shards, no factor is held twice and no
basis travels; the run equals the single-process run blocked at the same shard boundaries, and
resumes exactly from a torch.distributed.checkpoint checkpoint."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asteria_core.distributed.policy_sync import HEADER_BYTES
from tests.backend.conftest import free_port

pytestmark = pytest.mark.multiproc
SCRIPT = Path(__file__).with_name("fsdp_train.py")
WORLD = 2
CHECKPOINT = 15  # of 30 steps


def torchrun(out: Path, *extra: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(SCRIPT),
         "--out", str(out), "--checkpoint-at", str(CHECKPOINT), *extra],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def load(out: Path, rank: int) -> tuple[dict[str, torch.Tensor], dict]:
    return torch.load(out / f"rank{rank}.pt"), json.loads((out / f"rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """An uninterrupted FSDP2 run of 2 ranks (checkpointing at step 15 on its way)."""
    out = tmp_path_factory.mktemp("fsdp")
    torchrun(out)
    return out


def test_fsdp2_on_2_ranks_matches_the_single_process_blocked_run(sharded, tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "--single", str(WORLD), "--out", str(tmp_path)],
                   check=True, timeout=300)
    single, single_report = load(tmp_path, 0)
    ranks = [load(sharded, r) for r in range(WORLD)]
    for params, _ in ranks:  # the gathered parameters
        assert params.keys() == single.keys()
        rel = max(((params[k] - single[k]).norm() / single[k].norm()).item() for k in single)
        assert rel < 1e-5
    # Each rank preconditions its own shards: no factor twice, no exchange, no basis sent; the
    # only bytes are the policy sync's 8-byte header per boundary (no policy change here).
    reports = [report for _, report in ranks]
    assert sum(r["blocks"] for r in reports) == single_report["blocks"]
    assert sum(r["factor_bytes"] for r in reports) == single_report["factor_bytes"]
    assert sum(r["refreshes"] for r in reports) == single_report["refreshes"]
    for rank, report in enumerate(reports):
        assert report["factor_bytes"] == single_report["factor_bytes"] // WORLD
        assert not report["exchange"]
        header = HEADER_BYTES * report["boundaries"]
        assert report["distributed"] == {"rank": rank, "world": WORLD, "node": 0,
                                         "owned_blocks": report["blocks"],
                                         "bytes_sent": header * (WORLD - 1) if rank == 0 else 0,
                                         "bytes_received": 0 if rank == 0 else header}
        assert report["staleness_max"] <= 2  # ddp_train.POLICY's bound


def test_fsdp2_resumes_exactly_from_its_distributed_checkpoint(sharded, tmp_path):
    """A job launched on the checkpoint the uninterrupted run wrote at step 15 (what a job
    that died after it leaves) resumes there and ends where the uninterrupted run ends."""
    shutil.copytree(sharded / "ckpt", tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model" / ".metadata").is_file()  # a sharded DCP checkpoint
    torchrun(tmp_path)  # resumes at step 15
    for rank in range(WORLD):
        resumed, report = load(tmp_path, rank)
        uninterrupted, _ = load(sharded, rank)
        assert report["first_step"] == CHECKPOINT + 1
        assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)
