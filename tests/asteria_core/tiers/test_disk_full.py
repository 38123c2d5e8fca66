"""A full disk under the disk tier, for real: the run folder and the tier live
on a small tmpfs mounted for the test (root only), which is then filled to its last byte.

The run stops on the first write that does not fit, and its last good checkpoint stays intact:
no checkpoint is written from state that never reached the disk, no `.new` or `.tmp` file is
left behind, and `asteria train` says what happened in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asteria_core.policy import Policy
from asteria_core.tiers import TierFileError
from asteria_core.train import checkpoint as ckpt
from asteria_core.train.trainer import Trainer
from tests.components import missing

ROOT = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str):
    """A tmpfs of `size` mounted at `path` for the block; skipped where mounting is not allowed,
    except under CI=true, where a missing component fails."""
    path.mkdir(parents=True, exist_ok=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]),
                            "tmpfs", str(path)], capture_output=True, text=True)
    if mount.returncode != 0:
        missing(f"a tmpfs cannot be mounted (needs root): {mount.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(folder: Path) -> None:
    """Write a file until the file system has no byte left (unbuffered: nothing waits to be
    flushed at close)."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 16, 512, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)


def disk_config(tiny, out_dir: Path, **train):
    """SOAP with everything but the working set (the largest parameter's state) on disk."""
    config = tiny(out_dir=str(out_dir), **train)
    config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, name="soap"),
                                 policy=Policy(refresh_interval=4, staleness_bound=2, workers=1))
    probe = Trainer(dataclasses.replace(config, train=dataclasses.replace(
        config.train, out_dir=str(out_dir.parent / "probe"))), jsonl=False)
    working_set = probe.runtime.tiers.plan.slot_bytes
    probe.close()
    return dataclasses.replace(config, policy=dataclasses.replace(
        config.policy, offload_mode="disk", device_budget_bytes=working_set))


def leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.suffix in (".new", ".tmp")]


def test_a_full_disk_stops_the_run_and_keeps_the_last_checkpoint_intact(tiny, tmp_path):
    with tmpfs(tmp_path / "fs", "16m") as fs:
        trainer = Trainer(disk_config(tiny, fs, steps=1000, checkpoint_interval=5), jsonl=False)
        try:
            trainer.train(stop_at=10, progress=False)  # checkpoints at 5 and 10
            assert trainer.runtime.tiers.tier_bytes()["disk"] > 0
            path = trainer.run_dir / ckpt.CHECKPOINT_NAME
            before = path.read_bytes()
            fill(fs)
            with pytest.raises(TierFileError, match="could not be written"):
                trainer.train(progress=False)
        finally:
            with contextlib.suppress(TierFileError):
                trainer.close()
        assert path.read_bytes() == before
        assert ckpt.load(path)["step"] == 10
        assert leftovers(fs) == []


def test_a_disk_tier_that_cannot_fit_with_its_spare_copy_is_refused_at_start(tiny, tmp_path):
    """The state fits, but not with the spare file a rewrite needs: refused before step 1."""
    with tmpfs(tmp_path / "fs", "16m") as fs:
        config = disk_config(tiny, fs, steps=3)
        probe = Trainer(config, jsonl=False)
        state = probe.runtime.tiers.plan.used(probe.runtime.tiers.entries, "disk")
        spare = probe.runtime.tiers.plan.slot_bytes
        probe.close()
        subprocess.run(["rm", "-rf", str(probe.run_dir)], check=True)  # its space comes back
        fill(fs)
        os.truncate(fs / "filler", (fs / "filler").stat().st_size - state - spare // 2)
        with pytest.raises(ValueError, match="a spare"):
            Trainer(config, jsonl=False)


def test_disk_and_permission_errors_from_the_cli_end_in_one_line(tmp_path):
    args = [sys.executable, "-m", "asteria_core.cli", "train", "--no-progress",
            "--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
            "--model.block_size", "32", "--data.batch_size", "4", "--optim.name", "soap",
            "--policy.offload_mode", "disk", "--policy.device_budget_bytes", "600000",
            "--train.steps", "1000", "--train.eval_batches", "2", "--train.threads", "1"]
    with tmpfs(tmp_path / "full", "1m") as full, tmpfs(tmp_path / "ro", "1m", "ro") as ro:
        fill(full)
        for out_dir in (full, ro):
            run = subprocess.run([*args, "--train.out_dir", str(out_dir)], cwd=ROOT,
                                 capture_output=True, text=True, timeout=300)
            assert run.returncode == 1, run.stderr
            assert "Traceback" not in run.stderr, run.stderr
            [line] = [x for x in run.stderr.splitlines() if x.startswith("asteria:")]
            assert str(out_dir) in line, line


def test_a_disk_that_fills_up_mid_run_ends_the_cli_in_one_line(tmp_path):
    args = [sys.executable, "-m", "asteria_core.cli", "train", "--no-progress",
            "--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "32",
            "--model.block_size", "32", "--data.batch_size", "4", "--optim.name", "soap",
            "--policy.offload_mode", "disk", "--policy.device_budget_bytes", "600000",
            "--train.steps", "100000", "--train.eval_batches", "2", "--train.threads", "1",
            "--train.checkpoint_interval", "5"]
    with tmpfs(tmp_path / "fs", "16m") as fs:
        proc = subprocess.Popen([*args, "--train.out_dir", str(fs)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while not list(fs.glob(f"*/{ckpt.CHECKPOINT_NAME}")):
                assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint"
                time.sleep(0.1)
            [path] = fs.glob(f"*/{ckpt.CHECKPOINT_NAME}")
            fill(fs)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 1, err
        assert "Traceback" not in err, err
        [line] = [x for x in err.splitlines() if x.startswith("asteria:")]
        assert "No space left on device" in line and str(path) in line, line
        assert ckpt.load(path)["step"] % 5 == 0
        assert leftovers(fs) == []


def test_a_checkpoint_that_does_not_fit_raises_the_full_disk_and_leaves_nothing(tmp_path):
    """torch.save through the streamed writer: its zip writer raised "unexpected pos" over the
    write's ENOSPC, which the CLI did not take for a full disk (a traceback, not one line)."""
    import errno

    import torch

    with tmpfs(tmp_path / "fs", "1m") as fs:
        with pytest.raises(OSError) as raised:
            ckpt.save_atomic({"big": torch.zeros(1 << 20)}, fs / ckpt.CHECKPOINT_NAME)  # 4 MiB
        assert raised.value.errno == errno.ENOSPC
        assert list(fs.iterdir()) == []  # neither the file nor its temporary
