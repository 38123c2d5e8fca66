"""Prometheus exposition: the only module of the runtime that imports prometheus_client.

Every metric lives in a private `CollectorRegistry`, so several runs (or tests) in one process
never collide. The step record is the source: `observe(record)` counts its step, tokens, phases
and idle time, and every gauge and counter of the runtime (staleness, queue, policy, tiers,
refresh failures, bytes moved, the optimizer's state bytes, a rank's exchange) is read from the
newest record's sections (`RECORD_GAUGES`, `_RecordCollector`). Histograms of events a record
does not hold (each refresh's time, each block's staleness) are fed by the reporter; device and
energy figures come from a collector that reads the energy monitor at scrape time. The contract
is docs/metrics.md.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, start_http_server
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from asteria_core.telemetry.energy import DeviceSnapshot
from asteria_core.telemetry.labels import IDLE_CAUSES, PART_OF_SOURCE, PHASES, EnergyPart
from asteria_core.telemetry.records import StepRecord

CONTENT_TYPE = CONTENT_TYPE_LATEST
STEP_BUCKETS = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)
REFRESH_BUCKETS = (.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300)
STALENESS_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)

Read = Callable[[StepRecord], float | None]
# Gauges read from step records: each holds the newest record's value that is not None (so the
# last eval loss stays between evaluations), absent until a record has one (no made-up zeros).
RECORD_GAUGES: dict[str, tuple[str, Read]] = {
    "asteria_train_loss": ("Loss of the last step's batch.", lambda r: r.loss),
    "asteria_eval_loss": ("Last validation loss.", lambda r: r.eval_loss),
    "asteria_preconditioner_staleness_max_steps": (
        "Largest staleness over preconditioner blocks at the last step.",
        lambda r: None if r.refresh is None else r.refresh.staleness_max),
    "asteria_refresh_queue_depth": ("Refreshes queued or running.",
                                    lambda r: None if r.refresh is None else r.refresh.queue_depth),
    "asteria_refresh_workers_busy_ratio": (
        "Share of refresh worker time spent refreshing.",
        lambda r: None if r.refresh is None else r.refresh.workers_busy_ratio),
    "asteria_policy_version": ("Version of the live policy the last step trained under.",
                               lambda r: r.policy_version),
    "asteria_tier_prefetch_hit_ratio": (
        "Share of off-device optimizer-state uses whose prefetch was done in time, since the "
        "run started.", lambda r: None if r.tiers is None else r.tiers.prefetch_hit_ratio),
    "asteria_policy_staleness_bound_steps": (
        "Staleness bound S of the live policy, in steps.",
        lambda r: None if r.refresh is None else r.refresh.staleness_bound),
    "asteria_refresh_lead_steps": (
        "Steps from a block's read to its swap (d - swap window + 1), deterministic mode.",
        lambda r: None if r.refresh is None else r.refresh.swap_lead),
    "asteria_refresh_latency_steps": (
        "90th percentile over the last 64 refreshes of the time from a job's release until "
        "its result was ready, in steps (their own time, waits left out); above the lead the "
        "step waits for it.",
        lambda r: None if r.refresh is None else r.refresh.refresh_latency_steps),
    "asteria_refresh_background_load": (
        "Refresh work per interval divided by worker capacity at the steps' own time (refresh "
        "waits left out); above 1 the workers cannot keep up and steps wait.",
        lambda r: None if r.refresh is None else r.refresh.background_load),
}


class _DeviceCollector(Collector):
    """Busy ratio, energy, power, GPU memory and energy availability, read at scrape time."""

    def __init__(self, snapshot: Callable[[], DeviceSnapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        busy = GaugeMetricFamily(
            "asteria_device_busy_ratio", "Share of time the device computed: source=timing is "
            "compute/wall of the last step, source=nvml the driver's kernel-active share.",
            labels=["device", "source"])
        for device, ratio in snap.busy_timing.items():
            busy.add_metric([device, "timing"], ratio)
        energy = CounterMetricFamily(
            "asteria_energy_joules", "Energy used since telemetry started; source=model is an "
            "estimate (CPU seconds x configured watts), nvml and rapl are measured.",
            labels=["device", "source"])
        power = GaugeMetricFamily("asteria_power_watts", "Present power draw; source=model is "
                                  "an estimate.", labels=["device", "source"])
        mem_used = GaugeMetricFamily("asteria_gpu_memory_used_bytes", "GPU memory in use "
                                     "(NVML, whole device).", labels=["device"])
        mem_total = GaugeMetricFamily("asteria_gpu_memory_capacity_bytes", "GPU memory size "
                                      "(NVML).", labels=["device"])
        for r in snap.readings:
            if r.joules is not None:
                energy.add_metric([r.device, r.source], r.joules)
            if r.watts is not None:
                power.add_metric([r.device, r.source], r.watts)
            if r.busy_ratio is not None:
                busy.add_metric([r.device, r.source], r.busy_ratio)
            if r.memory_used_bytes is not None and r.memory_total_bytes is not None:  # together
                mem_used.add_metric([r.device], r.memory_used_bytes)
                mem_total.add_metric([r.device], r.memory_total_bytes)
        available = GaugeMetricFamily("asteria_energy_source_available", "1 when the energy "
                                      "source measures here, 0 when it does not (then it has "
                                      "no series).", labels=["source"])
        for source, ok in snap.available.items():
            available.add_metric([source], 1.0 if ok else 0.0)
        per_token = GaugeMetricFamily(
            "asteria_joules_per_token", "Energy since start divided by tokens trained since "
            "start: per source with its part (device: nvml; host: rapl or the model estimate), "
            "and part=total, the device and host parts summed (source names what it sums, e.g. "
            "nvml+rapl): the figure to compare runs by.", labels=["part", "source"])
        for source, value in snap.joules_per_token.items():
            per_token.add_metric([PART_OF_SOURCE[source], source], value)
        total = snap.parts.total_joules
        if total is not None and snap.tokens:
            per_token.add_metric([EnergyPart.TOTAL, snap.parts.sources], total / snap.tokens)
        to_target = GaugeMetricFamily(
            "asteria_energy_to_target_joules", "Energy used until eval loss first reached the "
            "target, set once: per source with its part, and part=total (device + host; source "
            "names what it sums).", labels=["part", "source"])
        for source, value in snap.energy_to_target.items():
            to_target.add_metric([PART_OF_SOURCE[source], source], value)
        target = snap.target_parts
        if target is not None and target.total_joules is not None:
            to_target.add_metric([EnergyPart.TOTAL, target.sources], target.total_joules)
        yield from (busy, energy, power, mem_used, mem_total, available, per_token, to_target)
        if snap.target_loss is not None:
            yield GaugeMetricFamily("asteria_target_eval_loss", "The configured target eval "
                                    "loss for energy-to-target.", value=snap.target_loss)


class _BatchHistogram(Collector):
    """A histogram fed a batch of observations at once, tallied per distinct value first: the
    staleness of every block at every step is thousands of values with a few distinct ones
    (0 to S), so a step costs a few bucket updates instead of one histogram call per block.
    Exposed as prometheus_client's own Histogram is (buckets, count, sum, created)."""

    def __init__(self, name: str, doc: str, buckets: Iterable[float]) -> None:
        self.name, self.doc = name, doc
        self._bounds = [float(b) for b in buckets] + [float("inf")]
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._created = time.time()
        self._lock = threading.Lock()

    def observe_all(self, values: Iterable[float]) -> None:
        tally = Tally(values)
        with self._lock:
            for value, count in tally.items():
                self._counts[bisect.bisect_left(self._bounds, value)] += count
                self._sum += value * count

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip(self._bounds, counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), float(cumulative)))
        family = HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=total)
        family.samples.append(Sample(f"{self.name}_created", {}, self._created))
        yield family


