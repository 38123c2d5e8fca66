"""The tiers, serving and distributed suites of `asteria bench`, each run end to end at a tiny
size: real subprocesses (a tiers worker per placement, `asteria serve`, torchrun on gloo), and
the JSON file each writes checked for its structure and for sane numbers (no timing thresholds).
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from asteria_bench import reports
from asteria_bench.options import BenchOptions
from asteria_bench.suites import distributed, load, network, serving, straggler, tiers
from asteria_core.distributed.policy_sync import HEADER_BYTES
from tests.components import missing

TINY_MODEL = ("--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "16",
              "--model.block_size", "16", "--data.batch_size", "2")


def options(tmp_path: Path, suite: str) -> BenchOptions:
    return BenchOptions(quick=True, out_dir=tmp_path / "out", corpus=None, device="cpu",
                        peers=False, command=f"asteria bench {suite} --quick", progress=False)


def finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def worded(out_dir: Path, suite: str) -> dict:
    """The suite's file as saved (its figures: a suite leaves the words to the report), worded
    as the report words it."""
    data = json.loads((out_dir / f"{suite}.json").read_text())
    assert not (data["tables"] or data["headline"] or data["findings"]), suite
    return reports.worded(data)


def check_common(data: dict, suite: str, out_dir: Path) -> None:
    """The shape every suite's file has, and cells that are numbers being finite."""
    assert data["suite"] == suite and data["schema"] == 1 and data["quick"] is True
    assert data["seconds"] > 0 and data["machine"]["cores"] >= 1
    assert data["runs"] and data["tables"] and data["findings"]
    for table in data["tables"]:
        assert table["rows"], table["title"]
        for row in table["rows"]:
            assert len(row) == len(table["columns"]), table["title"]
            for cell in row:
                if isinstance(cell, float):
                    assert math.isfinite(cell), (table["title"], row)
    assert 1 <= len(data["headline"]) <= 3
    for key, figure in data["headline"].items():
        assert isinstance(figure["value"], (int, float)) and math.isfinite(figure["value"]), key
        figure["text"].format(value=figure["value"])
    for sentence in data["findings"]:
        assert isinstance(sentence, str) and "nan" not in sentence.lower()
    assert data["plots"]
    for plot in data["plots"]:
        assert (out_dir / plot["file"]).stat().st_size > 0


def test_tiers_suite_measures_every_budget_against_the_floor_and_dd(tmp_path, monkeypatch):
    # 12 layers: the smallest budget's device share (10%) holds the largest parameter's state;
    # 1024 x 256 each: the state (~40 MiB) stands out of the processes' RSS noise.
    monkeypatch.setattr(tiers, "QUICK", tiers.Sizes(
        layers=12, rows=1024, cols=256, block=32, batch=4, steps=2, threads=1, refresh=2,
        repeats=1, dd_mib=8))
    monkeypatch.setattr(tiers, "DISK_DIR", str(tmp_path))
    opts = options(tmp_path, "tiers")
    result = load("tiers").run(opts)
    data = worded(opts.out_dir, "tiers")
    check_common(data, "tiers", opts.out_dir)
    assert data["config"]["layers"] == 12 and data["config"]["state_bytes"] == \
        result.config["state_bytes"]
    placements = [r for r in data["runs"] if r["kind"] == "placement"]
    assert [r["placement"] for r in placements] == ["base"] + [b[0] for b in tiers.BUDGETS]
    for r in placements:
        assert len(r["step_times"]) == 2 and all(finite_positive(t) for t in r["step_times"])
        assert finite_positive(r["peak_rss_bytes"])
        if r["mode"] == "tiered":
            assert r["tier_bytes"]["disk"] > 0  # part of the state really lives on disk
            assert finite_positive(r["disk_read_bytes"]) and finite_positive(
                r["disk_write_bytes"])
            for key in ("isolated_read_bytes_per_second", "same_files_dd_read_bytes_per_second",
                        "isolated_write_bytes_per_second",
                        "same_files_dd_write_bytes_per_second"):
                assert finite_positive(r[key]), key
    dds = [r for r in data["runs"] if r["kind"] == "dd"]
    assert len(dds) == 1 and finite_positive(dds[0]["read_bytes_per_second"])
    memory, bandwidth = data["tables"]
    assert [row[0] for row in memory["rows"]] == ["base"] + [b[0] for b in tiers.BUDGETS]
    assert [row[0] for row in bandwidth["rows"]] == ["read", "write"]
    assert all(finite_positive(c) for row in bandwidth["rows"] for c in row[1:])
    assert finite_positive(data["headline"]["state_rss_ratio"]["value"])
    assert not list(tmp_path.glob("asteria-bench-tiers-*"))  # the disk files are removed


