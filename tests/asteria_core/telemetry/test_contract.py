"""The exposition after a short real run holds the contract of docs/metrics.md, and no more;
its runtime figures are the step records' (one channel)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import asteria_core
from asteria_core.policy import Policy
from asteria_core.telemetry.labels import IDLE_CAUSES, PHASES
from tests.asteria_core.telemetry.conftest import families, samples, value
from tests.asteria_core.telemetry.fake_nvml import FakeGpu, FakeNvml, fake_cuda_identity

DOC = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"
ROW = re.compile(r"^\| `(asteria_\w+)` \| (\w+) \|([^|]*)\|")


def contract() -> dict[str, tuple[str, frozenset[str]]]:
    """{exposed name: (type, label names)} from the table in docs/metrics.md."""
    out = {}
    for line in DOC.read_text().splitlines():
        if m := ROW.match(line):
            out[m.group(1)] = (m.group(2), frozenset(re.findall(r"`(\w+)`", m.group(3))))
    return out


def family_name(exposed: str, kind: str) -> str:
    # The parser names a counter family without its _total suffix.
    return exposed.removesuffix("_total") if kind == "counter" else exposed


def tiered_soap(telemetry_run, **kwargs):
    """SOAP with one worker and everything but the working set on disk: every section of the
    record (refresh, tiers with transfers) is filled."""
    policy = Policy(refresh_interval=2, staleness_bound=2, workers=1)
    probe = telemetry_run(steps=1, optimizer="soap", policy=policy,
                          telemetry={"nvml": False, "rapl": False})
    working_set = probe.runtime.tiers.plan.slot_bytes
    disk = Policy(refresh_interval=2, staleness_bound=2, workers=1, offload_mode="disk",
                  device_budget_bytes=working_set)
    return telemetry_run(optimizer="soap", policy=disk, **kwargs)


def test_exposition_after_a_real_run_holds_every_contract_metric_with_type_and_labels(
        telemetry_run, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    trainer = tiered_soap(telemetry_run, steps=6, eval_interval=3,
                          nvml_lib=FakeNvml([FakeGpu()]),  # GPU-only series (memory, nvml)
                          identify=fake_cuda_identity(),  # the run's "GPU" is the fake's
                          telemetry={"model_cpu_watts": 20.0, "target_loss": 100.0,
                                     "rapl": False})
    trainer.train(progress=False)
    fams = families(trainer.telemetry)

    expected = contract()
    assert len(expected) >= 20, "the contract table in docs/metrics.md was not parsed"
    for exposed, (kind, labels) in expected.items():
        name = family_name(exposed, kind)
        assert name in fams, f"{exposed} missing from the exposition"
        family = fams[name]
        assert family.type == kind, (exposed, family.type)
        series = [s for s in family.samples if not s.name.endswith("_created")]
        assert series, f"{exposed} has no series after the run"
        for sample in series:
            assert set(sample.labels) - {"le"} == labels, (exposed, sample.labels)

    documented = {family_name(n, k) for n, (k, _) in expected.items()}
    exported = {n for n in fams if n.startswith("asteria_") and not n.endswith("_created")}
    assert exported <= documented, f"undocumented metrics: {exported - documented}"

    assert value(fams, "asteria_tokens", "_total") == 6 * 4 * 32
    assert value(fams, "asteria_step_seconds", "_count") == 6
    assert {s.labels["phase"] for s in samples(fams["asteria_step_phase_seconds"], "_total")} \
        == set(PHASES)
    assert {s.labels["cause"] for s in samples(fams["asteria_device_idle_seconds"], "_total")} \
        == set(IDLE_CAUSES)
    # One channel: the runtime's gauges and counters are the newest record's figures.
    last = trainer.records[-1]
    assert value(fams, "asteria_eval_loss") == last.eval_loss
    assert value(fams, "asteria_train_loss") == last.loss
    assert value(fams, "asteria_policy_version") == last.policy_version
    assert value(fams, "asteria_refresh_failures", "_total") == last.refresh.failures
    assert value(fams, "asteria_refresh_inline_fallbacks", "_total") == \
        last.refresh.inline_fallbacks
    assert value(fams, "asteria_preconditioner_staleness_max_steps") == \
        last.refresh.staleness_max
    assert value(fams, "asteria_policy_staleness_bound_steps") == last.refresh.staleness_bound
    assert value(fams, "asteria_refresh_queue_depth") == last.refresh.queue_depth
    for tier, used in last.tiers.bytes.items():
        assert value(fams, "asteria_tier_bytes", tier=tier) == used
        assert value(fams, "asteria_tier_capacity_bytes", tier=tier) == \
            last.tiers.capacity_bytes[tier]
    moved = last.tiers.transfer_bytes
    assert moved["disk"]["host"] > 0 and moved["host"]["disk"] > 0
    for src, by_dst in moved.items():
        for dst, nbytes in by_dst.items():
            assert value(fams, "asteria_tier_transfer_bytes", "_total", src=src, dst=dst) == \
                nbytes
    assert value(fams, "asteria_tier_prefetch_hit_ratio") == last.tiers.prefetch_hit_ratio
    for kind, nbytes in last.state.bytes.items():
        assert value(fams, "asteria_optimizer_state_bytes", kind=kind) == nbytes
    assert value(fams, "asteria_steps", "_total") == 6
    blocks = len(trainer.runtime.refresh.blocks)
    assert value(fams, "asteria_preconditioner_staleness_steps", "_count") == 6 * blocks
    assert value(fams, "asteria_refresh_seconds", "_count") == trainer.runtime.refresh.refreshes
    assert value(fams, "asteria_run_info", run_id=trainer.run_id, optimizer="soap",
                 mode="async-deterministic") == 1


def test_each_telemetry_has_its_own_registry(telemetry_run):
    first = telemetry_run(steps=3, telemetry={"nvml": False, "rapl": False})
    second = telemetry_run(steps=5, telemetry={"nvml": False, "rapl": False})
    first.train(progress=False)
    second.train(progress=False)
    assert value(families(first.telemetry), "asteria_steps", "_total") == 3
    assert value(families(second.telemetry), "asteria_steps", "_total") == 5


PROBE = """
import sys
import asteria_core.telemetry
import asteria_core.telemetry.reporter
import asteria_core.train.trainer
print("prometheus_client" in sys.modules)
"""


def test_training_loop_and_reporter_do_not_load_prometheus_client():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_only_the_exporter_module_imports_prometheus_client():
    root = Path(asteria_core.__file__).parent
    importers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                       if re.search(r"^\s*(from|import) prometheus_client", p.read_text(), re.M))
    assert importers == ["telemetry/exporter.py"]
