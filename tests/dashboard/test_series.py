"""Shaping step records for the charts: bounded buffers, bins, energy, markers, staleness."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from dashboard import series


def record(step: int, *, eval_loss=None, **sections) -> dict:
    """A step record shaped like GET /runs/{id}/steps answers (docs/metrics.md)."""
    return {"step": step, "time": 1000.0 + 0.01 * step, "loss": 5.0 - step * 1e-4,
            "eval_loss": eval_loss, "lr": 1e-3, "tokens": 128, "step_seconds": 0.01,
            "phase_seconds": {"data": 0.001, "forward": 0.004, "backward": 0.004,
                              "optimizer": 0.001, "boundary": 0.0},
            "grad_norm": 1.0, "policy_version": 1, "timing": None, "refresh": None,
            "tiers": None, "energy": None, "extra": {}, **sections}


def test_compact_flattens_telemetry_figures():
    row = series.compact(record(
        3, policy_version=2,
        timing={"compute_seconds": {"forward": 0.003}, "idle_seconds": {"data_wait": 0.002},
                "device_busy_ratio": 0.9},
        energy={"joules": {"model": 1.5}, "to_target_joules": None},
        tiers={"bytes": {"host": 10}, "capacity_bytes": {"host": 20}, "prefetch_hit_ratio": None},
        refresh={"staleness_max": 2, "staleness_bound": 4, "queue_depth": 1,
                 "background_load": 0.7, "workers_busy_ratio": 0.5, "failures": 0,
                 "inline_fallbacks": 0}), 256)
    assert row["tokens_total"] == 384
    assert row["phase_forward"] == 0.003 and "phase_data" not in row  # waits excluded
    assert (row["idle_data_wait"], row["joules_model"], row["tier_host"], row["cap_host"]) == \
        (0.002, 1.5, 10, 20)
    assert (row["staleness_max"], row["staleness_bound"], row["queue_depth"],
            row["background_load"], row["workers_busy"], row["policy_version"]) == \
        (2, 4, 1, 0.7, 0.5, 2)


def test_buffer_stays_bounded_and_keeps_the_whole_curve():
    buf = series.StepBuffer(max_rows=600, keep_recent=200)
    for start in range(0, 50_000, 1000):  # pages as the dashboard fetches them
        page = [record(s, eval_loss=4.0 if s % 100 == 0 else None)
                for s in range(start + 1, start + 1001)]
        buf.extend(page)
        assert len(buf.rows) <= 600 and len(buf.evals) <= 150
    assert buf.last_step == 50_000 and buf.tokens_total == 50_000 * 128
    assert buf.rows[0]["step"] == 1  # the start of the run survives thinning
    assert [r["step"] for r in buf.rows[-200:]] == list(range(49_801, 50_001))  # recent: full
    assert buf.extend([record(10)]) == 0  # an old record is not added twice


def test_buffer_rejects_a_bad_shape():
    with pytest.raises(ValueError, match="keep_recent"):
        series.StepBuffer(max_rows=10, keep_recent=10)


def test_frame_binned_and_energy():
    buf = series.StepBuffer()
    buf.extend([record(s, eval_loss=3.0 if s % 500 == 0 else None,
                       energy={"joules": {"model": 0.5 * s}}) for s in range(1, 3001)])
    df = series.frame(buf)
    assert df["elapsed"].iloc[0] == pytest.approx(0.01)
    b = series.binned(df, 300)
    assert len(b) <= 300 and b["step"].iloc[-1] == 3000
    assert b["joules_model"].iloc[-1] == pytest.approx(1500.0)  # cumulative: last, not mean
    e = series.energy(b)
    assert set(e["kind"]) == {"estimate"} and set(e["source"]) == {"model"}
    assert e["watts"].dropna().median() == pytest.approx(50.0)  # 0.5 J per 0.01 s
    assert e["joules_per_token"].iloc[-1] == pytest.approx(1500.0 / (3000 * 128))
    assert series.source_note(["rapl", "model"]) == \
        "energy source: rapl (measured), model (estimate)"


def test_markers_and_bound_follow_the_audit():
    buf = series.StepBuffer()
    buf.extend([record(s) for s in range(1, 101)])
    df = series.frame(buf)
    history = [{"version": 3, "effective_step": 60, "diff": {"staleness_bound": [4, 2]},
                "applied_at": 1000.6, "client": "autopilot",
                "reason": "refresh duty 0.20 over 30 steps: staleness_bound 4 -> 2"},
               {"version": 2, "effective_step": 20, "diff": {"staleness_bound": [10, 4],
                                                            "workers": [1, 2]},
                "applied_at": 1000.2}]
    marks = series.markers(history, df)
    assert list(marks["label"]) == ["v2", "v3"] and list(marks["step"]) == [20, 60]
    assert marks["text"].iloc[0] == "staleness_bound 10 -> 4, workers 1 -> 2"
    assert marks["text"].iloc[1] == "staleness_bound 4 -> 2 (autopilot: refresh duty 0.20 " \
        "over 30 steps: staleness_bound 4 -> 2)"  # the autopilot's marker says why
    assert marks["elapsed"].iloc[0] == pytest.approx(df.loc[df.step == 20, "elapsed"].item())
    bound = series.bound_by_step(history, 2, df["step"])
    assert (bound[df.step < 20] == 10).all() and (bound[(df.step >= 20) & (df.step < 60)] == 4
                                                  ).all() and (bound[df.step >= 60] == 2).all()
    assert series.markers([], df).empty


def refresh(staleness_max: int, bound: int) -> dict:
    return {"staleness_max": staleness_max, "staleness_bound": bound, "queue_depth": 0,
            "background_load": 0.5, "workers_busy_ratio": 0.5, "failures": 0,
            "inline_fallbacks": 0}


def test_each_step_is_judged_against_the_bound_in_force_at_it():
    # S went 10 -> 6 at step 51: steps at 8 and 10 under S = 10 were within their bound, and
    # so is everything after; one step over its own bound is the only red one.
    records = [record(s, refresh=refresh(s % 11, 10)) for s in range(1, 51)]
    records += [record(s, refresh=refresh(s % 7, 6)) for s in range(51, 101)]
    records.append(record(101, refresh=refresh(7, 6)))
    buf = series.StepBuffer(max_rows=30, keep_recent=10)  # thinned rows keep exact counts
    for start in range(0, len(records), 20):
        buf.extend(records[start:start + 20])
    dist = series.staleness_distribution(buf)
    assert dist["steps"].sum() == 101
    over = dist[dist["verdict"] == series.OVER]
    assert over[["staleness", "steps"]].values.tolist() == [[7, 1]]
    within = dist[dist["verdict"] == series.WITHIN].set_index("staleness")["steps"]
    assert within[8] == 4 and within[10] == 4  # steps 8, 19, 30, 41 and 10, 21, 32, 43
    assert list(dist["staleness"]) == sorted(dist["staleness"])
    assert series.staleness_distribution(series.StepBuffer()).empty


def test_real_records_from_a_finished_run(http, finished_run):
    buf = series.StepBuffer()
    buf.extend(http.get(f"/runs/{finished_run}/steps").json()["steps"])
    df = series.frame(buf)
    assert len(df) == 120 and df["eval_loss"].notna().sum() >= 2
    assert series.columns(df, "phase_") and series.columns(df, "idle_")
    assert series.columns(df, "joules_") == ["joules_model"]
    marks = series.markers(http.get(f"/runs/{finished_run}/policy/history").json(), df)
    assert list(marks["label"]) == ["v2"]
    assert isinstance(series.long(df, series.columns(df, "idle_"), "idle_"), pd.DataFrame)


def test_power_is_taken_between_meter_readings():
    # The meter is read every 10 steps (0.1 s); 5 J per reading is 50 W, not spikes of 500 W.
    buf = series.StepBuffer()
    buf.extend([record(s, energy={"joules": {"rapl": 5.0 * (s // 10)}})
                for s in range(1, 1001)])
    e = series.energy(series.frame(buf))
    assert set(e["kind"]) == {"measured"}
    watts = e["watts"].dropna().to_numpy()
    assert len(watts) == 9  # readings at least a second apart: steps 1, 110, 210, ... 910
    assert watts[1:] == pytest.approx(50.0)  # [0]: from step 1


def test_power_is_not_inflated_by_a_late_time_stamp():
    """A record stamped 5 ms after its reading (its thread waited for the GIL) makes one 10 ms
    step look 15 ms and the next 5 ms: taken step by step, 100 W would show as 200 W."""
    buf = series.StepBuffer()
    rows = [record(s, energy={"joules": {"model": 1.0 * s}}) for s in range(1, 1001)]
    for row in rows[::7]:
        row["time"] += 0.005
    buf.extend(rows)
    watts = series.energy(series.frame(buf))["watts"].dropna()
    assert watts.max() == pytest.approx(100.0, rel=0.01)


def test_the_dashboard_never_reads_metrics_text():
    """One channel: the dashboard reads step records and the API's JSON, never the
    Prometheus exposition."""
    root = Path(series.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                    node.value.startswith("/metrics"):
                found.append(f"{path.name}:{node.lineno} requests {node.value}")
            if isinstance(node, ast.Import | ast.ImportFrom) and "prometheus" in ast.unparse(node):
                found.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert found == []


def test_every_record_figure_the_dashboard_reads_is_in_the_published_record_schema():
    """The dashboard reads step records by their own names (series.SCALARS, series.DICTS, the
    top-level keys of `compact`); the control plane publishes the record's schema in its OpenAPI
    document (StepPage.steps: StepRecord), so a figure renamed in the core fails here instead of
    leaving a chart empty."""
    from backend.app import create_app
    from backend.settings import Settings

    doc = create_app(Settings(start_default_run=False)).openapi()
    schemas = doc["components"]["schemas"]
    record = schemas["StepRecord"]["properties"]

    def section(name: str) -> dict:
        ref = next(s["$ref"] for s in record[name]["anyOf"] if "$ref" in s)
        return schemas[ref.rsplit("/", 1)[-1]]["properties"]

    top = ("step", "time", "loss", "eval_loss", "lr", "tokens", "step_seconds", "policy_version")
    assert set(top) <= set(record)
    for sec, key in (*series.SCALARS, *series.DICTS):
        assert key in section(sec), f"{sec}.{key} is not in the published StepRecord"


def test_runs_are_compared_by_their_device_part_and_host_part_summed():
    assert series.energy_parts(["model", "nvml", "rapl"]) == ["nvml", "rapl"]
    assert series.energy_parts(["nvml", "model"]) == ["nvml", "model"]
    assert series.energy_parts(["model"]) == ["model"]
    assert series.energy_parts([]) == []
