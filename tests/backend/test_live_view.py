"""The active run's in-memory view answers like the store would, and knows its window."""

import json

import pytest

from asteria_core.telemetry.records import StepRecord
from backend.live import LiveView
from backend.schemas import RunPublic, StepPage

ROW = {"id": "r1", "status": "running", "step": 0, "total_steps": 100, "checkpoint_step": None,
       "created_at": 1.0, "updated_at": 1.0, "run_dir": "/tmp/r1", "error": None,
       "config": {"train": {"steps": 100}}, "policy_version": 1,
       "policy": {"workers": 1}}  # a store row has more columns than the public model


def record(step: int) -> dict:
    """A step record as the runtime writes it (StepPage documents `steps` as StepRecords)."""
    return StepRecord(step=step, time=1.0 + step, loss=1.0 / step, lr=1e-3, tokens=64,
                      step_seconds=0.1, phase_seconds={}).to_dict()


def _view(steps: range, window: int = 10) -> LiveView:
    view = LiveView(ROW, window=window)
    for step in steps:
        view.add_step(step, json.dumps(record(step)))
    return view


def test_row_json_is_the_public_model_and_follows_updates():
    view = _view(range(1, 4))
    view.update(status="paused", checkpoint_step=3)
    row = json.loads(view.row_json())
    assert RunPublic.model_validate(row).model_dump() == row
    assert (row["status"], row["step"], row["checkpoint_step"]) == ("paused", 3, 3)
    assert "policy" not in row
    with pytest.raises(KeyError, match="policy"):
        view.update(policy={})


def test_steps_pages_are_contiguous_and_valid():
    view = _view(range(1, 8))
    page = StepPage.model_validate_json(view.steps_json(since=2, limit=3))
    assert [s.step for s in page.steps] == [3, 4, 5] and page.next_since == 5
    page = StepPage.model_validate_json(view.steps_json(since=7, limit=3))
    assert page.steps == [] and page.next_since == 7


def test_steps_before_the_window_are_left_to_the_store():
    view = _view(range(1, 31), window=10)  # trimmed in chunks: keeps between 10 and 20
    kept = json.loads(view.steps_json(since=30 - 10, limit=100))["steps"]
    assert [s["step"] for s in kept] == list(range(21, 31))
    assert view.steps_json(since=0, limit=100) is None
    assert LiveView(ROW).steps_json(since=0, limit=10) is None  # nothing recorded yet
