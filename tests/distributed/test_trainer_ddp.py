"""The built-in trainer under torchrun: `torchrun -m asteria_core.cli train` (and the
`asteria` entry point, `asteria`) trains one data-parallel run on gloo: replicas identical
at the end, rank 0 alone writing the run's records, a checkpoint per rank at one step, and a
relaunch of the same command resuming exactly where an uninterrupted run ends."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from asteria_core.distributed.policy_sync import HEADER_BYTES
from asteria_core.torchrun import Ranks
from asteria_core.train import checkpoint as ckpt
from asteria_core.train import parallel
from asteria_core.train.config import ConfigError, RunConfig
from asteria_core.train.config_io import config_from_dict
from asteria_core.train.model import GPT
from asteria_core.train.trainer import Trainer
from backend.store import RunStore
from tests.backend.conftest import free_port
from tests.procs import descendants

pytestmark = pytest.mark.multiproc
ROOT = Path(__file__).resolve().parents[2]
STEPS = 160
TINY = ["--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", str(STEPS),
        "--train.eval_interval", "40", "--train.eval_batches", "3", "--train.threads", "1",
        "--train.checkpoint_interval", "20", "--optim.name", "soap", "--optim.lr", "3e-3",
        "--policy.refresh_interval", "5", "--policy.staleness_bound", "2", "--policy.workers",
        "1", "--telemetry.nvml", "false", "--telemetry.rapl", "false", "--no-progress"]


def launch(module: str, out: Path, *extra: str) -> subprocess.Popen:
    """Two ranks of `module train` on this machine, gloo."""
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", module,
         "train", *TINY, "--train.out_dir", str(out), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, ok: bool = True) -> tuple[str, str]:
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    if ok:
        assert proc.returncode == 0, out[-3000:] + err[-5000:]
    return out, err


def run_dir(out: Path) -> Path:
    [folder] = [p for p in out.iterdir() if p.is_dir()]
    return folder


def models(folder: Path) -> list[dict[str, torch.Tensor]]:
    return [ckpt.load(folder / ckpt.CHECKPOINT_NAME)["model"],
            ckpt.load(folder / "rank1" / ckpt.CHECKPOINT_NAME)["model"]]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def steps_of(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, Path, str]:
    """The uninterrupted run, through the `asteria` entry point with the control plane on
    rank 0 and rank 1's /metrics (any free port, its Prometheus target in the data dir)."""
    out, data = tmp_path_factory.mktemp("straight"), tmp_path_factory.mktemp("data")
    stdout, _ = finish(launch("asteria", out, "--control-port", "0", "--data-dir",
                              str(data)))
    return run_dir(out), data, stdout


def test_replicas_end_identical_and_only_rank_0_writes_the_run(straight):
    folder, _, stdout = straight
    rank0, rank1 = models(folder)
    assert same(rank0, rank1)
    # Rank 0's files in the run folder, rank 1's checkpoint (and disk tier) in rank1/.
    files = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert {"checkpoint.pt", "checkpoint.prev.pt", "steps.jsonl", "rank1/checkpoint.pt",
            "rank1/checkpoint.prev.pt"} <= files
    assert not [f for f in files if f.startswith("rank1/") and not
                (f in ("rank1/checkpoint.pt", "rank1/checkpoint.prev.pt", "rank1/.lock") or
                 f.startswith("rank1/tiers/"))], files
    records = steps_of(folder)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    assert all(r["distributed"]["world"] == 2 and r["distributed"]["rank"] == 0
               for r in records)
    assert [r["step"] for r in records if r["eval_loss"] is not None] == [40, 80, 120, 160]
    assert records[-1]["eval_loss"] < records[39]["eval_loss"]
    state = [ckpt.load(folder / ckpt.CHECKPOINT_NAME),
             ckpt.load(folder / "rank1" / ckpt.CHECKPOINT_NAME)]
    assert [s["step"] for s in state] == [STEPS, STEPS]
    assert [s["ranks"] for s in state] == [{"rank": r, "world": 2, "local_world": 2}
                                           for r in range(2)]
    assert state[0]["run_id"] == state[1]["run_id"] == folder.name
    # Rank 0 alone prints the run's lines (torchrun passes every rank's stdout through).
    assert stdout.count("asteria: run ") == 1 and stdout.count("control plane on ") == 1
    assert "data-parallel on 2 ranks (2 per node), global batch 2 x 4" in stdout
    assert stdout.count("asteria: done at step 160") == 1


