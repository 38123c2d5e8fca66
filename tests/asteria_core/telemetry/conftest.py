"""Helpers for telemetry tests: tiny runs with telemetry, and the parsed exposition."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client.parser import text_string_to_metric_families

from asteria_core.policy import Policy
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.core import Telemetry
from asteria_core.train.trainer import Trainer
from tests.conftest import tiny_config

NO_METERS = {"nvml": False, "rapl": False, "model_cpu_watts": 0.0}


def families(telemetry: Telemetry) -> dict:
    """{family name: Metric} of the exposition, parsed by prometheus_client's parser."""
    body, content_type = telemetry.exposition()
    assert content_type.startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def samples(family, suffix: str = "", **labels) -> list:
    name = family.name + suffix
    return [s for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def value(fams: dict, name: str, suffix: str = "", **labels) -> float:
    found = samples(fams[name], suffix, **labels)
    assert len(found) == 1, (name, labels, fams[name].samples)
    return found[0].value


@pytest.fixture
def telemetry_run(tmp_path):
    """Build a tiny trainer with a Telemetry from `TelemetryConfig(**telemetry)` (AdamW unless
    `optimizer` names another, under `policy`)."""
    built = []

    def build(*, nvml_lib=None, identify=None, telemetry: dict | None = None,
              optimizer: str = "adamw", policy: Policy | None = None, **train):
        config = tiny_config(tmp_path, **train)
        tele_config = TelemetryConfig(**{"energy_poll_seconds": 0.0, **(telemetry or {})})
        config = dataclasses.replace(config, telemetry=tele_config,
                                     optim=dataclasses.replace(config.optim, name=optimizer),
                                     policy=policy or config.policy)
        seams = {"identify": identify} if identify is not None else {}
        trainer = Trainer(config, reporter=Telemetry(tele_config, nvml_lib=nvml_lib, **seams))
        trainer.records = []  # every completed step record, in order
        trainer.runtime.add_listener(trainer.records.append)
        built.append(trainer)
        return trainer

    yield build
    for trainer in built:
        trainer.close()
