"""The scale suite's Hugging Face row in its quick mode: a GPT2LMHeadModel
built from a config trains through asteria_core.integrations.hf inside HF's Trainer with
Asteria-SOAP; the row's records, metrics and figures are checked against the run itself (no
timing thresholds)."""

from __future__ import annotations

import math

from tests.bench.test_suites_small import finite_positive, options
from tests.integrations.conftest import require

require("transformers", "hf")
require("accelerate", "hf")

from asteria_bench.suites import scale_hf  # noqa: E402


def test_the_hf_row_trains_gpt2_through_the_integration_with_records_and_metrics(tmp_path):
    row = scale_hf.hf_row(options(tmp_path, "scale"))
    shape = scale_hf.QUICK
    model = scale_hf.build_model(shape)
    assert row["model"] == "GPT2LMHeadModel"
    assert row["params"] == sum(p.numel() for p in model.parameters())
    assert row["tokens_per_step"] == shape.batch * shape.seq

    # One record per optimizer step, to the listener and to the JSONL file; HF logged
    # Asteria's figures every interval; the run's /metrics answered over HTTP while it trained
    # (the last step's record completes when training ends, after the scrape).
    assert row["steps"] == row["records"] == row["records_jsonl"] == shape.steps
    assert row["metrics_exported"] and row["metrics_steps_total"] == shape.steps - 1
    assert row["hf_logs"] == shape.steps // scale_hf.INTERVAL
    assert row["hf_logs_with_asteria_figures"] == row["hf_logs"]
    assert all(math.isfinite(loss) for loss in row["loss"])

    # Refreshes on the worker under the bound: the first round (the bases of step 1) is
    # swapped in over steps 7-11 (d = 10, swap window 5); the next one (step 11) over 17-21,
    # so all of it but the blocks whose place is step 21 by the run's end (step 20).
    assert row["blocks"] > 0 and row["blocks"] < row["refreshes"] < 2 * row["blocks"]
    assert row["refresh_failures"] == 0
    assert 0 < row["staleness_max"] <= row["staleness_bound"] == scale_hf.BOUND
    assert finite_positive(row["round_work_s"]) and finite_positive(row["refresh_duty"])

    # SOAP's moments (first and second, in the eigenbasis) are two fp32 copies of every
    # parameter; factors and bases exist for the preconditioned dims.
    kinds = row["state_bytes"]
    assert kinds["moments"] == 2 * 4 * row["params"]
    assert kinds["factors"] > 0 and kinds["bases"] == kinds["factors"]
    assert row["state_bytes_total"] == sum(kinds.values())
    assert len(row["step_ms"]) == shape.steps and row["warmup_steps"] == scale_hf.INTERVAL
    for key in ("p50_ms", "mean_ms", "p99_ms"):
        assert finite_positive(row[key])
    assert row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
