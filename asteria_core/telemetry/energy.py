"""Energy meters: RAPL (CPU packages), a modelled CPU estimate, and the monitor that polls them.

Every meter reports cumulative joules since it started, per device, and present power where it
can. A meter that cannot measure says so (`available`, `reason`) and reports nothing: an absent
source gives absent series, never zeros. NVML lives in nvml.py.

RAPL: /sys/class/powercap/intel-rapl:N (package-N) and its dram sub-zone, read from
energy_uj. The counter wraps at max_energy_range_uj, so a reading below the previous one means
one wrap (polls must come more often than one wrap period, minutes even at full load). Since
Linux 5.10, energy_uj is readable by root only; a non-root process gets no RAPL series.

Model: CPU seconds of every process the run started x a configured number of watts per busy
core: this process (its threads) and the refresh worker processes, registered as they start
(`count_process`; left out, the host's share of an optimizer that refreshes on the host would go
uncounted). Other children of the process are not the run's and are not counted. It is an
estimate, and is only ever exported with source="model".

Parts: NVML meters the device, RAPL or the model the host (labels.PART_OF_SOURCE). A figure that
sums energy says which parts and sources it sums (`EnergyParts`), and a comparison between
optimizers uses the total, so work moved from the device to the host is still counted.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from asteria_core.telemetry.labels import HOST_SOURCES, SOURCES, EnergySource

log = logging.getLogger(__name__)



@dataclass(frozen=True, slots=True)
class Reading:
    """What one meter knows about one device; None means not measurable (no series)."""

    device: str
    source: str
    joules: float | None = None
    """Energy since the meter started."""
    watts: float | None = None
    busy_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None


class Meter(Protocol):
    source: str
    available: bool
    """True when the meter measures energy of at least one device."""
    reason: str
    """Why it is not available ('' when it is)."""

    def read(self) -> list[Reading]: ...

    def close(self) -> None: ...


class _Rate:
    """Watts from successive cumulative-joule readings."""

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def __call__(self, joules: float, now: float) -> float | None:
        last, self._last = self._last, (now, joules)
        if last is None or now <= last[0]:
            return None
        return (joules - last[1]) / (now - last[0])


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


_RUN_PROCESSES: dict[int, tuple[bytes, float]] = {}
"""pid -> (its start time in /proc, its last CPU seconds read): the processes the run started."""
_RUN_PROCESSES_LOCK = threading.Lock()


def count_process(pid: int) -> None:
    """Count process `pid` (a refresh worker the run started) as the run's own work. Only the
    processes registered here count: a child a script or a test started for something else
    (a browser, a server) is not the run's."""
    stat = _proc_stat(pid)
    if stat is not None:
        with _RUN_PROCESSES_LOCK:
            _RUN_PROCESSES.setdefault(pid, (stat[0], 0.0))


def _proc_stat(pid: int) -> tuple[bytes, float] | None:
    """(start time, user + system CPU seconds) of a live process; None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19], (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # starttime; utime, stime


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds process `pid` has used, all its threads together (Linux: /proc); None where
    that cannot be read (another system, or the process is gone)."""
    stat = _proc_stat(pid)
    return None if stat is None else stat[1]


def run_cpu_seconds() -> float:
    """CPU seconds of this process and of the processes the run started (`count_process`): a
    live one read from /proc, one that is gone (or whose pid was reused: another start time)
    at its last reading, so at most one poll's CPU of a worker that ended is missed."""
    total = time.process_time()
    with _RUN_PROCESSES_LOCK:
        for pid, (started, last) in _RUN_PROCESSES.items():
            stat = _proc_stat(pid)
            if stat is not None and stat[0] == started and stat[1] > last:
                _RUN_PROCESSES[pid] = (started, last := stat[1])
            total += last
    return total