class _RecordCollector(Collector):
    """The runtime's gauges and counters, read from step records: RECORD_GAUGES; the tiers'
    bytes, budgets and bytes moved; the optimizer's state bytes by kind; refresh failures and
    inline fallbacks (counters whose value is the total the newest record carries); a
    data-parallel rank's place and exchange. A section's series are absent until a record has
    that section."""

    def __init__(self) -> None:
        self._values: dict[str, float] = {}
        self._record: StepRecord | None = None

    def observe(self, record: StepRecord) -> None:
        values = dict(self._values)  # replaced whole: a scrape reads one consistent set
        for name, (_doc, read) in RECORD_GAUGES.items():
            value = read(record)
            if value is not None:
                values[name] = value
        self._values, self._record = values, record

    def collect(self) -> Iterator[Metric]:
        values, record = self._values, self._record
        for name, (doc, _read) in RECORD_GAUGES.items():
            gauge = GaugeMetricFamily(name, doc)
            if name in values:
                gauge.add_metric([], values[name])
            yield gauge
        if record is None:
            return
        yield from self._refresh(record)
        yield from self._tiers(record)
        yield from self._state(record)
        yield from self._distributed(record)
        yield from self._autopilot(record)

    @staticmethod
    def _refresh(record: StepRecord) -> Iterator[Metric]:
        f = record.refresh
        if f is None:
            return
        yield CounterMetricFamily("asteria_refresh_failures", "Refreshes that failed (the "
                                  "previous basis was kept).", value=f.failures)
        yield CounterMetricFamily("asteria_refresh_inline_fallbacks", "Refreshes meant for a "
                                  "worker that ran on the training thread.",
                                  value=f.inline_fallbacks)

    @staticmethod
    def _tiers(record: StepRecord) -> Iterator[Metric]:
        f = record.tiers
        if f is None:
            return
        held = GaugeMetricFamily("asteria_tier_bytes", "Optimizer-state bytes held in a tier.",
                                 labels=["tier"])
        for tier, used in f.bytes.items():
            held.add_metric([tier], used)
        budget = GaugeMetricFamily("asteria_tier_capacity_bytes", "Byte budget of a tier.",
                                   labels=["tier"])
        for tier, capacity in f.capacity_bytes.items():
            budget.add_metric([tier], capacity)
        moved = CounterMetricFamily("asteria_tier_transfer_bytes", "Bytes moved between tiers.",
                                    labels=["src", "dst"])
        for src, by_dst in f.transfer_bytes.items():
            for dst, nbytes in by_dst.items():
                moved.add_metric([src, dst], nbytes)
        yield from (held, budget, moved)

    @staticmethod
    def _state(record: StepRecord) -> Iterator[Metric]:
        f = record.state
        if f is None:
            return
        held = GaugeMetricFamily("asteria_optimizer_state_bytes", "Optimizer-state bytes by "
                                 "kind (moments, factors, bases, other), as last counted.",
                                 labels=["kind"])
        for kind, nbytes in f.bytes.items():
            held.add_metric([kind], nbytes)
        yield held

    @staticmethod
    def _distributed(record: StepRecord) -> Iterator[Metric]:
        # No `rank` label: Prometheus puts the file_sd target's `rank` on every series of it.
        f = record.distributed
        if f is None:
            return
        yield GaugeMetricFamily("asteria_distributed_rank", "This process's rank in the "
                                "data-parallel run.", value=f.rank)
        yield GaugeMetricFamily("asteria_distributed_node", "The node this rank runs on "
                                "(torchrun's layout).", value=f.node)
        yield GaugeMetricFamily("asteria_distributed_owned_blocks", "Preconditioner blocks "
                                "this rank refreshes.", value=f.owned_blocks)
        moved = CounterMetricFamily("asteria_distributed_exchange_bytes", "Logical bytes "
                                    "this rank's optimizer collectives (new bases and headers, "
                                    "policy sync) moved since the start: sent (payload x "
                                    "receivers) and received.",
                                    labels=["direction"])
        moved.add_metric(["sent"], f.bytes_sent)
        moved.add_metric(["received"], f.bytes_received)
        yield moved


    @staticmethod
    def _autopilot(record: StepRecord) -> Iterator[Metric]:
        f = record.autopilot
        if f is None:
            return
        decisions = CounterMetricFamily(
            "asteria_autopilot_decisions", "The autopilot's decisions by policy field and "
            "outcome (proposed, applied, accepted, dismissed, rejected).",
            labels=["field", "outcome"])
        for name, by_outcome in f.decisions.items():
            for outcome, n in by_outcome.items():
                decisions.add_metric([name, outcome], n)
        mode = GaugeMetricFamily("asteria_autopilot_mode", "1 for the autopilot's mode "
                                 "(off, propose, apply).", labels=["mode"])
        mode.add_metric([f.mode], 1)
        yield from (decisions, mode)
        yield GaugeMetricFamily("asteria_autopilot_open_proposals", "Autopilot proposals "
                                "waiting for the operator.", value=f.open_proposals)


