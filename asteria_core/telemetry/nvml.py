"""GPU energy, power, memory and utilization from NVML (the nvidia-ml-py package, `pynvml`).

Energy is the driver's total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, mJ since
the driver loaded, Volta and newer), differenced from the first reading, so integer mJ give
exact joules. Power is `nvmlDeviceGetPowerUsage` (mW; a 1 s average on Ampere and newer),
utilization the share of the last sample period in which a kernel ran.

Each query is probed once per device at start. A missing library, driver or query leaves that
series absent and logs one line saying why; a query that starts failing later is dropped the
same way. The NVML library is injected (`lib`), which is the seam tests use for a fake.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asteria_core.compat import StrEnum
from asteria_core.telemetry.energy import Reading

log = logging.getLogger(__name__)

class NvmlQuery(StrEnum):
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


def visible_nvml_ids(env: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as NVML ids (indices or UUIDs); None when unset (all devices)."""
    if env is None:
        return None
    return [part.strip() for part in env.split(",") if part.strip()]


class NvmlMeter:
    """NVML readings for the GPUs this process can see, labelled cuda:<visible index>."""

    source = "nvml"

    def __init__(self, lib: Any = None) -> None:
        self.devices: list[_Device] = []
        self.reason = ""
        self._lib = None
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
        if self._lib is not None:
            self.devices = self._open_devices()
            if not any(NvmlQuery.ENERGY in d.queries for d in self.devices):
                self.reason = self.reason or "no GPU with NVML's total-energy counter"
        self.available = any(NvmlQuery.ENERGY in d.queries for d in self.devices)

    def _open_devices(self) -> list[_Device]:
        lib = self._lib
        ids = visible_nvml_ids(os.environ.get("CUDA_VISIBLE_DEVICES"))
        if ids is None:
            ids = [str(i) for i in range(lib.nvmlDeviceGetCount())]
        devices = []
        for index, nvml_id in enumerate(ids):
            label = f"cuda:{index}"
            try:
                if nvml_id.isdigit():
                    handle = lib.nvmlDeviceGetHandleByIndex(int(nvml_id))
                else:
                    handle = lib.nvmlDeviceGetHandleByUUID(nvml_id)
            except lib.NVMLError as err:
                log.warning("NVML: no handle for %s (CUDA_VISIBLE_DEVICES entry %r): %s; "
                            "no series for it", label, nvml_id, err)
                continue
            device = _Device(label, handle)
            for query in QUERIES:
                try:
                    value = self._query(query)(handle)
                except lib.NVMLError as err:
                    log.info("NVML: %s of %s unavailable (%s); that series is absent",
                             query, label, err)
                    continue
                device.queries.add(query)
                if query == NvmlQuery.ENERGY:
                    device.energy_base_mj = int(value)
            devices.append(device)
        return devices

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