class ModelMeter:
    """Estimate: CPU seconds of the run's processes since start x `watts` (per busy core)."""

    source = "model"
    available = True
    reason = ""

    def __init__(self, watts: float, cpu_seconds=run_cpu_seconds) -> None:
        if not watts > 0:
            raise ValueError(f"watts: got {watts!r}; allowed: a number > 0")
        self.watts = watts
        self._cpu_seconds = cpu_seconds
        self._start = cpu_seconds()
        self._rate = _Rate()

    def joules(self) -> float:
        """The estimate now, without touching the power rate of `read` (telemetry reads this at
        every step's end, so a step record is credited its own CPU time, not a poll's lump)."""
        return (self._cpu_seconds() - self._start) * self.watts

    def read(self) -> list[Reading]:
        joules = self.joules()
        watts = self._rate(joules, time.perf_counter())
        return [Reading("cpu", self.source, joules=joules, watts=watts)]

    def close(self) -> None:
        pass


@dataclass(slots=True)
class _Zone:
    device: str
    path: Path
    max_range_uj: int
    last_uj: int
    total_uj: int = 0


_PACKAGE = re.compile(r"intel-rapl:(\d+)$")
_SUBZONE = re.compile(r"intel-rapl:(\d+):\d+$")


class RaplMeter:
    """CPU package (and DRAM) energy from the powercap sysfs tree under `root`."""

    source = "rapl"

    def __init__(self, root: str | Path = "/sys/class/powercap") -> None:
        self.root = Path(root)
        self.zones: list[_Zone] = []
        self.reason = ""
        self._rates: dict[str, _Rate] = {}
        try:
            self.zones = self._discover()
        except PermissionError as err:
            self.reason = f"RAPL energy_uj is readable by root only ({err})"
        except OSError as err:
            self.reason = f"RAPL under {self.root} is not readable: {err}"
        if not self.zones and not self.reason:
            self.reason = f"no RAPL package zones under {self.root}"
        self.available = bool(self.zones)

    def _discover(self) -> list[_Zone]:
        if not self.root.is_dir():
            return []
        names = {}
        for path in sorted(self.root.glob("intel-rapl:*")):
            names[path.name] = (path / "name").read_text().strip()
        zones = []
        for zone, name in names.items():
            if (m := _PACKAGE.match(zone)) and name.startswith("package"):
                device = name
            elif (m := _SUBZONE.match(zone)) and name == "dram":
                device = names.get(f"intel-rapl:{m.group(1)}", f"package-{m.group(1)}") + "-dram"
            else:
                continue  # core/uncore lie inside the package figure; psys overlaps it
            path = self.root / zone
            max_range = int((path / "max_energy_range_uj").read_text())
            # PermissionError here (non-root, Linux >= 5.10) makes the whole source unavailable.
            zones.append(_Zone(device, path, max_range, int((path / "energy_uj").read_text())))
        return zones

    def read(self) -> list[Reading]:
        now, out = time.perf_counter(), []
        for zone in list(self.zones):
            try:
                value = int((zone.path / "energy_uj").read_text())
            except (OSError, ValueError) as err:
                log.warning("RAPL zone %s stopped reading (%s); its series is dropped",
                            zone.device, err)
                self.zones.remove(zone)
                continue
            delta = value - zone.last_uj
            if delta < 0:  # the counter wrapped past max_energy_range_uj
                delta += zone.max_range_uj
            zone.total_uj += delta
            zone.last_uj = value
            joules = zone.total_uj / 1e6
            watts = self._rates.setdefault(zone.device, _Rate())(joules, now)
            out.append(Reading(zone.device, self.source, joules=joules, watts=watts))
        return out

    def close(self) -> None:
        pass


