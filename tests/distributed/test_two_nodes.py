"""The README's two-machine command, run on two nodes: two network namespaces, each with its own
address and host name, joined by a veth pair (tests/distributed/netns.py). On each node torchrun
`--nnodes 2 --rdzv-backend c10d --rdzv-endpoint <node 0>:29500 --max-restarts 1`, one rank per
node, the control plane on node 0's rank 0 and node 1's rank serving its /metrics on its own
address. A policy change is made through the control plane, node 1's rank is killed mid-run,
torchrun restarts both ranks, they resume from their checkpoints and finish: every step recorded
once, the policy change kept and in force. The run folder and the data folder are one path that
both nodes see, as the README asks of machines that share a file system."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from asteria_core.train import checkpoint as ckpt
from backend.store import RunStore
from tests.components import missing
from tests.distributed import netns
from tests.procs import descendants

pytestmark = pytest.mark.multiproc
ROOT = Path(__file__).resolve().parents[2]
STEPS = 600
CONTROL_PORT, METRICS_PORT, RDZV_PORT = 8000, 9400, 29500
STALENESS = 3
CHECKPOINT_EVERY = 20
STALL_SECONDS = 240
"""A hang guard: the restarted ranks record a step within seconds on a loaded machine."""
TINY = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", str(STEPS),
        "--train.eval_interval", "100", "--train.eval_batches", "2", "--train.threads", "1",
        "--train.checkpoint_interval", str(CHECKPOINT_EVERY), "--optim.name", "soap",
        "--optim.lr", "3e-3",
        "--policy.refresh_interval", "5", "--policy.staleness_bound", "2", "--policy.workers",
        "1", "--telemetry.nvml", "false", "--telemetry.rapl", "false", "--no-progress"]


def torchrun(node: netns.Node, master: netns.Node, out: Path, data: Path) -> list[str]:
    """The README's two-machine command on `node`, with the control plane on rank 0 and each
    rank's /metrics on its node's own address (its host name, as the target file says)."""
    return node.argv([
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
        "--node-rank", node.host[-1], "--nproc-per-node", "1", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{master.host}:{RDZV_PORT}", "--max-restarts", "1",
        "-m", "asteria", "train", "--control-port", str(CONTROL_PORT), "--data-dir", str(data),
        "--metrics-port", str(METRICS_PORT), "--telemetry.metrics_host", node.host,
        *TINY, "--train.out_dir", str(out), "--train.resume", "auto"])


def rank_pid(launcher: int, rank: int) -> int | None:
    for pid in descendants(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_RANK=0" in env:
            return pid
    return None


def get(path: str, *, token: str = "", method: str = "GET", json=None) -> httpx.Response:
    """A request to the control plane, made from node 0 (Node.call runs it there)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"http://127.0.0.1:{CONTROL_PORT}{path}", json=json,
                         headers=headers, timeout=10)


def poll(node: netns.Node, fn, seconds: float, what: str, procs: list[subprocess.Popen]):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                pytest.fail(f"a node's torchrun exited ({proc.returncode}) while waiting for "
                            f"{what}", pytrace=False)
        try:
            value = node.call(fn, timeout=30)
        except (httpx.HTTPError, OSError, KeyError, StopIteration):
            value = None
        if value:
            return value
        time.sleep(0.2)
    pytest.fail(f"timed out after {seconds:.0f} s waiting for {what}", pytrace=False)


def finish(procs: list[subprocess.Popen], records: Path) -> None:
    """Waits for both torchruns to exit; fails, saying what each rank's restart count was,
    when no step is recorded for STALL_SECONDS (restarted ranks that never meet)."""
    while any(p.poll() is None for p in procs):
        idle = time.time() - records.stat().st_mtime
        if idle > STALL_SECONDS:
            counts = {}
            for launcher in procs:
                for pid in descendants(launcher.pid):
                    try:
                        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                    except OSError:
                        continue
                    found = dict(e.decode().split("=", 1) for e in env if b"=" in e)
                    if "LOCAL_RANK" in found:
                        counts[found["RANK"]] = found.get("TORCHELASTIC_RESTART_COUNT")
            pytest.fail(f"no step recorded for {idle:.0f} s after the kill: the restarted "
                        f"ranks did not meet (TORCHELASTIC_RESTART_COUNT by rank: {counts})",
                        pytrace=False)
        time.sleep(1)


