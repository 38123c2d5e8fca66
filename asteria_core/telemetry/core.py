"""`Telemetry`: the real `Reporter`, the run's metrics and energy meters.

    runtime = asteria.optimizer(model, "soap").runtime  # builds Telemetry unless disabled
    telemetry = runtime.telemetry                   # or RuntimeConfig(reporter=Telemetry(...))
    telemetry.serve("127.0.0.1", 9400)              # optional: /metrics on its own
    body, content_type = telemetry.exposition()     # or render it for the control plane

The runtime hands telemetry each step twice (docs/architecture.md, "One step"): at the step
boundary `split_step` turns the phase spans and the waits reported during the step into the
record's `timing` section, and when the record is complete (loss known) `observe` exports it
and adds the `energy` section, before any listener sees the record.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.energy import (
    DeviceSnapshot,
    EnergyMonitor,
    EnergyParts,
    Meter,
    ModelMeter,
    RaplMeter,
)
from asteria_core.telemetry.exporter import CONTENT_TYPE, MetricsExporter
from asteria_core.telemetry.idle import WaitLedger, breakdown
from asteria_core.telemetry.labels import WAIT_CAUSES, check_label
from asteria_core.telemetry.nvml import GpuIdentity, NvmlMeter, cuda_identity
from asteria_core.telemetry.records import EnergyFigures, StepRecord, TimingFigures

if TYPE_CHECKING:
    from asteria_core.telemetry.timing import PhaseTimer

log = logging.getLogger(__name__)

__all__ = ["CONTENT_TYPE", "Telemetry", "build_meters"]


def build_meters(config: TelemetryConfig, *, nvml_lib: Any = None) -> list[Meter]:
    """The meters the config asks for; `nvml_lib` replaces pynvml (the seam for a fake)."""
    meters: list[Meter] = []
    if config.nvml:
        meters.append(NvmlMeter(nvml_lib))
    if config.rapl:
        meters.append(RaplMeter(config.rapl_root))
    if config.model_cpu_watts > 0:
        meters.append(ModelMeter(config.model_cpu_watts))
    return meters


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    return device.type


class Telemetry:
    """Implements `RunReporter`; one instance per run, with its own metric registry."""

    def __init__(self, config: TelemetryConfig | None = None, *, nvml_lib: Any = None,
                 meters: Sequence[Meter] | None = None,
                 identify: Callable[[torch.device], GpuIdentity | None] = cuda_identity) -> None:
        """`nvml_lib` replaces pynvml and `identify` torch's CUDA device properties: the seams
        for fakes of the hardware a machine lacks."""
        self.config = config or TelemetryConfig()
        self._identify = identify
        self._exporter = MetricsExporter(self._device_snapshot)
        self._ledger = WaitLedger()
        self._timer: PhaseTimer | None = None
        self._device = "cpu"
        self._busy: dict[str, float] = {}
        self._tokens = 0
        self._target: dict[str, float] = {}
        self._target_reached = False  # once: an unmeasured machine's _target stays {}
        self._stop_server: Callable[[], None] | None = None
        self._closed = False
        if meters is None:
            meters = build_meters(self.config, nvml_lib=nvml_lib)
        self.energy = EnergyMonitor(meters, min_interval=self.config.energy_poll_seconds)
        self._estimates = [m for m in meters if isinstance(m, ModelMeter)]
        """Estimates cost no device query: read at every step's end, with the record's time, so
        a record's joules and time are taken together (measured meters keep the poll interval,
        and a record carries their latest reading)."""
        self._step_estimate: dict[str, float] = {}
        self.run_id, self._optimizer = "", ""

    # ----------------------------------------------------------------------- wiring
    def bind(self, timer: PhaseTimer, *, device: torch.device, run_id: str,
             optimizer: str) -> None:
        """Bind to one run: its step timer (waits count in its phase in progress), its identity."""
        if self._timer is not None:
            raise ValueError("this Telemetry is already bound to a run")
        self._timer = timer
        self.run_id, self._optimizer = run_id, optimizer
        self.set_device(device)
        self.set_mode("native")

    def set_device(self, device: torch.device) -> None:
        """The device the run trains on (at bind, and again if the model moved before its first
        step): NVML meters that GPU alone."""
        self._device = device_label(device)
        for meter in self.energy.meters:
            if isinstance(meter, NvmlMeter):
                meter.bind(self._identify(device), self._device)
        self.energy.poll(force=True)

    def energy_sources(self) -> str:
        """One line for the run's start: each energy source, measuring or why not."""
        reasons = self.energy.reasons()
        parts = []
        for meter in self.energy.meters:
            parts.append(f"{meter.source} on" if meter.available
                         else f"{meter.source} off ({reasons[meter.source]})")
        return "energy: " + ("; ".join(parts) if parts else "no meters configured")

    # ----------------------------------------------------------------------- Reporter
    @contextmanager
    def wait(self, cause: str) -> Iterator[None]:
        check_label("cause", cause, WAIT_CAUSES)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._add_wait(cause, time.perf_counter() - t0)

    def add_wait(self, cause: str, seconds: float) -> None:
        check_label("cause", cause, WAIT_CAUSES)
        self._add_wait(cause, seconds)

    def _add_wait(self, cause: str, seconds: float) -> None:
        timer = self._timer
        in_step = timer is not None and timer.in_step
        phase = timer.current_phase if timer is not None and in_step else None
        self._ledger.add(cause, seconds, in_step=in_step, phase=phase)

    def refresh_done(self, seconds: float) -> None:
        self._exporter.refresh_seconds.observe(seconds)

    def set_staleness(self, steps: Sequence[int]) -> None:
        self._exporter.staleness.observe_all(steps)

    def set_mode(self, mode: str) -> None:
        # asteria_run_info is the single series that carries the run id.
        self._exporter.set_run_info(self.run_id, self._optimizer, mode)

    # ----------------------------------------------------------------------- per step
    def split_step(self, phase_seconds: dict[str, float], wall: float) -> TimingFigures:
        # The step ends now: the estimate up to here belongs to this step's record. Read at
        # observe time instead, it would also hold what ran between the step and its record's
        # completion (an evaluation, a checkpoint), over the step's own wall time.
        estimate: dict[str, float] = {}
        for meter in self._estimates:
            estimate[meter.source] = estimate.get(meter.source, 0.0) + meter.joules()
        self._step_estimate = estimate
        compute, idle = breakdown(phase_seconds, wall, self._ledger.take_step())
        busy = sum(compute.values()) / wall if wall > 0 else 0.0
        return TimingFigures(compute_seconds=compute, idle_seconds=idle, device_busy_ratio=busy)

    def observe(self, record: StepRecord) -> None:
        """The one channel: every gauge and counter of the run is derived from records."""
        if record.timing is not None:
            self._busy[self._device] = record.timing.device_busy_ratio
        self._exporter.observe(record)
        self._tokens += record.tokens
        self._exporter.add_idle(self._ledger.take_outside())
        self.energy.poll()
        joules = {**self.energy.joules_by_source(), **self._step_estimate}
        self._step_estimate = {}
        if joules:
            parts = EnergyParts.of(joules)
            record.energy = EnergyFigures(
                joules=joules, device_joules=parts.device_joules, host_joules=parts.host_joules,
                host_source=parts.host_source, total_joules=parts.total_joules,
                parts=parts.sources)
        if record.eval_loss is not None:
            self._check_target(record)

    def _check_target(self, record: StepRecord) -> None:
        target = self.config.target_loss
        if target <= 0 or self._target_reached or record.eval_loss is None \
                or record.eval_loss > target:
            return
        self._target_reached = True
        self.energy.poll(force=True)
        self._target = self.energy.joules_by_source()
        parts = EnergyParts.of(self._target)
        if record.energy is not None:
            record.energy.to_target_joules = dict(self._target)
            record.energy.to_target_total_joules = parts.total_joules
        total = parts.total_joules
        log.info("eval loss %.4f reached the target %.4f at step %d; energy so far: %s",
                 record.eval_loss, target, record.step,
                 f"{total:.1f} J = {parts.label}" if total is not None else "unmeasured")

    def _device_snapshot(self) -> DeviceSnapshot:
        self.energy.poll()
        joules = self.energy.joules_by_source()
        tokens = self._tokens
        return DeviceSnapshot(
            readings=self.energy.readings(),
            available=self.energy.availability(),
            busy_timing=dict(self._busy),
            joules_per_token={s: j / tokens for s, j in joules.items()} if tokens else {},
            energy_to_target=dict(self._target),
            parts=EnergyParts.of(joules),
            target_parts=EnergyParts.of(self._target) if self._target else None,
            tokens=tokens,
            target_loss=self.config.target_loss if self.config.target_loss > 0 else None,
        )

    # ----------------------------------------------------------------------- export
    @property
    def registry(self):
        """The private prometheus_client registry (for `make_asgi_app(registry=...)`)."""
        return self._exporter.registry

    def exposition(self) -> tuple[bytes, str]:
        """The Prometheus text exposition of this run, and its content type."""
        return self._exporter.exposition(), CONTENT_TYPE

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Serve /metrics over HTTP on a daemon thread; returns the bound port."""
        if self._stop_server is not None:
            raise ValueError("this Telemetry already serves /metrics")
        self._stop_server, bound = self._exporter.serve(host, port)
        return bound

    def close(self) -> None:
        """Stop serving and release the meters; the metrics stay readable. Idempotent."""
        if self._stop_server is not None:
            self._stop_server()
            self._stop_server = None
        if not self._closed:
            self._closed = True
            self.energy.poll(force=True)
            self.energy.close()
