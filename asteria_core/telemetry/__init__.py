"""Telemetry: the Reporter interface, step records and phase timing, idle attribution, energy
meters, Prometheus metrics.

Importing this package (or `asteria_core.telemetry.reporter`, which the runtime uses) loads no
prometheus_client: `Telemetry` and the exporter load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.labels import IDLE_CAUSES, TIERS, WAIT_CAUSES
from asteria_core.telemetry.records import (
    EnergyFigures,
    RefreshFigures,
    StepRecord,
    TierFigures,
    TimingFigures,
)
from asteria_core.telemetry.reporter import NullReporter, Reporter, RunReporter

_LAZY = {
    "Telemetry": "asteria_core.telemetry.core",
    "CONTENT_TYPE": "asteria_core.telemetry.core",
}

__all__ = ["CONTENT_TYPE", "IDLE_CAUSES", "TIERS", "WAIT_CAUSES", "EnergyFigures",
           "NullReporter", "RefreshFigures", "Reporter", "RunReporter", "StepRecord",
           "TelemetryConfig", "Telemetry", "TierFigures", "TimingFigures"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
