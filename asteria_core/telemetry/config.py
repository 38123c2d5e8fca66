"""Telemetry's config: which meters to read, the energy estimate, where /metrics is served."""

from __future__ import annotations

from dataclasses import dataclass

from asteria_core.validation import check, finite_in, is_int


@dataclass(kw_only=True, slots=True)
class TelemetryConfig:
    """Metrics, idle attribution and energy meters (asteria_core.telemetry)."""

    enabled: bool = True
    """Collect metrics, idle attribution and energy; false runs with a no-op reporter."""
    energy_poll_seconds: float = 1.0
    """Read the energy meters at most this often during training (and at every scrape)."""
    nvml: bool = True
    """Read GPU energy, power, memory and utilization from NVML where it is present."""
    rapl: bool = True
    """Read CPU package energy from RAPL where it is readable (root only on Linux >= 5.10)."""
    rapl_root: str = "/sys/class/powercap"
    """Folder of the powercap sysfs tree."""
    model_cpu_watts: float = 0.0
    """> 0 turns on a modelled CPU energy estimate: process CPU seconds x these watts per
    busy core, exported only with source="model"; 0 leaves it off."""
    target_loss: float = 0.0
    """Record the energy used until eval loss first reaches this value; 0 disables."""
    metrics_host: str = "127.0.0.1"
    """Address `asteria train` serves /metrics on, when metrics_port is set."""
    metrics_port: int = 0
    """Serve /metrics on this port during `asteria train`; 0 does not serve."""

    def __post_init__(self) -> None:
        finite_in("telemetry.energy_poll_seconds", self.energy_poll_seconds, 0.0, 3600.0)
        finite_in("telemetry.model_cpu_watts", self.model_cpu_watts, 0.0, 10000.0)
        finite_in("telemetry.target_loss", self.target_loss, 0.0, 1e6)
        check(isinstance(self.metrics_host, str) and self.metrics_host != "",
               "telemetry.metrics_host", self.metrics_host, "a host name or address")
        check(is_int(self.metrics_port) and 0 <= self.metrics_port <= 65535,
               "telemetry.metrics_port", self.metrics_port, "an integer in [0, 65535]")
        check(not (self.metrics_port and not self.enabled), "telemetry.metrics_port",
               self.metrics_port, "0 while telemetry.enabled is false")
