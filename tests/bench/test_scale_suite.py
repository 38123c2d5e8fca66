"""`asteria bench scale --quick` end to end on a tiny ladder (two tiny GPTs, three turns each):
the JSON it writes, checked for its structure and for sane numbers (no timing thresholds)."""

from __future__ import annotations

import json
import math

from asteria_bench.suites import SUITES, load, scale
from tests.bench.test_suites_small import check_common, finite_positive, options

TINY = (scale.Rung(n_layer=1, n_embd=16, n_head=2, seq=16, batch=2, turns=3),
        scale.Rung(n_layer=2, n_embd=32, n_head=2, seq=16, batch=2, turns=3))


def test_the_scale_suite_fits_every_figure_over_a_ladder_of_sizes(tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "QUICK", TINY)
    assert "scale" in SUITES
    opts = options(tmp_path, "scale")
    load("scale").run(opts)
    data = json.loads((opts.out_dir / "scale.json").read_text())
    check_common(data, "scale", opts.out_dir)
    assert not (opts.out_dir / ".scale-runs").exists()  # the runs' folders are cleaned up

    runs = data["runs"]
    assert [r["label"].split(" ")[0] for r in runs] == ["AdamW", "native", "Asteria-SOAP"] * 2
    sizes = sorted({r["params"] for r in runs})
    assert len(sizes) == 2  # two sizes, each arm with the same model
    for r in runs:
        assert len(r["step_ms"]) == 3 * scale.INTERVAL
        assert all(finite_positive(x) for x in (r["p50_ms"], r["mean_ms"], r["p99_ms"]))
        assert finite_positive(r["peak_rss_bytes"])
        kinds = r["state_bytes"]
        if r["family"] == "adamw":
            assert kinds["moments"] > 0 and kinds["factors"] == kinds["bases"] == 0
        else:
            assert kinds["factors"] > 0 and kinds["bases"] > 0 and kinds["moments"] > 0
            assert finite_positive(r["round_work_s"]) and finite_positive(r["refresh_duty"])
            assert r["refreshes"] > 0 and r["failures"] == 0
    for r in (r for r in runs if r["label"].startswith("Asteria")):
        assert 0 < r["staleness_max"] <= r["staleness_bound"] == scale.BOUND
        assert r["refresh_wait_ms_per_step"] >= 0 and r["swap_ms_per_step"] >= 0

    fits = data["config"]["fits"]
    for key in ("adamw_step_ms", "native_step_ms", "asteria_step_ms", "state_bytes"):
        assert fits[key]["points"] == 2 and math.isfinite(fits[key]["exponent"])
    # SOAP's state grows with the model: more parameters, more bytes.
    assert fits["state_bytes"]["exponent"] > 0
    assert any(t["title"].startswith("How each figure grows") for t in data["tables"])
