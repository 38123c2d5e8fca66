"""Host-homed state on a GPU: pinned homes, copies out on a side stream after the training
stream, copies in after the home's last copy out (device-side waits), and no host-device
synchronization per step: the host waits once, where it reads the homes (close, checkpoint).
There is no GPU here: the CUDA streams and events are a fake (fake_cuda.py), the copies real
CPU copies; the gpu-marked test runs the same on CUDA."""

from __future__ import annotations

import pytest
import torch

from asteria_core.policy import Policy
from asteria_core.tiers.copies import HostCopies
from tests.asteria_core.tiers.conftest import Run, state_bytes
from tests.asteria_core.tiers.fake_cuda import FakeCuda


def host_policy(tmp_path) -> Policy:
    total, _ = state_bytes(tmp_path / "probe")
    return Policy(offload_mode="host", device_budget_bytes=total // 4)


def test_copies_to_host_go_off_the_training_stream_with_no_sync_per_step(tmp_path):
    cuda = FakeCuda()
    made = []

    def fake_cuda_copies(device):
        made.append(HostCopies(device, api=cuda))
        return made[-1]

    reference = Run(None, tmp_path / "ref")
    reference.train(12)
    run = Run(host_policy(tmp_path), tmp_path / "run", copies=fake_cuda_copies)
    run.train(2)  # the first step creates the state; the second uses the homes
    cuda.log.clear()
    run.train(10)
    copies = made[0]
    assert cuda.pinned > 0  # every host home is pinned memory
    assert cuda.syncs == 0, "a host-device synchronization inside the steps"
    outs = [i for i, entry in enumerate(cuda.log) if entry == ("copy_on", "side")]
    assert len(outs) >= 10 and copies.copies_out >= 10
    for i in outs:  # each copy out: the side stream waited for the training stream first,
        assert cuda.log[i - 1] == ("wait_stream", "side", "training")
        assert cuda.log[i + 1:i + 3] == [("record_stream", "side"), ("record", "side")]
    ins = [entry for entry in cuda.log if entry[0] == "wait_event"]
    assert ins and all(entry == ("wait_event", "training", "side") for entry in ins)
    run.close()
    assert cuda.syncs == 1  # close reads the homes: one wait for every copy out
    assert torch.equal(run.params(), reference.params())  # the homes round-trip exactly


def test_a_checkpoint_waits_for_the_copies_out_before_reading_the_homes(tmp_path):
    cuda = FakeCuda()
    run = Run(host_policy(tmp_path), tmp_path / "run",
              copies=lambda device: HostCopies(device, api=cuda))
    run.train(3)
    assert cuda.syncs == 0
    run.opt.state_dict()
    assert cuda.syncs == 1
    run.close()


def test_disk_staging_buffers_are_pinned_and_written_after_their_copy_out_off_the_step(
        tmp_path):
    """Disk-homed state goes through pinned staging buffers by the same copies; the writer
    thread, not the training thread, waits for a buffer's copy out before writing it."""
    cuda = FakeCuda()
    total, w = state_bytes(tmp_path / "probe")
    disk = Policy(offload_mode="disk", device_budget_bytes=max(total // 10, w))
    reference = Run(None, tmp_path / "ref")
    reference.train(12)
    run = Run(disk, tmp_path / "run", copies=lambda device: HostCopies(device, api=cuda))
    assert len(cuda.registered) == run.store.plan.slots > 0  # every staging buffer pinned
    run.train(2)
    cuda.sync_threads.clear()
    run.train(10)
    assert cuda.syncs == 0, "a host-device synchronization on the training thread"
    assert cuda.sync_threads and set(cuda.sync_threads) == {"tier-writer"}
    run.close()
    assert cuda.registered == set()  # unpinned at close
    assert torch.equal(run.params(), reference.params())


@pytest.mark.gpu
def test_cuda_host_and_disk_homes_train_as_state_on_the_device(tmp_path):
    total, w = state_bytes(tmp_path / "probe-disk")
    disk = Policy(offload_mode="disk", device_budget_bytes=max(total // 10, w))
    results = []
    for policy in (Policy(offload_mode="none"), host_policy(tmp_path), disk):
        run = Run(policy, tmp_path / str(len(results)), cuda=True)
        run.train(12)
        if policy.offload_mode == "host":
            homes = list(run.store.homes.pinned.values())
            assert homes and all(t.is_pinned() for t in homes)
            assert run.store.homes.copies.copies_out > 0
        if policy is disk:
            assert run.store.homes.copies._registered  # the staging buffers are pinned
        run.close()
        results.append(run.params().cpu())
    assert torch.allclose(results[0], results[1], rtol=0, atol=1e-6)
    assert torch.allclose(results[0], results[2], rtol=0, atol=1e-6)
