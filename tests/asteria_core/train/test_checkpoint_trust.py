"""Checkpoints that are trusted only when they deserve it: a file damaged on disk is refused
(or passed over for the good one kept before it), and a run whose state went bad (NaN weights,
a refresh that keeps failing) never replaces its last good checkpoint."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from asteria_core.optim.seam import refresh_fn as real_refresh_fn
from asteria_core.refresh import RefreshFailed
from asteria_core.train import checkpoint as ckpt
from asteria_core.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")


def _resume(config, path):
    return dataclasses.replace(config, train=dataclasses.replace(config.train, resume=str(path)))


def _damage(path, at: int, n: int = 50) -> None:
    """Real byte damage: `n` bytes of the file at offset `at` XOR 0xFF, written in place."""
    with path.open("r+b") as f:
        f.seek(at)
        chunk = f.read(n)
        f.seek(at)
        f.write(bytes(b ^ 0xFF for b in chunk))


def test_a_damaged_checkpoint_is_passed_over_for_the_one_kept_before_it(tiny, caplog):
    """Checkpoints at 10 and 20; 50 bytes in the middle of the newest flipped. The resume
    refuses it by its checksum, resumes step 10 (the one kept before it) and trains on to the
    very losses of an untouched run; the damaged file is set aside, not trained from."""
    config = tiny(steps=30, checkpoint_interval=10, eval_interval=30)
    straight = Trainer(config, run_id="straight", jsonl=False)
    full = straight.train(progress=False)
    straight.close()

    first = Trainer(config, run_id="damaged", jsonl=False)
    first.train(stop_at=20, progress=False)
    first.close()
    path = first.checkpoint_path
    assert ckpt.load(ckpt.previous_path(path))["step"] == 10
    _damage(path, path.stat().st_size // 2)

    with caplog.at_level(logging.WARNING):
        resumed = Trainer(_resume(config, path), jsonl=False)
    assert resumed.step == 10
    assert "is damaged: its bytes do not match the SHA-256 checksum" in caplog.text
    assert path.with_name("checkpoint.pt.damaged").is_file()
    rest = resumed.train(progress=False)
    resumed.close()
    assert rest.train_losses == full.train_losses[10:]  # exact float equality


@pytest.mark.parametrize("where", ["middle", "end"])
def test_a_damaged_checkpoint_with_none_before_it_is_refused_saying_what_to_do(tiny, where):
    config = tiny(steps=5)
    trainer = Trainer(config, jsonl=False)
    trainer.train(progress=False)
    trainer.close()
    path = trainer.checkpoint_path
    _damage(path, path.stat().st_size // 2 if where == "middle" else path.stat().st_size - 30)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"^train.resume: .* can not be resumed: no good "
                                         r"checkpoint \(.* is damaged: .*\); restore the damaged "
                                         r"file from a copy, or start the run afresh"):
        Trainer(_resume(config, path), jsonl=False)
    assert path.read_bytes() == before
    with pytest.raises(ckpt.DamagedCheckpoint):
        ckpt.load(path)


def test_a_diverged_run_never_checkpoints_its_non_finite_state(tiny):
    """The weights turn NaN after the checkpoint at step 10: the save due at step 15 refuses,
    the run stops, and the file still holds step 10, byte for byte."""
    config = tiny(steps=30, checkpoint_interval=5)
    trainer = Trainer(config, jsonl=False)
    trainer.train(stop_at=10, progress=False)
    good = trainer.checkpoint_path.read_bytes()
    with torch.no_grad():
        next(trainer.model.parameters()).fill_(float("nan"))
    with pytest.raises(ckpt.NonFiniteState,
                       match=r"^step 15: NaN or infinite values in the model's parameters"):
        trainer.train(progress=False)
    trainer.close()
    assert trainer.checkpoint_path.read_bytes() == good
    assert ckpt.load(trainer.checkpoint_path)["step"] == 10


def test_a_run_stopped_by_failed_refreshes_keeps_its_last_good_checkpoint(tiny):
    """A SOAP run whose refreshes start failing after its checkpoint at step 10 stops with
    RefreshFailed; nothing is saved on the way out, the checkpoint is step 10's."""
    broken = []

    def refresh(snapshot, config):
        if broken:
            raise FloatingPointError("the solver diverged")
        return real_refresh_fn(snapshot, config)

    config = tiny(steps=200, checkpoint_interval=0)
    config = dataclasses.replace(
        config, optim=dataclasses.replace(config.optim, name="soap"),
        policy=dataclasses.replace(config.policy, refresh_interval=2, workers=1,
                                   failure_limit=2))
    trainer = Trainer(config, jsonl=False, refresh_fn=refresh)
    trainer.train(stop_at=10, progress=False)
    good = trainer.checkpoint_path.read_bytes()
    broken.append(True)
    with pytest.raises(RefreshFailed):
        trainer.train(progress=False)
    stopped_at = trainer.step
    trainer.close()
    assert stopped_at > 10
    assert trainer.checkpoint_path.read_bytes() == good


class _FakeCuda:
    """A fake of the CUDA boundary (this machine has no GPU): `visible` devices, each
    generator's state settable only on a device that exists, as torch.cuda's own refuses."""

    def __init__(self, visible: int) -> None:
        self.visible = visible
        self.set: dict[int, torch.Tensor] = {}

    def set_rng_state(self, state: torch.Tensor, device: int = 0) -> None:
        if not 0 <= device < self.visible:
            raise RuntimeError(f"CUDA error: invalid device ordinal {device}")
        self.set[device] = state


@pytest.mark.parametrize("visible", [1, 3])
def test_rng_restore_maps_the_cuda_devices_it_finds(monkeypatch, visible):
    """A checkpoint of a 2-GPU process resumed where 1 (or 3) are visible: the present
    devices' states are restored, and what was not is said, instead of an error."""
    fake = _FakeCuda(visible)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: fake.visible)
    monkeypatch.setattr(torch.cuda, "set_rng_state", fake.set_rng_state)
    monkeypatch.setattr(torch.cuda.random, "set_rng_state", fake.set_rng_state)  # *_all's
    saved = [torch.full((16,), i, dtype=torch.uint8) for i in range(2)]
    state = {"torch": torch.get_rng_state(), "python": __import__("random").getstate(),
             "numpy": ("MT19937", [0] * 624, 0, 0, 0.0), "cuda": saved}
    missing = ckpt.set_rng_state(state)
    assert sorted(fake.set) == list(range(min(2, visible)))
    assert all(torch.equal(fake.set[i], saved[i]) for i in fake.set)
    assert missing == ("the checkpoint holds the CUDA generator states of 2 devices and "
                       f"{visible} are visible: " +
                       ("devices 1..1 not restored" if visible == 1 else
                        "devices 2..2 keep their seeds"))
