"""Step records in process: a bounded ring buffer, listeners, and the JSONL file."""

from __future__ import annotations

import dataclasses
import json

import pytest

from asteria_core.telemetry.history import StepHistory
from asteria_core.telemetry.reporter import NullReporter
from asteria_core.train.config import TelemetryConfig
from asteria_core.train.records import StepRecord
from asteria_core.train.trainer import Trainer
from tests.asteria_core.telemetry.conftest import NO_METERS


def record(step: int) -> StepRecord:
    return StepRecord(step=step, time=0.0, loss=1.0, lr=0.1, tokens=8, step_seconds=0.1,
                      phase_seconds={})


def test_records_since_pages_through_a_bounded_buffer():
    history = StepHistory(capacity=5)
    for step in range(1, 9):
        history.append(record(step))
    assert len(history) == 5
    assert [r.step for r in history.records_since(0)] == [4, 5, 6, 7, 8]
    assert [r.step for r in history.records_since(5)] == [6, 7, 8]
    assert [r.step for r in history.records_since(4, limit=2)] == [5, 6]
    assert history.records_since(8) == []
    assert history.latest().step == 8
    with pytest.raises(ValueError, match="capacity"):
        StepHistory(capacity=0)


def test_listeners_get_live_records_and_a_broken_one_is_dropped(telemetry_run):
    trainer = telemetry_run(steps=6, telemetry={**NO_METERS, "history_size": 4})
    seen, calls = [], []
    unsubscribe = trainer.telemetry.history.subscribe(seen.append)

    def broken(rec):
        calls.append(rec.step)
        raise RuntimeError("the SSE client went away")

    trainer.telemetry.history.subscribe(broken)
    trainer.boundary_hooks.append(lambda step: step == 4 and unsubscribe())
    result = trainer.train(progress=False)
    assert result.step == 6  # a failing listener never stops training
    assert [r.step for r in seen] == [1, 2, 3]  # unsubscribed during step 4
    assert calls == [1]
    assert [r.step for r in trainer.telemetry.history.records_since(0)] == [3, 4, 5, 6]
    assert "idle_seconds" in seen[0].extra


def test_jsonl_file_carries_the_telemetry_figures(telemetry_run):
    trainer = telemetry_run(steps=3, telemetry=NO_METERS)
    result = trainer.train(progress=False)
    trainer.close()
    lines = [json.loads(x) for x in (result.run_dir / "steps.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    for line in lines:
        assert set(line["extra"]) >= {"compute_seconds", "idle_seconds", "device_busy_ratio"}


def test_telemetry_disabled_runs_with_a_null_reporter(tiny):
    config = tiny(steps=3)
    config = dataclasses.replace(config, telemetry=TelemetryConfig(enabled=False))
    trainer = Trainer(config)
    assert isinstance(trainer.reporter, NullReporter) and trainer.telemetry is None
    seen = []
    trainer.record_sinks.append(seen.append)
    trainer.train(progress=False)
    trainer.close()
    assert [r.step for r in seen] == [1, 2, 3]
    assert not {"compute_seconds", "idle_seconds", "energy_joules"} & set(seen[0].extra)
