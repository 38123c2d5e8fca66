"""torchrun's in-place restart (`--max-restarts`): a rank dies, torchrun stops the others and
starts every rank again on the same rendezvous store. The workers init the process group on a
store prefix of their attempt (`asteria_core.distributed.init_process_group`: torchrun keeps
its store, and gloo's keys of the dead attempt would otherwise be read), connect the default
group and the runtime's side groups afresh, resume from their checkpoints and end where an
uninterrupted run ends."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.backend.conftest import free_port
from tests.distributed.test_ddp import SCRIPT, STEPS, ranks

pytestmark = pytest.mark.multiproc


def test_torchrun_restarts_a_killed_rank_in_place_and_the_run_resumes_exactly(tmp_path,
                                                                              checkpointed):
    """Each rank checkpoints every 10 steps; rank 1 SIGKILLs itself at step 15 in the first
    attempt only. torchrun (--max-restarts 1) restarts both ranks in place: they connect their
    groups again (the default one, the version exchange's and the policy sync's), resume from
    step 10 and finish; the parameters equal an uninterrupted run's, bit for bit."""
    expected = [torch.load(checkpointed / f"rank{r}.pt") for r in range(2)]

    restarted = tmp_path / "restarted"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--max-restarts", "1", "--master-port", str(free_port()), str(SCRIPT),
         "--steps", str(STEPS), "--out", str(restarted), "--checkpoint-every", "10",
         "--die-at-step", "15"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    params, reports = ranks(restarted, 2)
    assert [r["attempt"] for r in reports] == [1, 1]  # written by torchrun's second attempt
    for got, want in zip(params, expected, strict=True):
        assert all(torch.equal(got[k], want[k]) for k in want)
    for r in reports:  # the second attempt began at the checkpoint and ran to the end
        assert [s["step"] for s in r["steps"]] == list(range(11, STEPS + 1))
        assert all(s["failures"] == 0 for s in r["steps"])
        assert r["bytes_received"] > 0
