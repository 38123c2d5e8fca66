"""Energy: NVML (absent here; a fake with known counters), RAPL from a fixture tree, the
modelled estimate, joules per token and energy to a target loss."""

from __future__ import annotations

import logging
import os

from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.core import Telemetry
from asteria_core.telemetry.energy import EnergyMonitor, RaplMeter
from asteria_core.telemetry.nvml import NvmlMeter
from tests.asteria_core.telemetry.conftest import families, samples, value
from tests.asteria_core.telemetry.fake_nvml import FakeGpu, FakeNvml

NVML_ONLY = {"nvml": True, "rapl": False, "model_cpu_watts": 0.0}


def energy_series(fams, source):
    return samples(fams["asteria_energy_joules"], "_total", source=source) + \
        samples(fams["asteria_power_watts"], source=source)


def test_nvml_is_really_absent_on_this_machine_so_no_energy_series_and_availability_0(
        telemetry_run, caplog):
    probe = NvmlMeter()  # the real pynvml
    probe.close()
    with caplog.at_level(logging.INFO, logger="asteria_core.telemetry"):
        trainer = telemetry_run(steps=3, telemetry=NVML_ONLY)
        trainer.train(progress=False)
    fams = families(trainer.telemetry)
    if probe.devices:  # a GPU machine: the real NVML is measured (the fakes cover the numbers)
        assert value(fams, "asteria_energy_source_available", source="nvml") == 1
        assert energy_series(fams, "nvml")
        return
    assert energy_series(fams, "nvml") == []
    assert samples(fams["asteria_energy_joules"], "_total") == []  # no source at all: no zeros
    assert samples(fams["asteria_gpu_memory_used_bytes"]) == []
    assert samples(fams["asteria_device_busy_ratio"], source="nvml") == []
    assert value(fams, "asteria_energy_source_available", source="nvml") == 0
    assert trainer.records[-1].energy is None
    why = [r.getMessage() for r in caplog.records if "nvml unavailable" in r.getMessage()]
    assert len(why) == 1 and "NVML" in why[0], why


def test_fake_nvml_without_a_driver_gives_no_series_and_says_why(caplog):
    with caplog.at_level(logging.INFO, logger="asteria_core.telemetry"):
        telemetry = Telemetry(TelemetryConfig(**NVML_ONLY),
                              nvml_lib=FakeNvml([], init_error="Driver Not Loaded"))
    fams = families(telemetry)
    assert energy_series(fams, "nvml") == []
    assert value(fams, "asteria_energy_source_available", source="nvml") == 0
    assert any("Driver Not Loaded" in r.getMessage() for r in caplog.records)


def test_fake_nvml_with_known_counters_gives_the_exact_joules(telemetry_run, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = FakeGpu(energy_mj=7_000_000, power_mw=312_500, memory=(3 << 30, 80 << 30),
                  util_percent=87)
    nvml = FakeNvml([gpu])
    trainer = telemetry_run(steps=10, eval_interval=5, nvml_lib=nvml, telemetry=NVML_ONLY)

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
    assert value(fams, "asteria_joules_per_token", source="nvml") == (12_340 / 1000) / (10 * 128)
    records = trainer.records
    assert [r.energy.joules["nvml"] for r in records] == \
        [1234 * s / 1000 for s in range(1, 11)]
    trainer.close()
    assert nvml.shutdowns == 1
    assert value(families(trainer.telemetry), "asteria_energy_joules", "_total",
                 source="nvml") == joules  # the last reading stays readable after close


def test_fake_nvml_query_missing_on_one_gpu_drops_only_that_series(monkeypatch, caplog):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")  # the process sees NVML GPUs 2 and 0
    gpus = [FakeGpu(energy_mj=500), FakeGpu(energy_mj=0), FakeGpu(energy_mj=None, power_mw=90_000)]
    nvml = FakeNvml(gpus)
    with caplog.at_level(logging.INFO, logger="asteria_core.telemetry"):
        telemetry = Telemetry(TelemetryConfig(**NVML_ONLY), nvml_lib=nvml)
    gpus[0].energy_mj += 2_000
    gpus[2].power_mw = 95_000
    telemetry.energy.poll(force=True)
    fams = families(telemetry)
    energy = {s.labels["device"]: s.value
              for s in samples(fams["asteria_energy_joules"], "_total", source="nvml")}
    assert energy == {"cuda:1": 2.0}  # cuda:0 is NVML GPU 2, which has no energy counter
    assert value(fams, "asteria_power_watts", device="cuda:0", source="nvml") == 95.0
    assert value(fams, "asteria_energy_source_available", source="nvml") == 1
    missing = [r.getMessage() for r in caplog.records if "energy of cuda:0" in r.getMessage()]
    assert len(missing) == 1
    telemetry.close()


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
    assert value(fams, "asteria_energy_to_target_joules", source="model") == \
        hits[0].energy.to_target_joules["model"]
    assert value(fams, "asteria_target_eval_loss") == 100.0


def test_monitor_polls_at_most_every_interval_unless_forced(tmp_path):
    write_zone(tmp_path, "intel-rapl:0", "package-0", 0)
    monitor = EnergyMonitor([RaplMeter(tmp_path)], min_interval=3600.0)
    write_zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    assert monitor.poll() is False and monitor.joules_by_source() == {"rapl": 0.0}
    assert monitor.poll(force=True) is True and monitor.joules_by_source() == {"rapl": 1.0}
