"""Step records: typed sections per component, listeners, and the JSONL file."""

from __future__ import annotations

import dataclasses
import json

from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.reporter import NullReporter
from asteria_core.train.trainer import Trainer
from tests.asteria_core.telemetry.conftest import NO_METERS


def test_listeners_get_every_record_and_can_be_removed(telemetry_run):
    trainer = telemetry_run(steps=6, telemetry=NO_METERS)
    seen = []
    remove = trainer.runtime.add_listener(seen.append)
    trainer.runtime.at_boundary(lambda step: step == 4 and remove())
    result = trainer.train(progress=False)
    assert result.step == 6
    assert [r.step for r in seen] == [1, 2, 3]  # removed at the boundary of step 4
    assert [r.step for r in trainer.records] == [1, 2, 3, 4, 5, 6]
    assert set(seen[0].timing.idle_seconds) >= {"refresh_wait", "other"}


def test_jsonl_file_carries_every_section_with_one_name_per_figure(telemetry_run):
    trainer = telemetry_run(steps=3, telemetry=NO_METERS)
    result = trainer.train(progress=False)
    trainer.close()
    lines = [json.loads(x) for x in (result.run_dir / "steps.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3]
    for line in lines:
        assert set(line["timing"]) == {"compute_seconds", "idle_seconds", "device_busy_ratio"}
        assert line["refresh"] is None and line["tiers"] is None  # AdamW: no such parts
        assert line["policy_version"] == 1 and line["extra"] == {}


def test_telemetry_disabled_runs_with_a_null_reporter(tiny):
    config = tiny(steps=3)
    config = dataclasses.replace(config, telemetry=TelemetryConfig(enabled=False))
    trainer = Trainer(config)
    assert isinstance(trainer.runtime.reporter, NullReporter) and trainer.telemetry is None
    seen = []
    trainer.runtime.add_listener(seen.append)
    trainer.train(progress=False)
    trainer.close()
    assert [r.step for r in seen] == [1, 2, 3]
    assert seen[0].timing is None and seen[0].energy is None
