"""Step records reach TensorBoard, MLflow and W&B (offline), each read back with the tracker's
own reader from what the real library wrote: loss and step time equal the run's own records."""

from __future__ import annotations

import dataclasses
import json
import struct
import sys
from pathlib import Path

import pytest
import torch

import asteria_core as asteria
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.trackers import open_trackers, scalars
from asteria_core.train.model import GPT, ModelConfig
from asteria_core.validation import ConfigError
from tests.components import missing

try:
    import mlflow  # noqa: F401
    import tensorboard  # noqa: F401
    import wandb  # noqa: F401
except ImportError as err:
    missing(f"a tracker's package ({err.name}): pip install -e '.[trackers]'")

STEPS = 12


def _train(run_dir: Path, trackers: str) -> tuple[str, list[dict]]:
    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=256))
    records = run_dir / "records.jsonl"
    opt = asteria.optimizer(model, "soap", lr=3e-3, run_dir=run_dir, records=records,
                            trackers=trackers)
    run_id = opt.runtime.run_id
    with opt.runtime:
        for _ in range(STEPS):
            x = torch.randint(0, 256, (4, 16))
            _, loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad()
    return run_id, [json.loads(line) for line in records.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    run_dir = tmp_path_factory.mktemp("run")
    run_id, records = _train(run_dir, "tensorboard,mlflow,wandb")
    (run_dir / "run_id").write_text(run_id)
    return run_dir, records


def _series(records: list[dict], name: str) -> dict[int, float]:
    return {r["step"]: r[name] for r in records if r[name] is not None}


def test_tensorboard_reads_back_loss_and_step_time(run: tuple[Path, list[dict]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run_dir, records = run
    (log_dir,) = (run_dir / "trackers" / "tensorboard").iterdir()
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    for name in ("loss", "step_seconds"):
        read = {e.step: e.value for e in events.Scalars(name)}
        assert read == pytest.approx(_series(records, name), rel=1e-6)  # float32 events
    assert "refresh/staleness_max" in events.Tags()["scalars"]


def test_mlflow_reads_back_loss_and_step_time(run: tuple[Path, list[dict]]) -> None:
    from mlflow.tracking import MlflowClient
    run_dir, records = run
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'trackers' / 'mlflow.db'}")
    (found,) = client.search_runs([client.get_experiment_by_name("asteria").experiment_id])
    assert found.info.run_name == (run_dir / "run_id").read_text()
    assert found.info.status == "FINISHED"
    for name in ("loss", "step_seconds"):
        read = {m.step: m.value for m in client.get_metric_history(found.info.run_id, name)}
        assert read == _series(records, name)


def _wandb_records(path: Path) -> list[bytes]:
    """The records of a W&B run file: its 7-byte header, then LevelDB's log format (32 KiB
    blocks of chunks: crc32c 4, length 2, type 1 (full 1, first 2, middle 3, last 4)). The
    wandb package no longer ships a reader of its own; this one reads what it wrote."""
    data = path.read_bytes()
    magic, _, _ = struct.unpack("<4sHB", data[:7])
    assert magic == b":W&B"
    out, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            out.append(pending)
    return out


def test_wandb_offline_reads_back_loss_and_step_time(run: tuple[Path, list[dict]]) -> None:
    from wandb.proto import wandb_internal_pb2
    run_dir, records = run
    (path,) = (run_dir / "trackers" / "wandb").glob("offline-run-*/run-*.wandb")
    history: dict[str, dict[int, float]] = {"loss": {}, "step_seconds": {}}
    for raw in _wandb_records(path):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") != "history":
            continue
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                 for i in record.history.item}
        for name, series in history.items():
            if name in items:
                series[items["_step"]] = items[name]
    for name, series in history.items():
        assert series == _series(records, name)


def test_scalars_are_the_records_numeric_figures_by_name(run: tuple[Path, list[dict]]) -> None:
    _, records = run
    from asteria_core.telemetry.records import StepRecord
    record = StepRecord(step=3, time=1.0, loss=2.5, lr=1e-3, tokens=64, step_seconds=0.2,
                        phase_seconds={"forward": 0.1}, eval_loss=float("nan"))
    figures = scalars(record)
    assert figures["loss"] == 2.5 and figures["phase_seconds/forward"] == 0.1
    assert "step" not in figures and "time" not in figures
    assert "eval_loss" not in figures  # non-finite figures are left out, not logged as NaN


def test_unknown_tracker_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"telemetry\.trackers: got 'comet'"):
        TelemetryConfig(trackers="tensorboard,comet")


def test_missing_package_names_what_to_install(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    with pytest.raises(ConfigError, match="pip install wandb"):
        open_trackers("tensorboard,wandb", tmp_path, "run")


def test_the_trainer_logs_to_the_tracker_its_config_names(tiny) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from asteria_core.train.config_io import parse_overrides
    from asteria_core.train.trainer import Trainer
    base = tiny(steps=4, eval_interval=2)
    # As `asteria train --telemetry.trackers tensorboard` writes it.
    assert parse_overrides([("telemetry.trackers", "tensorboard")]) == \
        {"telemetry": {"trackers": "tensorboard"}}
    config = dataclasses.replace(base, telemetry=TelemetryConfig(trackers="tensorboard"))
    trainer = Trainer(config)
    result = trainer.train(progress=False)
    trainer.close()
    (log_dir,) = (result.run_dir / "trackers" / "tensorboard").iterdir()
    events = EventAccumulator(str(log_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("eval_loss")] == [2, 4]
