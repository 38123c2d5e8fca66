"""GPU energy, power, memory and utilization from NVML (the nvidia-ml-py package, `pynvml`).

Energy is the driver's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ since
the driver loaded, Volta and newer), differenced from the first reading, so integer mJ give
exact joules. Power is `nvmlDeviceGetPowerUsage` (mW; a 1 s average on Ampere and newer),
utilization the share of the last sample period in which a kernel ran.

The meter reads the one GPU this process trains on (`bind`), never every GPU it can see: under
torchrun each rank meters its own device, so the ranks' figures add up to the node's instead of
each rank reporting the node. NVML numbers devices its own way (PCI bus order), CUDA by speed
unless CUDA_DEVICE_ORDER=PCI_BUS_ID, and CUDA_VISIBLE_DEVICES renumbers them again, so
`cuda:i` is matched to its NVML device by UUID, else by PCI address, from
`torch.cuda.get_device_properties(i)`; never by index.

Each query is probed once at bind. A missing library, driver, device or query leaves that series
absent and says why (`reason`, logged at DEBUG: availability reaches the user through the
records, the metrics and the run's start line); a query that starts failing later is dropped
with a warning. The NVML library is injected (`lib`), and the CUDA side (`cuda_identity`) is a
function the caller passes: the seams tests use for fakes.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from asteria_core.compat import Choice
from asteria_core.telemetry.energy import Reading

log = logging.getLogger(__name__)

class NvmlQuery(Choice):
    """What the meter reads from a device; a device that answers none of one is not asked
    again."""

    ENERGY = "energy"  # total energy since the driver loaded (mJ)
    POWER = "power"  # instantaneous draw (mW): integrated where energy is missing
    MEMORY = "memory"
    UTILIZATION = "utilization"


QUERIES = tuple(q.value for q in NvmlQuery)


@dataclass(slots=True)
class _Device:
    label: str
    handle: Any
    queries: set[str] = field(default_factory=set)
    energy_base_mj: int = 0


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What CUDA says of one device, to find it among NVML's."""

    label: str
    """cuda:<index as this process sees it>."""
    uuid: str | None
    """Lower-case hex digits and dashes, without NVML's "GPU-" prefix."""
    pci: tuple[int, int, int] | None
    """(domain, bus, device) of its PCI address."""