def test_serving_suite_measures_telemetry_and_a_served_run_under_load(tmp_path, monkeypatch):
    monkeypatch.setattr(serving, "QUICK", serving.Sizes(
        steps=4, block=2, warmup=2, scrape_hz=5.0, overrides=("--train.threads", "1",
                                                                *TINY_MODEL),
        window=1.5, rounds=1, settle=0.5, pollers=4, sse_clients=1,
        server_args=TINY_MODEL, stops=2, stop_args=TINY_MODEL))
    opts = options(tmp_path, "serving")
    load("serving").run(opts)
    data = worded(opts.out_dir, "serving")
    check_common(data, "serving", opts.out_dir)
    arms = {r["arm"]: r for r in data["runs"] if r["kind"] == "telemetry"}
    assert set(arms) == {"on", "off"}
    for arm in arms.values():
        assert len(arm["block_step_seconds"]) == 2
        assert all(finite_positive(t) for block in arm["block_step_seconds"] for t in block)
    assert arms["on"]["sink_cpu_seconds"] and arms["off"]["sink_cpu_seconds"] is None
    windows = [r for r in data["runs"] if r["kind"] == "control_plane"]
    assert [r["layout"] for r in windows] == list(serving.LAYOUTS)
    for r in windows:
        assert r["requests"] > 0 and finite_positive(r["api_p50_ms"])
        assert r["quiet_step_seconds"] and r["loaded_step_seconds"]
        assert all(finite_positive(t) for t in r["quiet_step_seconds"]
                   + r["loaded_step_seconds"])
    telemetry, api, _ = data["tables"]
    assert len(telemetry["rows"]) == 1 and [row[0] for row in api["rows"]] == \
        list(serving.LAYOUTS)
    assert finite_positive(data["headline"]["telemetry_overhead_pct"]["value"])
    stops = [r for r in data["runs"] if r["kind"] == "stop"]
    assert [r["optimizer"] for r in stops] == ["adamw", "soap"]
    assert all(finite_positive(r["seconds"]) for r in stops)
    assert data["tables"][2]["rows"][0][0] == 2


