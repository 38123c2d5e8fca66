"""Every bounded label value the telemetry knows, in one module that imports nothing: the phases
of a step, the causes of idle time, the state tiers, the kinds of optimizer state and the energy
sources. The tuples hold the plain values (what records, JSON and Prometheus labels carry); code
compares with the members.
"""

from __future__ import annotations

from asteria_core.compat import Choice


class Phase(Choice):
    """Where a step's time goes on the training thread."""

    DATA = "data"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    BOUNDARY = "boundary"  # the runtime's step boundary: swaps, snapshots, policy, records


class IdleCause(Choice):
    """Why the training thread waited. A part reports the first four (WAIT_CAUSES); OTHER, the
    unexplained rest of a step, is derived, never reported."""

    REFRESH_WAIT = "refresh_wait"
    TRANSFER_WAIT = "transfer_wait"
    SYNC_WAIT = "sync_wait"
    DATA_WAIT = "data_wait"
    OTHER = "other"


class Tier(Choice):
    """Where a piece of optimizer state lives."""

    DEVICE = "device"
    HOST = "host"
    DISK = "disk"


class StateKind(Choice):
    """What a piece of optimizer state is (telemetry/state_bytes.py sorts the state into these)."""

    MOMENTS = "moments"  # Adam's first and second moments, in whatever basis
    FACTORS = "factors"  # a second-order optimizer's factor statistics
    BASES = "bases"  # the bases (or inverse roots) in use
    OTHER = "other"  # everything else: step counts, eigenvalues, grafting, momentum


class EnergySource(Choice):
    NVML = "nvml"  # measured: the GPU's own counter
    RAPL = "rapl"  # measured: the CPU package's counter
    MODEL = "model"  # an estimate: CPU seconds x watts


class EnergyPart(Choice):
    """Which side of the machine a source meters: a comparison between runs sums both."""

    DEVICE = "device"  # the run's own GPU (nvml)
    HOST = "host"  # the CPU side: packages and DRAM (rapl), else the estimate (model)
    TOTAL = "total"  # device + host, the parts measured or estimated here


PART_OF_SOURCE: dict[str, EnergyPart] = {
    EnergySource.NVML: EnergyPart.DEVICE, EnergySource.RAPL: EnergyPart.HOST,
    EnergySource.MODEL: EnergyPart.HOST}
HOST_SOURCES = (EnergySource.RAPL, EnergySource.MODEL)
"""The host part's sources, the first present wins: measured before the estimate."""

PHASES = tuple(p.value for p in Phase)
IDLE_CAUSES = tuple(c.value for c in IdleCause)
WAIT_CAUSES = tuple(c.value for c in IdleCause if c != IdleCause.OTHER)
"""Causes a part may report."""
TIERS = tuple(t.value for t in Tier)
STATE_KINDS = tuple(k.value for k in StateKind)
SOURCES = tuple(s.value for s in EnergySource)


def check_label(kind: str, value: str, allowed: tuple[str, ...]) -> None:
    """Labels are bounded: a value outside its set is a programming error."""
    if value not in allowed:
        raise ValueError(f"{kind}: got {value!r}; allowed: {' | '.join(allowed)}")