@pytest.mark.timeout(900)
def test_two_nodes_train_one_run_and_survive_a_killed_rank(tmp_path):
    why = netns.lacking()
    if why:
        missing(f"two network namespaces need {why}")
    out, data, logs = tmp_path / "runs", tmp_path / "data", tmp_path / "logs"
    logs.mkdir()
    with netns.two_nodes() as (node0, node1):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        procs = [subprocess.Popen(torchrun(node, node0, out, data), cwd=ROOT, env=env,
                                  stdout=(logs / f"{node.host}.log").open("w"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
                 for node in (node0, node1)]
        try:
            _run(node0, node1, procs, out, data)
        except BaseException:
            for node in (node0, node1):
                print(f"--- {node.host}\n{(logs / f'{node.host}.log').read_text()[-6000:]}")
            raise
        finally:
            for proc in procs:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(30)


def _run(node0: netns.Node, node1: netns.Node, procs: list[subprocess.Popen], out: Path,
         data: Path) -> None:
    run_id = poll(node0, lambda: get("/healthz").json()["active_run"], 300,
                  "the control plane on node 0", procs)
    token = (data / "token").read_text().strip()

    # Both ranks' /metrics: rank 0's is the control plane's, rank 1's is in its target file
    # (node 1's name and port), and the ranks view reads it from node 0 across the link.
    target = yaml.safe_load((data / "targets" / "asteria-rank1.yml").read_text())
    assert target == [{"targets": [f"{node1.host}:{METRICS_PORT + 1}"],
                       "labels": {"rank": "1"}}], target
    assert not (data / "targets" / "asteria-rank0.yml").exists()
    assert f'run_id="{run_id}"' in node0.call(lambda: get("/metrics").text)
    rank1 = node0.call(lambda: httpx.get(f"http://{node1.address}:{METRICS_PORT + 1}/metrics",
                                         timeout=10).text)
    assert "asteria_steps_total" in rank1

    def both_ranks() -> dict | None:
        view = get(f"/runs/{run_id}/ranks").json()
        ok = view["world"] == 2 and all(r["reachable"] and r["figures"]["step"]
                                        for r in view["ranks"])
        return view if ok else None

    view = poll(node0, both_ranks, 120, "both ranks in the ranks view", procs)
    assert [(r["rank"], r["source"]) for r in view["ranks"]] == [(0, "control plane"),
                                                                  (1, "scrape")]

    accepted = node0.call(lambda: get(f"/runs/{run_id}/policy", token=token, method="PATCH",
                                      json={"staleness_bound": STALENESS}))
    assert accepted.status_code == 200, accepted.text
    version, effective = accepted.json()["version"], accepted.json()["effective_step"]

    def applied() -> int | None:
        """The step, once the change is in force and both ranks are past their first
        checkpoint (rank 0 ends a step only after rank 1 has begun it): the restart resumes
        this run (killed before its first checkpoint, it would train a new one)."""
        change = next(c for c in get(f"/runs/{run_id}/policy/history").json()
                      if c["version"] == version)
        step = get(f"/runs/{run_id}").json()["step"]
        in_force = change["applied_at"] is not None and step > CHECKPOINT_EVERY + 1
        return step if in_force else None

    killed_at = poll(node0, applied, 120, "the policy change in force after a checkpoint", procs)
    assert killed_at < STEPS - 100, f"the run is nearly done ({killed_at}): too late to kill"
    victim = rank_pid(procs[1].pid, 1)
    assert victim is not None, "no process of rank 1 under node 1's torchrun"
    os.kill(victim, signal.SIGKILL)

    folder = out / run_id
    finish(procs, folder / "steps.jsonl")
    assert [p.returncode for p in procs] == [0, 0]

    assert [ckpt.load(folder / ckpt.CHECKPOINT_NAME)["step"],
            ckpt.load(folder / "rank1" / ckpt.CHECKPOINT_NAME)["step"]] == [STEPS, STEPS]
    store = RunStore(data / "asteria.db")
    try:
        [row] = store.list_runs()
        assert row["id"] == run_id and row["status"] == "finished", row
        steps = [s["step"] for s in store.steps(run_id, 0, 10 * STEPS)]
        assert steps == list(range(1, STEPS + 1)), "every step recorded once"
        changes = [c for c in store.policy_changes(run_id) if c.version == version]
        assert [{k: list(v) for k, v in c.diff.items()} for c in changes] == \
            [{"staleness_bound": [2, STALENESS]}], changes
        assert changes[0].effective_step == effective
        assert row["policy"]["staleness_bound"] == STALENESS, row["policy"]
        records = store.steps(run_id, 0, 10 * STEPS)
        after = [r for r in records if r["step"] > killed_at]
        assert after and all(r["distributed"]["world"] == 2 for r in after)
    finally:
        store.close()
