"""Asteria: second-order optimizers as an observable, steerable training runtime.

    import asteria_core as asteria
    opt = asteria.optimizer(model, "soap", lr=3e-3, policy=asteria.Policy(staleness_bound=5))
    for x, y in loader:
        model(x, y).backward()
        opt.step(); opt.zero_grad()      # the step boundary runs inside step()
    opt.runtime.close()

The names below are the stable public API; docs/architecture.md describes how they fit.
"""

from asteria_core.optim import SOAP, KLShampoo, Shampoo
from asteria_core.policy import LivePolicy, Policy, PolicyChange, PolicyError
from asteria_core.runtime import OPTIMIZERS, Runtime, RuntimeConfig, build_optimizer, optimizer
from asteria_core.telemetry import NullReporter, StepRecord, TelemetryConfig

__version__ = "0.1.0"

__all__ = ["OPTIMIZERS", "SOAP", "KLShampoo", "LivePolicy", "NullReporter", "Policy",
           "PolicyChange", "PolicyError", "Runtime", "RuntimeConfig", "Shampoo", "StepRecord",
           "Telemetry", "TelemetryConfig", "build_optimizer", "optimizer"]


def __getattr__(name: str):
    if name == "Telemetry":  # on first use: importing asteria_core loads no prometheus_client
        from asteria_core.telemetry import Telemetry

        return Telemetry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
