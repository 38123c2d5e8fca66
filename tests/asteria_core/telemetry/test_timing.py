"""The phase timer on CUDA: device times from events, and at most one host-device
synchronization per step (none once the device has finished the step). There is no GPU here:
the CUDA events are a fake (`FakeCudaEvent`); the gpu-marked test uses real ones."""

from __future__ import annotations

import pytest
import torch

from asteria_core.telemetry.timing import PhaseTimer


class FakeCudaEvent:
    """A fake torch.cuda.Event: each records the fake device's clock (ms), advanced by the
    test; `query` says whether the fake device has finished its work."""

    clock_ms = 0.0
    device_done = True
    syncs = 0

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = None

    def record(self, stream=None) -> None:
        self.at = FakeCudaEvent.clock_ms

    def query(self) -> bool:
        return FakeCudaEvent.device_done

    def synchronize(self) -> None:
        FakeCudaEvent.syncs += 1

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        return end.at - self.at


def run_step(timer: PhaseTimer, device_ms: dict[str, float]) -> dict[str, float]:
    timer.start_step()
    for name, ms in device_ms.items():
        with timer.phase(name):
            FakeCudaEvent.clock_ms += ms
    phases, _ = timer.finish()
    return phases


def test_device_times_with_no_sync_when_the_device_is_done_and_one_when_it_is_not():
    FakeCudaEvent.syncs = 0
    timer = PhaseTimer(torch.device("cuda", 0), event=FakeCudaEvent)
    FakeCudaEvent.device_done = True
    for _ in range(3):
        phases = run_step(timer, {"forward": 4.0, "backward": 8.0, "optimizer": 2.0})
        assert phases["forward"] == pytest.approx(4e-3)
        assert phases["backward"] == pytest.approx(8e-3)
    assert FakeCudaEvent.syncs == timer.syncs == 0
    FakeCudaEvent.device_done = False  # the host ran ahead of the device
    for _ in range(3):
        run_step(timer, {"forward": 1.0, "optimizer": 1.0})
    assert FakeCudaEvent.syncs == timer.syncs == 3  # one per step, never more


@pytest.mark.gpu
def test_cuda_phase_times_are_the_devices_with_at_most_one_sync_per_step():
    timer = PhaseTimer(torch.device("cuda", 0))
    for _ in range(3):
        timer.start_step()
        with timer.phase("forward"):
            torch.cuda._sleep(20_000_000)  # ~10 ms of device time, queued at once
        phases, wall = timer.finish()
        assert phases["forward"] > 1e-3
    assert timer.syncs <= 3
