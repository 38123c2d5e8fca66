"""A fake NVML library: the one test double, standing in at the hardware boundary.

It has the pynvml functions `NvmlMeter` calls, with counters the test sets. A query set to None
raises the fake's NotSupported error, as real NVML does on a GPU without that query.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace


class FakeNVMLError(Exception):
    pass


class FakeNVMLNotSupported(FakeNVMLError):
    pass


@dataclass
class FakeGpu:
    energy_mj: int | None = 1_000_000
    power_mw: int | None = 250_000
    memory: tuple[int, int] | None = (1 << 30, 80 << 30)
    """(used, total) bytes."""
    util_percent: int | None = 50
    uuid: str = "GPU-fake-0"
    pci: tuple[int, int, int] = (0, 0, 0)
    """(domain, bus, device)."""


class FakeNvml:
    NVMLError = FakeNVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_error: str | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.shutdowns = 0

    def _get(self, handle: int, attr: str):
        value = getattr(self.gpus[handle], attr)
        if value is None:
            raise FakeNVMLNotSupported(f"Not Supported ({attr})")
        return value

    def nvmlInit(self) -> None:
        if self.init_error:
            raise FakeNVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise FakeNVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        for i, gpu in enumerate(self.gpus):
            if gpu.uuid == uuid:
                return i
        raise FakeNVMLError("Not Found")

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.gpus[handle].uuid

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        domain, bus, device = self.gpus[handle].pci
        return SimpleNamespace(domain=domain, bus=bus, device=device,
                               busId=f"{domain:08X}:{bus:02X}:{device:02X}.0")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        return self._get(handle, "energy_mj")

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._get(handle, "power_mw")

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        used, total = self._get(handle, "memory")
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._get(handle, "util_percent"), memory=0)


def fake_cuda_identity(uuid: str | None = "fake-0", pci=None, label: str = "cuda:0"):
    """A fake of torch's CUDA device properties (this machine has no CUDA): whatever device the
    run is on, CUDA calls it `label` with this UUID (torch spells it without NVML's "GPU-") and
    PCI address."""
    from asteria_core.telemetry.nvml import GpuIdentity

    return lambda device: GpuIdentity(label, uuid, pci)