def test_the_control_plane_is_rank_0s_and_rank_1_serves_its_metrics(straight):
    folder, data, _ = straight
    store = RunStore(data / "asteria.db")
    try:
        [run] = store.list_runs()
        assert run["id"] == folder.name and run["status"] == "finished"
        steps = store.steps(run["id"], 0, 1000)
        assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
        assert {s["distributed"]["world"] for s in steps} == {2}
    finally:
        store.close()
    target = (data / "targets" / "asteria-rank1.yml").read_text()
    assert 'rank: "1"' in target and "127.0.0.1:" in target
    assert not (data / "targets" / "asteria-rank0.yml").exists()  # rank 0: the control plane


def _rank_pid(launcher: int, rank: int) -> int:
    for pid in descendants(launcher):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_RANK=%d" % rank in env:
            return pid
    raise AssertionError(f"no process of rank {rank} under {launcher}")


def _signal_rank_1_after(proc: subprocess.Popen, records: Path, steps: int,
                         sig: signal.Signals) -> int | None:
    """Send `sig` to rank 1 once rank 0 has recorded `steps` steps: the last step recorded then,
    or None when the run ended or stalled first."""
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        found = list(records.glob("*/steps.jsonl"))
        lines = found[0].read_text().splitlines() if found else []
        if len(lines) >= steps:
            os.kill(_rank_pid(proc.pid, 1), sig)
            return json.loads(lines[-1])["step"]
        time.sleep(0.01)
    return None


