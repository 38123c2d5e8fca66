"""Telemetry's config: which meters to read, the energy estimate, where /metrics is served."""

from __future__ import annotations

from dataclasses import dataclass

from asteria_core.fields import Kind, setting
from asteria_core.telemetry.trackers import tracker_names
from asteria_core.validation import check, check_settings


@dataclass(kw_only=True, slots=True)
class TelemetryConfig:
    """Metrics, idle attribution and energy meters (asteria_core.telemetry)."""

    enabled: bool = setting(
        True, Kind.BOOL, "Collect metrics, idle attribution and energy; false runs with a no-op "
        "reporter.")
    energy_poll_seconds: float = setting(
        1.0, Kind.FLOAT, "Read the energy meters at most this often during training (and at "
        "every scrape).", minimum=0.0, maximum=3600.0)
    nvml: bool = setting(
        True, Kind.BOOL, "Read GPU energy, power, memory and utilization from NVML where it is "
        "present.")
    rapl: bool = setting(
        True, Kind.BOOL, "Read CPU package energy from RAPL where it is readable (root only on "
        "Linux >= 5.10).")
    rapl_root: str = setting("/sys/class/powercap", Kind.STR,
                             "Folder of the powercap sysfs tree.", max_length=4096)
    model_cpu_watts: float = setting(
        0.0, Kind.FLOAT, "> 0 turns on a modelled CPU energy estimate: process CPU seconds x "
        'these watts per busy core, exported only with source="model"; 0 leaves it off.',
        minimum=0.0, maximum=10000.0)
    target_loss: float = setting(
        0.0, Kind.FLOAT, "Record the energy used until eval loss first reaches this value; 0 "
        "disables.", minimum=0.0, maximum=1e6)
    metrics_host: str = setting(
        "127.0.0.1", Kind.STR, "Address `asteria train` serves /metrics on, when metrics_port is "
        "set.", min_length=1, max_length=255)
    trackers: str = setting(
        "", Kind.STR, "Also log every step record to these trackers, comma-separated: "
        "tensorboard | mlflow | wandb (rank 0 of a data-parallel run; empty: none).",
        max_length=64, words="a comma-separated list of tensorboard | mlflow | wandb, or empty")
    trackers_dir: str = setting(
        "", Kind.STR, "Folder the trackers write under; empty: the run's folder, trackers/.",
        max_length=4096)
    metrics_port: int = setting(
        0, Kind.INT, "Serve /metrics on this port during `asteria train`; 0 does not serve.",
        minimum=0, maximum=65535)

    def __post_init__(self) -> None:
        check_settings(self, "telemetry")
        tracker_names(self.trackers)
        check(not (self.metrics_port and not self.enabled), "telemetry.metrics_port",
               self.metrics_port, "0 while telemetry.enabled is false")