def normal_uuid(uuid: str | bytes) -> str:
    """A UUID as torch and NVML both spell it once NVML's prefix is dropped."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        text = text.removeprefix(prefix)
    return text


def cuda_identity(device: torch.device) -> GpuIdentity | None:
    """The identity of a CUDA device from torch (None for any other device type)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    pci = None
    if all(hasattr(props, f) for f in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
        # torch's stubs declare no PCI fields on the device properties; builds that have them
        # set them (the hasattr above).
        pci = (int(props.pci_domain_id), int(props.pci_bus_id),  # type: ignore[attr-defined]
               int(props.pci_device_id))  # type: ignore[attr-defined]
    return GpuIdentity(f"cuda:{index}", normal_uuid(str(uuid)) if uuid is not None else None,
                       pci)


class NvmlMeter:
    """NVML readings for the one GPU this process trains on, once `bind` names it."""

    source = "nvml"

    def __init__(self, lib: Any = None) -> None:
        self.devices: list[_Device] = []
        self.reason = "no GPU bound: the run's device is not known yet"
        self._lib: Any = None
        """pynvml, or the stand-in given as `lib`; None when NVML is not usable."""
        try:
            self._lib = lib if lib is not None else importlib.import_module("pynvml")
        except ImportError as err:
            self.reason = f"nvidia-ml-py is not installed ({err})"
        if self._lib is not None:
            try:
                self._lib.nvmlInit()
            except self._lib.NVMLError as err:
                self.reason = f"NVML could not start: {err}"
                self._lib = None
        self.available = False

    def bind(self, identity: GpuIdentity | None, device_name: str = "cpu") -> None:
        """Meter the GPU `identity` names (None: the run is on `device_name`, no GPU of its
        own, so no series). Binding again replaces the device and restarts its count."""
        self.devices = []
        if self._lib is not None:
            if identity is None:
                self.reason = f"the run trains on {device_name}: no GPU of its own to meter"
            else:
                device = self._open(identity)
                if device is not None:
                    self.devices = [device]
                    self.reason = "" if NvmlQuery.ENERGY in device.queries else \
                        f"{identity.label} has no NVML total-energy counter"
        self.available = any(NvmlQuery.ENERGY in d.queries for d in self.devices)
        if not self.available:
            log.debug("NVML: no energy series (%s)", self.reason)

    def _open(self, identity: GpuIdentity) -> _Device | None:
        handle = self._find(identity)
        if handle is None:
            self.reason = (f"no NVML device matches {identity.label} (uuid {identity.uuid}, "
                           f"pci {identity.pci})")
            return None
        device = _Device(identity.label, handle)
        for query in QUERIES:
            try:
                value = self._query(query)(handle)
            except self._lib.NVMLError as err:
                log.debug("NVML: %s of %s unavailable (%s); that series is absent",
                          query, identity.label, err)
                continue
            device.queries.add(query)
            if query == NvmlQuery.ENERGY:
                device.energy_base_mj = int(value)
        return device

    def _find(self, identity: GpuIdentity) -> Any:
        """NVML's handle of the device CUDA calls `identity`: by UUID, else PCI address."""
        lib = self._lib
        by_pci = None
        for index in range(lib.nvmlDeviceGetCount()):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
            except lib.NVMLError as err:  # e.g. a device this container may not open
                log.debug("NVML: no handle for NVML device %d: %s", index, err)
                continue
            if identity.uuid is not None:
                try:
                    if normal_uuid(lib.nvmlDeviceGetUUID(handle)) == identity.uuid:
                        return handle
                except lib.NVMLError as err:
                    log.debug("NVML: no UUID for NVML device %d: %s", index, err)
            if identity.pci is not None and by_pci is None:
                try:
                    info = lib.nvmlDeviceGetPciInfo(handle)
                except lib.NVMLError as err:
                    log.debug("NVML: no PCI info for NVML device %d: %s", index, err)
                    continue
                if (int(info.domain), int(info.bus), int(info.device)) == identity.pci:
                    by_pci = handle
        return by_pci

    def _query(self, query: str) -> Callable[[Any], Any]:
        lib = self._lib
        match query:
            case NvmlQuery.ENERGY:
                return lib.nvmlDeviceGetTotalEnergyConsumption
            case NvmlQuery.POWER:
                return lib.nvmlDeviceGetPowerUsage
            case NvmlQuery.MEMORY:
                return lib.nvmlDeviceGetMemoryInfo
            case NvmlQuery.UTILIZATION:
                return lib.nvmlDeviceGetUtilizationRates
            case _:
                raise NotImplementedError(query)

    def read(self) -> list[Reading]:
        out = []
        for device in self.devices:
            values: dict[str, Any] = {}
            for query in sorted(device.queries):
                try:
                    values[query] = self._query(query)(device.handle)
                except self._lib.NVMLError as err:
                    log.warning("NVML: %s of %s stopped answering (%s); series dropped",
                                query, device.label, err)
                    device.queries.discard(query)
            memory, util = values.get("memory"), values.get("utilization")
            out.append(Reading(
                device.label, self.source,
                joules=(int(values[NvmlQuery.ENERGY]) - device.energy_base_mj) / 1000
                if NvmlQuery.ENERGY in values else None,
                watts=values[NvmlQuery.POWER] / 1000 if NvmlQuery.POWER in values else None,
                busy_ratio=util.gpu / 100 if util is not None else None,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                memory_total_bytes=int(memory.total) if memory is not None else None,
            ))
        self.available = any(NvmlQuery.ENERGY in d.queries for d in self.devices)
        return out

    def close(self) -> None:
        if self._lib is not None:
            try:
                self._lib.nvmlShutdown()
            except self._lib.NVMLError as err:
                log.debug("NVML shutdown failed: %s", err)
            self._lib = None
            self.devices = []