def _checkpointed_steps(folder: Path) -> list[int]:
    return [ckpt.load(folder / ckpt.CHECKPOINT_NAME)["step"],
            ckpt.load(folder / "rank1" / ckpt.CHECKPOINT_NAME)["step"]]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory) -> dict:
    """One run interrupted twice, each interruption followed by a relaunch of the same command
    (train.resume = auto): SIGTERM to rank 1 alone after 25 steps; in the relaunch, kill -9 of
    rank 1 between two checkpoints (every 20 steps); the last launch runs to the end. What each
    launch left and printed is kept for the tests below."""
    out = tmp_path_factory.mktemp("interrupted")
    seen: dict = {}
    proc = launch("asteria_core.cli", out, "--train.resume", "auto")
    try:
        signalled_after = _signal_rank_1_after(proc, out, 25, signal.SIGTERM)
    finally:
        _, err = finish(proc, ok=False)
    assert signalled_after is not None, err[-3000:]
    folder = run_dir(out)
    seen["signalled"] = {"returncode": proc.returncode, "err": err,
                         "checkpointed": _checkpointed_steps(folder),
                         "last_record": steps_of(folder)[-1]["step"]}

    # Relaunched, it resumes; rank 1 is killed past the next multiple of 20 steps.
    stopped = seen["signalled"]["checkpointed"][0]
    kill_after = (stopped // 20 + 1) * 20 + 7
    assert kill_after < STEPS - 10, f"the signal came too late: {stopped}"
    proc = launch("asteria_core.cli", out, "--train.resume", "auto")
    try:
        killed_after = _signal_rank_1_after(proc, out, kill_after, signal.SIGKILL)
    finally:
        resumed_out, _ = finish(proc, ok=False)
    assert killed_after is not None, "the run ended or stalled before the kill"
    seen["killed"] = {"returncode": proc.returncode, "out": resumed_out,
                      "killed_after": killed_after, "run": run_dir(out),
                      "checkpointed": _checkpointed_steps(folder)}

    seen["final"], _ = finish(launch("asteria_core.cli", out, "--train.resume", "auto"))
    seen["folder"] = folder
    return seen


def test_a_signal_on_one_rank_stops_every_rank_at_one_step_and_a_relaunch_resumes_exactly(
        interrupted, straight):
    """SIGTERM to rank 1 alone: every rank stops at one step and checkpoints it; the same
    command launched again (train.resume = auto) resumes there, and the run ends with the
    parameters of the uninterrupted run, bit for bit, with each step's record once."""
    signalled, folder = interrupted["signalled"], interrupted["folder"]
    assert signalled["returncode"] != 0  # torchrun reports the rank the signal stopped
    assert "rank 1: stopped by SIGTERM at step" in signalled["err"], signalled["err"][-3000:]
    stopped = signalled["checkpointed"]
    assert stopped[0] == stopped[1], stopped
    assert 25 <= stopped[0] < STEPS, f"the signal came too late: {stopped}"
    assert signalled["last_record"] == stopped[0]

    relaunched = interrupted["killed"]
    assert f"resumed {folder / ckpt.CHECKPOINT_NAME} at step {stopped[0]}" in relaunched["out"]
    assert relaunched["run"] == folder  # the same run, continued
    expected = models(straight[0])
    got = models(folder)
    assert same(got[0], got[1])
    assert same(got[0], expected[0])
    assert [r["step"] for r in steps_of(folder)] == list(range(1, STEPS + 1))
    assert [r["loss"] for r in steps_of(folder)] == [r["loss"] for r in steps_of(straight[0])]


def test_a_rank_killed_between_checkpoints_leaves_a_run_every_relaunch_resumes(
        interrupted, straight):
    """kill -9 of rank 1 between checkpoints (every 20 steps): rank 0 fails at its next
    collective and saves nothing on the way out, so both ranks still share their last step;
    the same command launched again resumes there and ends as the uninterrupted run, with the
    same loss at every step."""
    killed, folder = interrupted["killed"], interrupted["folder"]
    assert killed["returncode"] != 0
    steps = killed["checkpointed"]
    assert steps[0] % 20 == 0 and steps[0] <= killed["killed_after"], (steps,
                                                                       killed["killed_after"])
    assert steps[0] > interrupted["signalled"]["checkpointed"][0]  # a checkpoint of this launch

    out = interrupted["final"]
    resumed = int(out.split(f"resumed {folder / ckpt.CHECKPOINT_NAME} at step ")[1].split()[0])
    assert resumed == min(steps) and resumed % 20 == 0
    got, expected = models(folder), models(straight[0])
    assert same(got[0], got[1]) and same(got[0], expected[0])
    assert [r["loss"] for r in steps_of(folder)] == [r["loss"] for r in steps_of(straight[0])]


def test_the_runtime_section_trains_the_ranks_sharded(tmp_path):
    """`--runtime.distributed_state sharded --runtime.update_dtype bf16` reaches every rank's
    runtime: each rank steps only its own parameters (its checkpoint holds their optimizer
    state alone) and sends their change, rounded to bf16, every step, so rank 0's records count
    2 bytes per parameter per step, sent and received, besides the policy sync's header (a
    replicated run sends bases once per refresh round); replicas end identical."""
    steps = 6
    finish(launch("asteria_core.cli", tmp_path, "--train.steps", str(steps),
                  "--runtime.distributed_state", "sharded", "--runtime.update_dtype", "bf16",
                  "--runtime.rebalance_rounds", "4"))
    folder = run_dir(tmp_path)
    rank0, rank1 = models(folder)
    assert same(rank0, rank1)
    saved = [ckpt.load(folder / ckpt.CHECKPOINT_NAME),
             ckpt.load(folder / "rank1" / ckpt.CHECKPOINT_NAME)]
    config = config_from_dict(saved[0]["config"])
    assert (config.runtime.distributed_state, config.runtime.update_dtype,
            config.runtime.rebalance_rounds) == ("sharded", "bf16", 4)
    owned = [set(s["optimizer"]["state"]) for s in saved]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    records = steps_of(folder)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    moved = [r["distributed"]["bytes_sent"] + r["distributed"]["bytes_received"]
             for r in records]
    params = sum(p.numel() for p in GPT(config.model).parameters())
    assert {moved[i + 1] - moved[i] for i in range(steps - 1)} == {2 * params + HEADER_BYTES}


def test_fsdp2_trains_shards_and_resumes_exactly(tmp_path):
    """`--train.data_parallel fsdp2`: every rank holds half of each parameter (a dim-0 shard)
    and the optimizer state of its shards, an odd number of validation batches is evaluated in
    lockstep (every forward gathers the parameters), and a relaunch from the step-6 checkpoints
    trains the same losses, step for step, as the run that went straight on."""
    steps = 12
    extra = ("--train.steps", str(steps), "--train.checkpoint_interval", "6",
             "--train.eval_interval", "6", "--train.data_parallel", "fsdp2",
             "--train.split_cpus", "true")
    straight_out = tmp_path / "straight"
    finish(launch("asteria_core.cli", straight_out, *extra))
    folder = run_dir(straight_out)
    shards = [ckpt.load(folder / ckpt.CHECKPOINT_NAME)["model"],
              ckpt.load(folder / "rank1" / ckpt.CHECKPOINT_NAME)["model"]]
    for name, whole in GPT(config_from_dict(ckpt.load(folder / ckpt.CHECKPOINT_NAME)["config"])
                           .model).state_dict().items():
        local = [s[name].to_local() for s in shards]
        assert sum(t.shape[0] for t in local) == whole.shape[0], name
    records = steps_of(folder)
    assert [r["step"] for r in records if r["eval_loss"] is not None] == [6, 12]

    resumed_out = tmp_path / "resumed"
    shutil.copytree(straight_out, resumed_out)
    for rank_folder in (run_dir(resumed_out), run_dir(resumed_out) / "rank1"):
        os.replace(rank_folder / "checkpoint.prev.pt", rank_folder / ckpt.CHECKPOINT_NAME)
    out, _ = finish(launch("asteria_core.cli", resumed_out, *extra, "--train.resume", "auto"))
    assert "at step 6" in out
    again = steps_of(run_dir(resumed_out))
    assert [(r["step"], r["loss"], r["eval_loss"]) for r in again] == \
        [(r["step"], r["loss"], r["eval_loss"]) for r in records]


def test_a_node_s_cpus_are_split_evenly_among_its_ranks():
    def split(cpus: int, world: int) -> list[set[int]]:
        return [parallel.rank_cpus(list(range(cpus)), Ranks(r, world, r, world))
                for r in range(world)]

    assert split(2, 2) == [{0}, {1}]
    assert split(8, 2) == [{0, 1, 2, 3}, {4, 5, 6, 7}]
    assert split(5, 2) == [{0, 1}, {2, 3}]
    assert split(2, 4) == [{0}, {1}, {0}, {1}]


def test_a_bad_combination_stops_every_rank_naming_the_key(tmp_path):
    proc = launch("asteria_core.cli", tmp_path, "--policy.swap_mode", "opportunistic")
    _, err = finish(proc, ok=False)
    assert proc.returncode != 0
    assert "asteria: config error: policy.swap_mode: got 'opportunistic'; allowed: " \
           "deterministic in a data-parallel run" in err, err[-3000:]
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_checks_name_the_key_before_anything_is_built():
    two = Ranks(rank=0, world=2, local_rank=0, local_world=2)
    config = RunConfig()
    parallel.check(config, two)
    parallel.check(dataclasses.replace(
        config, policy=dataclasses.replace(config.policy, swap_mode="opportunistic")), Ranks())
    bad = {"policy.swap_mode": dataclasses.replace(
               config, optim=dataclasses.replace(config.optim, name="soap"),
               policy=dataclasses.replace(config.policy, swap_mode="opportunistic")),
           "policy.disk_dir": dataclasses.replace(
               config, policy=dataclasses.replace(config.policy, disk_dir="/tmp/tiers")),
           "train.cpus": dataclasses.replace(
               config, train=dataclasses.replace(config.train, cpus="0")),
           "train.worker_cpus": dataclasses.replace(
               config, train=dataclasses.replace(config.train, worker_cpus="0")),
           "runtime.distributed_state": dataclasses.replace(
               config, train=dataclasses.replace(config.train, data_parallel="fsdp2"),
               runtime=dataclasses.replace(config.runtime, distributed_state="sharded"))}
    for key, wrong in bad.items():
        with pytest.raises(ConfigError, match=f"^{key}: got .*; allowed: "):
            parallel.check(wrong, two)
    with pytest.raises(ValueError, match="torchrun environment: got RANK 2, WORLD_SIZE 2"):
        Ranks.from_env({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"})
    assert Ranks.from_env({"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1",
                           "LOCAL_WORLD_SIZE": "2"}) == Ranks(3, 4, 1, 2)
    assert Ranks.from_env({}) == Ranks()


def test_a_data_parallel_checkpoint_resumes_only_the_layout_that_wrote_it(straight, tmp_path):
    config = RunConfig()
    config = dataclasses.replace(config, train=dataclasses.replace(
        config.train, out_dir=str(tmp_path), resume=str(straight[0] / ckpt.CHECKPOINT_NAME)))
    with pytest.raises(ValueError, match=r"^train.resume: .* was written by a run of 2 "
                                         r"rank\(s\), 2 per node; this run has 1"):
        Trainer(config)


def test_a_rank_killed_while_saving_resumes_the_step_every_rank_has(tmp_path, straight):
    """The files a kill of rank 1 in the middle of its step-160 save leaves (its atomic write
    never renamed: its newest is still step 140) while rank 0 saved 160: a relaunch resumes
    step 140, the newest step both ranks have, says so, and ends as the uninterrupted run."""
    folder = tmp_path / straight[0].name
    shutil.copytree(straight[0], folder)
    rank1 = folder / "rank1" / ckpt.CHECKPOINT_NAME
    os.replace(ckpt.previous_path(rank1), rank1)
    assert [ckpt.load(folder / ckpt.CHECKPOINT_NAME)["step"], ckpt.load(rank1)["step"]] == \
        [STEPS, STEPS - 20]

    out, err = finish(launch("asteria_core.cli", tmp_path, "--train.resume", "auto"))
    assert f"resumed {folder / ckpt.CHECKPOINT_NAME} at step {STEPS - 20}" in out
    assert f"step {STEPS} is not on every rank" in err
    got, expected = models(folder), models(straight[0])
    assert same(got[0], got[1]) and same(got[0], expected[0])
    assert [r["loss"] for r in steps_of(folder)] == [r["loss"] for r in steps_of(straight[0])]
