"""Energy: NVML (absent here; a fake with known counters), RAPL from a fixture tree, the
modelled estimate, joules per token and energy to a target loss."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
import torch

from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.core import Telemetry
from asteria_core.telemetry.energy import (
    EnergyMonitor,
    EnergyParts,
    ModelMeter,
    RaplMeter,
    count_process,
    run_cpu_seconds,
)
from tests.asteria_core.telemetry.conftest import families, samples, value
from tests.asteria_core.telemetry.fake_nvml import FakeGpu, FakeNvml, fake_cuda_identity

NVML_ONLY = {"nvml": True, "rapl": False, "model_cpu_watts": 0.0}


def energy_series(fams, source):
    return samples(fams["asteria_energy_joules"], "_total", source=source) + \
        samples(fams["asteria_power_watts"], source=source)


def test_nvml_is_really_absent_on_this_machine_so_no_energy_series_and_availability_0(
        telemetry_run, caplog):
    """A CPU run (this machine has no GPU): no NVML series, and no INFO line about it (a CPU
    user's log stays quiet); the run's start line says why instead."""
    with caplog.at_level(logging.INFO, logger="asteria_core.telemetry"):
        trainer = telemetry_run(steps=3, telemetry=NVML_ONLY)
        trainer.train(progress=False)
    fams = families(trainer.telemetry)
    assert energy_series(fams, "nvml") == []
    assert samples(fams["asteria_energy_joules"], "_total") == []  # no source at all: no zeros
    assert samples(fams["asteria_gpu_memory_used_bytes"]) == []
    assert samples(fams["asteria_device_busy_ratio"], source="nvml") == []
    assert value(fams, "asteria_energy_source_available", source="nvml") == 0
    assert trainer.records[-1].energy is None
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    line = trainer.telemetry.energy_sources()
    assert line.startswith("energy: nvml off (") and ("cpu" in line or "NVML" in line), line


def test_fake_nvml_without_a_driver_gives_no_series_and_says_why_once_at_start(caplog):
    with caplog.at_level(logging.INFO, logger="asteria_core.telemetry"):
        telemetry = Telemetry(TelemetryConfig(**NVML_ONLY),
                              nvml_lib=FakeNvml([], init_error="Driver Not Loaded"))
    fams = families(telemetry)
    assert energy_series(fams, "nvml") == []
    assert value(fams, "asteria_energy_source_available", source="nvml") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    assert "Driver Not Loaded" in telemetry.energy_sources()


def test_fake_nvml_with_known_counters_gives_the_exact_joules(telemetry_run, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGpu(energy_mj=7_000_000, power_mw=312_500, memory=(3 << 30, 80 << 30),
                  util_percent=87, uuid="GPU-fake-0")
    nvml = FakeNvml([gpu])
    trainer = telemetry_run(steps=10, eval_interval=5, nvml_lib=nvml, telemetry=NVML_ONLY,
                            identify=fake_cuda_identity("fake-0"))

    def burn(step):  # the GPU's counter advances a known 1234 mJ per step
        gpu.energy_mj += 1234

    trainer.runtime.at_boundary(burn)
    trainer.train(progress=False)
    fams = families(trainer.telemetry)
    joules = value(fams, "asteria_energy_joules", "_total", device="cuda:0", source="nvml")
    assert joules == 12_340 / 1000
    assert value(fams, "asteria_power_watts", device="cuda:0", source="nvml") == 312.5
    assert value(fams, "asteria_device_busy_ratio", device="cuda:0", source="nvml") == 0.87
    assert value(fams, "asteria_gpu_memory_used_bytes", device="cuda:0") == 3 << 30
    assert value(fams, "asteria_gpu_memory_capacity_bytes", device="cuda:0") == 80 << 30
    assert value(fams, "asteria_energy_source_available", source="nvml") == 1
    assert value(fams, "asteria_joules_per_token", part="device", source="nvml") == \
        (12_340 / 1000) / (10 * 128)
    records = trainer.records
    assert [r.energy.joules["nvml"] for r in records] == \
        [1234 * s / 1000 for s in range(1, 11)]
    trainer.close()
    assert nvml.shutdowns == 1
    assert value(families(trainer.telemetry), "asteria_energy_joules", "_total",
                 source="nvml") == joules  # the last reading stays readable after close


def node_of_three():
    """Three fake GPUs; NVML numbers them in PCI order, each with its own counter."""
    return [FakeGpu(energy_mj=0, uuid=f"GPU-aaaa-{i}", pci=(0, 0x10 * (i + 1), 0))
            for i in range(3)]


def test_each_rank_meters_its_own_gpu_found_by_uuid_not_the_node(monkeypatch):
    """Two ranks on a node of three fake GPUs: each rank's meter counts its own device's
    energy only (before, every rank summed every visible GPU: the node's energy, W times)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = node_of_three()
    nvml = FakeNvml(gpus)
    # CUDA's own order (fastest first) differs from NVML's: cuda:0 is NVML's device 2, and
    # cuda:1 NVML's device 0; only the UUID says which is which.
    ranks = [Telemetry(TelemetryConfig(**NVML_ONLY), nvml_lib=nvml,
                       identify=fake_cuda_identity(uuid, label=label))
             for uuid, label in (("aaaa-2", "cuda:0"), ("aaaa-0", "cuda:1"))]
    for rank in ranks:
        rank.set_device(torch.device("cuda", 0))
    gpus[0].energy_mj += 1_000
    gpus[1].energy_mj += 50_000  # no rank's device: counted by none
    gpus[2].energy_mj += 7_000
    got = []
    for rank in ranks:
        rank.energy.poll(force=True)
        got.append({(r.device, r.joules) for r in rank.energy.readings()})
        rank.close()
    assert got == [{("cuda:0", 7.0)}, {("cuda:1", 1.0)}]


def test_cuda_visible_devices_renumbering_is_matched_by_pci_address_when_no_uuid(monkeypatch):
    """CUDA_VISIBLE_DEVICES=2,0 makes NVML's device 2 this process's cuda:0; with no UUID from
    torch the PCI address finds it (never NVML index 0)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    gpus = node_of_three()
    telemetry = Telemetry(TelemetryConfig(**NVML_ONLY), nvml_lib=FakeNvml(gpus),
                          identify=fake_cuda_identity(None, pci=(0, 0x30, 0)))
    telemetry.set_device(torch.device("cuda", 0))
    gpus[0].energy_mj += 4_000
    gpus[2].energy_mj += 3_000
    telemetry.energy.poll(force=True)
    assert telemetry.energy.joules_by_source() == {"nvml": 3.0}
    telemetry.close()


def test_no_nvml_device_matches_so_no_series_and_the_reason_names_the_device():
    telemetry = Telemetry(TelemetryConfig(**NVML_ONLY), nvml_lib=FakeNvml(node_of_three()),
                          identify=fake_cuda_identity("not-there", pci=(0, 0x99, 0)))
    telemetry.set_device(torch.device("cuda", 0))
    assert telemetry.energy.availability()["nvml"] is False
    assert "no NVML device matches cuda:0" in telemetry.energy_sources()
    telemetry.close()


def test_fake_nvml_query_missing_drops_only_that_series(caplog):
    gpus = [FakeGpu(energy_mj=None, power_mw=90_000, uuid="GPU-x")]
    with caplog.at_level(logging.INFO, logger="asteria_core.telemetry"):
        telemetry = Telemetry(TelemetryConfig(**NVML_ONLY), nvml_lib=FakeNvml(gpus),
                              identify=fake_cuda_identity("x"))
        telemetry.set_device(torch.device("cuda", 0))
    gpus[0].power_mw = 95_000
    telemetry.energy.poll(force=True)
    fams = families(telemetry)
    assert samples(fams["asteria_energy_joules"], "_total", source="nvml") == []
    assert value(fams, "asteria_power_watts", device="cuda:0", source="nvml") == 95.0
    assert value(fams, "asteria_energy_source_available", source="nvml") == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    telemetry.close()


def test_energy_has_a_device_part_and_a_host_part_and_the_total_names_both(telemetry_run):
    """Fake NVML for the device part, the model estimate for the host part: each record and
    the per-token and to-target figures carry both parts and their sum, named."""
    gpu = FakeGpu(energy_mj=0, uuid="GPU-fake-0")
    trainer = telemetry_run(steps=6, eval_interval=3, nvml_lib=FakeNvml([gpu]),
                            identify=fake_cuda_identity("fake-0"),
                            telemetry={"nvml": True, "rapl": False, "model_cpu_watts": 10.0,
                                       "target_loss": 100.0})
    trainer.runtime.at_boundary(lambda step: setattr(gpu, "energy_mj", gpu.energy_mj + 500))
    trainer.train(progress=False)
    last = trainer.records[-1].energy
    assert last.device_joules == last.joules["nvml"] == 3.0
    assert last.host_joules == last.joules["model"] > 0 and last.host_source == "model"
    assert last.total_joules == last.device_joules + last.host_joules
    assert last.parts == "nvml+model"
    hit = next(r.energy for r in trainer.records if r.energy.to_target_joules is not None)
    assert hit.to_target_total_joules == sum(hit.to_target_joules.values())
    fams = families(trainer.telemetry)
    total = value(fams, "asteria_joules_per_token", part="total", source="nvml+model")
    per_source = [value(fams, "asteria_joules_per_token", part=part, source=source)
                  for part, source in (("device", "nvml"), ("host", "model"))]
    assert total == pytest.approx(sum(per_source))
    assert value(fams, "asteria_energy_to_target_joules", part="total",
                 source="nvml+model") == pytest.approx(hit.to_target_total_joules)
    assert "nvml on" in trainer.telemetry.energy_sources()


def test_the_host_part_prefers_rapl_over_the_estimate():
    parts = EnergyParts.of({"nvml": 2.0, "rapl": 5.0, "model": 9.0})
    assert (parts.total_joules, parts.sources, parts.label) == \
        (7.0, "nvml+rapl", "device (nvml) + host (rapl)")
    cpu_only = EnergyParts.of({"model": 4.0})
    assert (cpu_only.total_joules, cpu_only.sources, cpu_only.label) == \
        (4.0, "model", "host (model estimate)")


def write_zone(root, zone, name, energy_uj, max_uj=262_143_328_850):
    path = root / zone
    path.mkdir(parents=True, exist_ok=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_from_a_fixture_tree_handles_counter_wraparound(tmp_path):
    max_uj = 262_143_328_850
    write_zone(tmp_path, "intel-rapl:0", "package-0", max_uj - 1_000_000)
    write_zone(tmp_path, "intel-rapl:0:0", "core", 5)  # inside the package figure: skipped
    write_zone(tmp_path, "intel-rapl:0:1", "dram", 10_000_000)
    write_zone(tmp_path, "intel-rapl:1", "package-1", 42)
    write_zone(tmp_path, "intel-rapl-mmio:0", "package-0", 7)  # duplicate MMIO view: skipped
    config = TelemetryConfig(nvml=False, rapl=True, rapl_root=str(tmp_path), energy_poll_seconds=0)
    telemetry = Telemetry(config)

    write_zone(tmp_path, "intel-rapl:0", "package-0", 2_500_000)  # wrapped past max_uj
    write_zone(tmp_path, "intel-rapl:0:1", "dram", 13_000_000)
    write_zone(tmp_path, "intel-rapl:1", "package-1", 42 + 750_000)
    telemetry.energy.poll(force=True)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 4_000_000)
    telemetry.energy.poll(force=True)

    fams = families(telemetry)
    energy = {s.labels["device"]: s.value
              for s in samples(fams["asteria_energy_joules"], "_total", source="rapl")}
    assert energy == {"package-0": 5.0, "package-0-dram": 3.0, "package-1": 0.75}
    assert value(fams, "asteria_energy_source_available", source="rapl") == 1
    assert {s.labels["device"] for s in samples(fams["asteria_power_watts"], source="rapl")} \
        == set(energy)


def test_rapl_absent_or_empty_tree_is_unavailable_with_a_reason(tmp_path):
    meter = RaplMeter(tmp_path / "missing")
    assert not meter.available and "no RAPL package zones" in meter.reason
    assert meter.read() == []


def test_modelled_energy_is_exported_only_as_source_model(telemetry_run):
    trainer = telemetry_run(steps=5, telemetry={"nvml": False, "rapl": False,
                                                "model_cpu_watts": 15.0})
    trainer.train(progress=False)
    fams = families(trainer.telemetry)
    series = samples(fams["asteria_energy_joules"], "_total")
    assert [s.labels for s in series] == [{"device": "cpu", "source": "model"}]
    assert series[0].value > 0
    assert "estimate" in fams["asteria_energy_joules"].documentation
    assert value(fams, "asteria_energy_source_available", source="model") == 1
    assert value(fams, "asteria_energy_source_available", source="nvml") == 0


def test_a_modelled_record_is_credited_its_own_cpu_time_never_over_the_ceiling(telemetry_run):
    # Evaluations run between a step's end and its record's completion. The estimate is read
    # with the step's end, so each record's power (joules over time since the previous record)
    # is at most every core busy: cores x watts. A poll at completion put the evaluation's CPU
    # time, and a poll interval's lump, over one step's wall time.
    watts = 15.0
    trainer = telemetry_run(steps=12, eval_interval=3, eval_batches=40, telemetry={
        "nvml": False, "rapl": False, "model_cpu_watts": watts, "energy_poll_seconds": 1.0})
    trainer.train(progress=False)
    records = trainer.records
    joules = [r.energy.joules["model"] for r in records]
    assert all(b > a for a, b in zip(joules, joules[1:], strict=False))  # credited every step
    power = [(b.energy.joules["model"] - a.energy.joules["model"]) / (b.time - a.time)
             for a, b in zip(records, records[1:], strict=False)]
    ceiling = len(os.sched_getaffinity(0)) * watts
    assert max(power) <= ceiling * 1.01, (max(power), ceiling)


def test_energy_to_target_loss_is_set_once_when_eval_loss_first_reaches_it(telemetry_run):
    trainer = telemetry_run(steps=9, eval_interval=3, telemetry={
        "nvml": False, "rapl": False, "model_cpu_watts": 15.0, "target_loss": 100.0})
    trainer.train(progress=False)
    records = trainer.records
    hits = [r for r in records if r.energy.to_target_joules is not None]
    assert [r.step for r in hits] == [3]  # the first evaluation is below 100; later ones too
    fams = families(trainer.telemetry)
    assert value(fams, "asteria_energy_to_target_joules", part="host", source="model") == \
        hits[0].energy.to_target_joules["model"]
    assert value(fams, "asteria_target_eval_loss") == 100.0


def test_monitor_polls_at_most_every_interval_unless_forced(tmp_path):
    write_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    monitor = EnergyMonitor([RaplMeter(tmp_path)], min_interval=3600.0)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    assert monitor.poll() is False and monitor.joules_by_source() == {"rapl": 0.0}
    assert monitor.poll(force=True) is True and monitor.joules_by_source() == {"rapl": 1.0}


BURN_THEN_WAIT = """
import sys, time
t = time.process_time()
while time.process_time() - t < 0.4:
    pass
print("burnt", flush=True)
sys.stdin.read()  # alive until the test closes stdin
"""


def _burner() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", BURN_THEN_WAIT], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "burnt"
    return child


def test_the_estimate_counts_the_cpu_of_processes_the_run_started_alive_and_ended():
    """A worker process's CPU is the run's: time.process_time() leaves it out, so an optimizer
    refreshing in host processes looked free. Real child processes, live then ended; a child
    the run did not start (a browser, a server of a test) is not counted."""
    meter = ModelMeter(1.0)  # 1 W per busy core: joules == CPU seconds
    worker, other = _burner(), _burner()
    try:
        count_process(worker.pid)
        alive = meter.joules()
        assert alive >= 0.4, alive  # the live worker's 0.4 s (and more) is counted
        assert alive < 0.8 + time.process_time(), alive  # the other child's is not
    finally:
        for child in (worker, other):
            child.stdin.close()
            child.wait(timeout=60)
    ended = meter.joules()
    assert ended >= 0.4 and ended - alive < 0.4, (alive, ended)  # kept once it ended, once
    assert run_cpu_seconds() >= time.process_time()


def test_a_process_worker_is_counted_as_the_run_s_own():
    from asteria_core.optim.seam import refresh_fn
    from asteria_core.refresh.processes import ProcessWorkers
    from asteria_core.telemetry import energy
    before = set(energy._RUN_PROCESSES)
    pool = ProcessWorkers(1, refresh_fn)  # its dispatcher starts the process
    try:
        deadline = time.monotonic() + 120  # a hang guard: spawning imports torch
        while not set(energy._RUN_PROCESSES) - before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(energy._RUN_PROCESSES) - before, "no worker process registered"
    finally:
        pool.close()


@pytest.mark.gpu
def test_on_a_gpu_the_meter_finds_cuda_0_in_nvml_by_its_identity():
    telemetry = Telemetry(TelemetryConfig(**NVML_ONLY))
    telemetry.set_device(torch.device("cuda", 0))
    assert telemetry.energy.availability()["nvml"], telemetry.energy_sources()
    torch.ones(4096, 4096, device="cuda").matmul(torch.ones(4096, 4096, device="cuda"))
    torch.cuda.synchronize()
    telemetry.energy.poll(force=True)
    readings = [r for r in telemetry.energy.readings() if r.source == "nvml"]
    assert [r.device for r in readings] == ["cuda:0"] and readings[0].joules >= 0
    telemetry.close()