class EnergyMonitor:
    """Polls meters (at most every `min_interval` s unless forced); thread-safe."""

    def __init__(self, meters: Sequence[Meter], *, min_interval: float = 1.0) -> None:
        self.meters = list(meters)
        self.min_interval = min_interval
        self._lock = threading.Lock()
        self._last_poll = float("-inf")
        self._readings: list[Reading] = []
        self._closed = False
        for meter in self.meters:
            if not meter.available:  # said to the user by the run's start line and metrics
                log.debug("energy source %s unavailable: %s; no %s series", meter.source,
                          meter.reason, meter.source)
        self.poll(force=True)  # the baseline reading

    def availability(self) -> dict[str, bool]:
        """Every known source, with whether it measures energy here."""
        out = dict.fromkeys(SOURCES, False)
        for meter in self.meters:
            out[meter.source] = out[meter.source] or meter.available
        return out

    def reasons(self) -> dict[str, str]:
        """Why each configured source measures nothing here (absent when it measures)."""
        return {m.source: m.reason for m in self.meters if not m.available}

    def poll(self, *, force: bool = False) -> bool:
        """Read every meter if the interval has passed (or `force`); True when it did."""
        with self._lock:
            now = time.perf_counter()
            if self._closed or (not force and now - self._last_poll < self.min_interval):
                return False
            self._last_poll = now
            self._readings = [r for meter in self.meters for r in meter.read()]
            return True

    def readings(self) -> list[Reading]:
        with self._lock:
            return list(self._readings)

    def joules_by_source(self) -> dict[str, float]:
        """Energy since start per source, summed over devices; measured sources only."""
        out: dict[str, float] = {}
        for r in self.readings():
            if r.joules is not None:
                out[r.source] = out.get(r.source, 0.0) + r.joules
        return out

    def close(self) -> None:
        """Release the meters; the last readings stay (a final scrape still sees them)."""
        with self._lock:
            self._closed = True
            for meter in self.meters:
                meter.close()


@dataclass(frozen=True, slots=True)
class EnergyParts:
    """Energy split into the device part and the host part, and their sum, each naming what
    it sums: a figure without its parts cannot be compared with another run's."""

    device_joules: float | None
    """The run's own GPU (nvml); None when it is not metered (a CPU run, or no NVML)."""
    host_joules: float | None
    """The host: RAPL where readable, else the model estimate; None when neither is on."""
    host_source: str | None
    """rapl | model: which one the host part is."""

    @property
    def total_joules(self) -> float | None:
        parts = [j for j in (self.device_joules, self.host_joules) if j is not None]
        return sum(parts) if parts else None

    @property
    def sources(self) -> str:
        """The sources the total sums, '+'-joined (e.g. nvml+rapl); '' when none."""
        names: list[str | None] = [EnergySource.NVML] if self.device_joules is not None else []
        names += [self.host_source] if self.host_joules is not None else []
        return "+".join(str(n) for n in names)

    @property
    def label(self) -> str:
        """What the total sums, for people: e.g. "device (nvml) + host (model estimate)"."""
        out = []
        if self.device_joules is not None:
            out.append("device (nvml)")
        if self.host_joules is not None:
            out.append("host (model estimate)" if self.host_source == EnergySource.MODEL
                       else f"host ({self.host_source})")
        return " + ".join(out)

    @classmethod
    def of(cls, joules: dict[str, float]) -> EnergyParts:
        """The parts of per-source joules: device from nvml, host from the first host source
        present (measured before the estimate)."""
        host = next((s for s in HOST_SOURCES if s in joules), None)
        return cls(joules.get(EnergySource.NVML), joules[host] if host else None,
                   str(host) if host else None)


@dataclass(frozen=True, slots=True)
class DeviceSnapshot:
    """Device and energy figures at one scrape, as the exporter renders them."""

    readings: list[Reading]
    available: dict[str, bool]
    """Per energy source: does it measure energy here."""
    busy_timing: dict[str, float]
    """Per device: compute share of the last step's wall time, from the step timer."""
    joules_per_token: dict[str, float]
    energy_to_target: dict[str, float]
    """Per source: joules used until eval loss first reached the target; empty until then."""
    parts: EnergyParts
    """The energy since start, split into device and host parts."""
    target_parts: EnergyParts | None
    """The energy to the target, split likewise; None until the target is reached."""
    tokens: int
    target_loss: float | None