class MetricsExporter:
    """The run's metrics; methods are called by `Telemetry`, never by the training loop."""

    def __init__(self, snapshot: Callable[[], DeviceSnapshot]) -> None:
        r = self.registry = CollectorRegistry()
        self.steps = Counter("asteria_steps", "Optimizer steps done.", registry=r)
        self.tokens = Counter("asteria_tokens", "Tokens trained on.", registry=r)
        self.step_seconds = Histogram("asteria_step_seconds", "Wall time of a step.",
                                      buckets=STEP_BUCKETS, registry=r)
        phase = self._phase_metric = Counter(
            "asteria_step_phase_seconds", "Compute time per step phase, waits excluded; with "
            "the idle causes it sums to the step time.", ["phase"], registry=r)
        self.phase = {p: phase.labels(p) for p in PHASES}
        idle = Counter("asteria_device_idle_seconds", "Time the step waited, by cause; other "
                       "is the step time no phase or reported wait explains.", ["cause"],
                       registry=r)
        self.idle = {c: idle.labels(c) for c in IDLE_CAUSES}
        self.staleness = _BatchHistogram("asteria_preconditioner_staleness_steps", "Staleness "
                                         "of each preconditioner block in use, observed every "
                                         "step.", STALENESS_BUCKETS)
        r.register(self.staleness)
        self.refresh_seconds = Histogram("asteria_refresh_seconds", "Time of one "
                                         "preconditioner refresh.", buckets=REFRESH_BUCKETS,
                                         registry=r)
        self.run_info = Gauge("asteria_run_info", "Always 1; the run's identity as labels.",
                              ["run_id", "optimizer", "mode"], registry=r)
        self._run_labels: tuple[str, str, str] | None = None
        r.register(_DeviceCollector(snapshot))
        self._records = _RecordCollector()
        r.register(self._records)

    def set_run_info(self, run_id: str, optimizer: str, mode: str) -> None:
        if self._run_labels is not None:
            self.run_info.remove(*self._run_labels)
        self._run_labels = (run_id, optimizer, mode)
        self.run_info.labels(*self._run_labels).set(1)

    def observe(self, record: StepRecord) -> None:
        """One finished step's record: its step, tokens, time, phases and idle time are
        counted; the runtime's gauges and counters read from it from now on."""
        self.steps.inc()
        self.tokens.inc(record.tokens)
        if record.timing is not None:
            self.step_seconds.observe(record.step_seconds)
            for phase, seconds in record.timing.compute_seconds.items():
                child = self.phase.get(phase)
                if child is None:  # a phase name added to the timer later; still bounded
                    child = self.phase[phase] = self._phase_metric.labels(phase)
                child.inc(seconds)
            self.add_idle(record.timing.idle_seconds)
        self._records.observe(record)

    def add_idle(self, idle: dict[str, float]) -> None:
        for cause, seconds in idle.items():
            if seconds > 0:
                self.idle[cause].inc(seconds)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> tuple[Callable[[], None], int]:
        """Serve /metrics on a daemon thread; returns (stop, bound port)."""
        server, thread = start_http_server(port, addr=host, registry=self.registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)

        return stop, server.server_address[1]
