"""`asteria bench scale --quick` end to end on a tiny ladder (two tiny GPTs, three turns each, in
both arrangements) and a tiny tokens-per-step axis: the JSON it writes, checked for its
structure and for sane numbers (no timing thresholds)."""

from __future__ import annotations

import math
import os

from asteria_bench import turns
from asteria_bench.suites import SUITES, load, scale
from tests.bench.test_suites_small import check_common, finite_positive, options, worded

TINY = (scale.Rung(n_layer=1, n_embd=16, n_head=2, seq=16, batch=2, turns=3),
        scale.Rung(n_layer=2, n_embd=32, n_head=2, seq=16, batch=2, turns=3))
TOKENS = scale.Rung(n_layer=1, n_embd=16, n_head=2, seq=16, batch=1, turns=3)


def test_the_scale_suite_fits_every_figure_over_a_ladder_of_sizes(tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "QUICK", TINY)
    monkeypatch.setattr(scale, "QUICK_TOKENS_RUNG", TOKENS)
    monkeypatch.setattr(scale, "BLOCK", 64)  # the second tiny size has a factor wider than it
    affinity = os.sched_getaffinity(0)
    assert "scale" in SUITES
    opts = options(tmp_path, "scale")
    load("scale").run(opts)
    assert os.sched_getaffinity(0) == affinity  # the device-host arrangement gave the CPUs back
    data = worded(opts.out_dir, "scale")
    check_common(data, "scale", opts.out_dir)
    assert not (opts.out_dir / ".scale-runs").exists()  # the runs' folders are cleaned up

    runs = data["runs"]
    arms = ["adamw", "native", "asteria"]
    assert [(r["arrangement"], r["arm"]) for r in runs] == [
        *((a, k) for a in turns.ARRANGEMENTS for k in arms),
        *(("shared", k) for k in arms),
        *(("device-host", k) for k in [*arms, "native_block", "asteria_block"])]
    sizes = sorted({r["params"] for r in runs})
    assert len(sizes) == 2  # two sizes, each arm with the same model
    for r in runs:
        assert len(r["step_ms"]) == 3 * scale.INTERVAL
        assert all(finite_positive(x) for x in (r["p50_ms"], r["mean_ms"], r["p99_ms"]))
        assert r["spike_max"] >= r["spike"] >= 1
        assert finite_positive(r["peak_rss_bytes"])
        assert r["threads"] == (1 if r["arrangement"] == "device-host" else 2)
        kinds = r["state_bytes"]
        if r["family"] == "adamw":
            assert kinds["moments"] > 0 and kinds["factors"] == kinds["bases"] == 0
        else:
            assert kinds["factors"] > 0 and kinds["bases"] > 0 and kinds["moments"] > 0
            assert finite_positive(r["round_work_s"]) and finite_positive(r["refresh_duty"])
            assert r["refreshes"] > 0 and r["failures"] == 0
    for r in (r for r in runs if r["arm"].startswith("asteria")):
        assert 0 < r["staleness_max"] <= r["staleness_bound"] == scale.BOUND
        assert finite_positive(r["plan"]["round_work_s"]) and finite_positive(r["plan"]["duty"])
        assert r["refresh_wait_ms_per_step"] >= 0 and r["swap_ms_per_step"] >= 0
    # The block arm splits the wide factors: more blocks than the references' defaults.
    larger = [r for r in runs if r["params"] == sizes[1] and r["arrangement"] == "device-host"]
    by_arm = {r["arm"]: r for r in larger}
    assert by_arm["asteria_block"]["blocks"] > by_arm["asteria"]["blocks"]

    tokens = data["config"]["tokens_axis"]
    assert [row["batch"] for row in tokens] == list(scale.QUICK_TOKENS_BATCHES)
    assert [row["tokens_per_step"] for row in tokens] == \
        [b * TOKENS.seq for b in scale.QUICK_TOKENS_BATCHES]
    assert all(math.isfinite(row["overhead"]) for row in tokens)

    fits = data["config"]["fits"]
    for key in ("adamw_step_ms", "native_step_ms", "asteria_step_ms", "asteria_step_ms_dh",
                "state_bytes"):
        assert fits[key]["points"] == 2 and math.isfinite(fits[key]["exponent"])
    # SOAP's state grows with the model: more parameters, more bytes.
    assert fits["state_bytes"]["exponent"] > 0
    titles = [t["title"] for t in data["tables"]]
    assert any(t.startswith("How each figure grows") for t in titles)
    assert any(t.startswith("Asteria-SOAP against native SOAP") for t in titles)
    assert any(t.startswith("SOAP's overhead over AdamW") for t in titles)
    assert any(t.startswith("asteria plan against the ladder") for t in titles)
    hf = data["config"]["hf_row"]
    assert hf["model"] == "GPT2LMHeadModel" and hf["records"] == hf["steps"] > 0
    assert any(t.startswith("A Hugging Face architecture") for t in titles)