@pytest.mark.multiproc
def test_distributed_suite_runs_real_torchrun_jobs(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "QUICK", distributed.Sizes(
        steps=8, eval_at=(4,), interval=3, seeds=1, worlds=(2,), quick_configs=True,
        n_layer=1, n_embd=32, block_size=16))
    opts = options(tmp_path, "distributed")
    load("distributed").run(opts)
    data = worded(opts.out_dir, "distributed")
    check_common(data, "distributed", opts.out_dir)
    reference = data["config"]["distributed_shampoo"]
    chosen = distributed.configs(distributed.QUICK, with_reference=reference)
    assert [(r["world"], r["label"]) for r in data["runs"]] == [(c[0], c[1]) for c in chosen]
    labels = {r["label"] for r in data["runs"]}
    if reference:  # its source on the path here: its rows are measured
        assert distributed.DS_FP32 in labels
    else:  # absent: the report says how to get it
        assert distributed.DS_FP32 not in labels
        assert any(distributed.SOURCE_ENV in f for f in data["findings"])
    for r in data["runs"]:
        assert len(r["ranks"]) == r["world"] == 2
        for rank in r["ranks"]:
            assert len(rank["step_seconds"]) == 8
            assert all(finite_positive(t) for t in rank["step_seconds"])
            assert math.isfinite(rank["eval_loss"]) and set(rank["eval_at"]) == {"4"}
            assert rank["state_bytes"] > 0
        # One byte convention: every optimizer collective counted, AdamW's policy header too;
        # Distributed Shampoo's fully-shard distributor posts none.
        if r["label"] == distributed.FSDP_DS:
            assert r["bytes_per_step_per_rank"] == 0
        else:
            assert r["bytes_per_step_per_rank"] >= HEADER_BYTES
        if "SOAP" in r["label"] or "synchronous" in r["label"]:
            assert r["bytes_per_round_per_rank"] > r["bytes_per_step_per_rank"] > 0
            assert r["first_round_bytes_per_rank"] > 0
    (table,) = data["tables"]
    assert len(table["rows"]) == len(chosen)
    assert distributed.FSDP_SOAP in labels  # FSDP2: each rank its own shards' state
    fsdp = next(r for r in data["runs"] if r["label"] == distributed.FSDP_SOAP)
    replicated = next(r for r in data["runs"] if r["label"] == "Asteria SOAP S=5")
    assert max(fsdp["state_bytes_per_rank"]) < min(replicated["state_bytes_per_rank"])
    assert "loss_gap_s5_2" in data["headline"]
    if reference:
        assert {"bytes_vs_distributed_shampoo_2", "sharded_state_vs_distributed_shampoo_2"} \
            <= set(data["headline"])
        assert any("fully-shard distributor" in f for f in data["findings"])


@pytest.mark.multiproc
def test_network_suite_shapes_a_namespace_loopback_and_removes_it(tmp_path, monkeypatch):
    why_not = network.can_shape()
    if why_not:
        missing(f"the network suite {why_not}")
    monkeypatch.setattr(network, "QUICK", network.Sizes(
        steps=8, interval=3, rates=("100mbit",), quick_configs=True, n_layer=1, n_embd=32,
        block_size=16))
    opts = options(tmp_path, "network")
    load("network").run(opts)
    data = worded(opts.out_dir, "network")
    check_common(data, "network", opts.out_dir)
    assert [(r["rate"], r["label"]) for r in data["runs"]] == \
        [("100mbit", c[0]) for c in network.CONFIGS if c[3]]
    for r in data["runs"]:
        assert all(math.isfinite(rank["eval_loss"]) for rank in r["ranks"])
        assert r["bytes_per_step_per_rank"] > 0
    # The namespace is gone: nothing of the suite's is left behind.
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "asteria-bench-" not in names


@pytest.mark.multiproc
def test_straggler_suite_slows_rank_1_with_and_without_rebalancing(tmp_path, monkeypatch):
    monkeypatch.setattr(straggler, "QUICK", straggler.Sizes(
        steps=12, interval=3, repeats=1, n_layer=1, n_embd=32, block_size=16))
    opts = options(tmp_path, "straggler")
    load("straggler").run(opts)
    data = worded(opts.out_dir, "straggler")
    check_common(data, "straggler", opts.out_dir)
    assert [r["label"] for r in data["runs"]] == [c.label for c in straggler.QUICK_CONFIGS]
    base, fixed, moving = data["runs"]
    for r in data["runs"]:
        assert sum(r["owned_first"]) == sum(r["owned_last"]) > 0  # every block has one owner
    assert fixed["owned_last"] == fixed["owned_first"] and fixed["blocks_moved"] == 0
    # rank 1's refreshes take 4x their time (a sleep beside the real work, whatever the load):
    # its measured speed is far outside the 20% rule, so blocks move off it
    assert moving["blocks_moved"] > 0 and moving["owned_last"][1] < moving["owned_first"][1]
    # Who computes a refresh never changes its numbers: the same loss, bit for bit.
    assert fixed["eval_loss"] == moving["eval_loss"] == base["eval_loss"]
