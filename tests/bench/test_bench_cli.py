"""`asteria bench`: its arguments, and the round-robin suites at a tiny size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asteria import cli
from asteria_bench import cli as bench_cli
from asteria_bench import reports, turns
from asteria_bench.options import BenchOptions
from asteria_bench.results import SuiteResult
from asteria_bench.suites import SUITES, load

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model.n_embd", "32", "--model.n_head", "2", "--model.n_layer", "1",
        "--model.block_size", "32", "--data.batch_size", "2",
        "--policy.refresh_interval", str(turns.INTERVAL)]


def bench(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asteria", "bench", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def bench_here(*args: str) -> int:
    """`asteria bench ARGS` in this process (`python -m asteria` is `sys.exit(main())`; the
    report test below runs the command itself): its exit status."""
    try:
        return cli.main(["bench", *args])
    except SystemExit as exit_:  # argparse's usage errors
        return exit_.code


@pytest.mark.parametrize(("args", "message"), [
    ((), "name a SUITE"),
    (("fastest",), "SUITE: got 'fastest'; allowed: optimizers, critical-path"),
    (("optimizers", "--corpus", "/nonexistent/corpus.txt"), "--corpus: '/nonexistent"),
    (("distributed", "--seeds", "0"), "--seeds: got 0; allowed: 1 to 20"),
    (("distributed", "--seeds", "21"), "--seeds: got 21; allowed: 1 to 20"),
    (("optimizers", "critical-path", "--resume"), "--resume: got critical-path; allowed: "
                                                   "optimizers"),
])
def test_bad_arguments_stop_before_anything_runs_naming_what_is_wrong(capsys, args, message):
    assert bench_here(*args) == 2
    assert message in capsys.readouterr().err


def test_a_mistyped_option_is_a_usage_error(capsys):
    assert bench_here("all", "--quik") == 2 and "--quik" in capsys.readouterr().err


def test_report_only_renders_the_report_and_readme_from_the_json(tmp_path):
    out = tmp_path / "benchmarks"
    suite = SuiteResult("staleness", "Staleness", quick=True, command="asteria bench staleness")
    suite.quote("best", ["S=5", 0.97, -0.01], "fastest {value[0]}: {value[1]:.2f}x, "
                                              "{value[2]:+.4f}")
    suite.runs.append({"label": "native", "step_ms": [1.0]})
    suite.save(out)
    readme = tmp_path / "README.md"
    from asteria_bench import report

    readme.write_text(f"intro\n{report.BEGIN}\n{report.END}\n")
    proc = bench("--report-only", "--out", str(out), "--report", str(tmp_path / "report.md"),
                 "--readme", str(readme))
    assert proc.returncode == 0, proc.stderr
    assert "fastest S=5: 0.97x, -0.0100" in readme.read_text()
    assert "## Staleness" in (tmp_path / "report.md").read_text()


def test_by_default_results_go_to_the_users_folder_and_nothing_is_published(tmp_path):
    """A user measuring their own machine gets ./asteria-bench-results (JSON, plots, report.md);
    the checkout's docs/benchmarks, docs/benchmarks.md and README.md stay as they are."""
    published = {p: (ROOT / p).read_bytes() for p in ("README.md", "docs/benchmarks.md")}
    suite = SuiteResult("staleness", "Staleness", quick=True, command="asteria bench staleness")
    suite.quote("best", ["S=5", 0.5], "fastest {value[0]}: {value[1]:.2f}x")
    suite.runs.append({"label": "native", "step_ms": [1.0]})
    suite.save(tmp_path / "asteria-bench-results")
    proc = bench("--report-only", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "asteria-bench-results" / "report.md").read_text()
    assert "## Staleness" in page and "fastest S=5: 0.50x" not in page  # the README's line only
    assert "wrote " + str(Path("asteria-bench-results") / "report.md") in proc.stderr
    assert "README" not in proc.stderr
    assert {p: (ROOT / p).read_bytes() for p in published} == published


def test_publish_names_the_checkouts_pages_explicitly():
    parser = cli.build_parser()
    args = parser.parse_args(["bench", "all", "--publish"])
    assert bench_cli.destinations(args) == (ROOT / "docs/benchmarks", ROOT / "docs/benchmarks.md",
                                            ROOT / "README.md")
    args = parser.parse_args(["bench", "all"])
    assert bench_cli.destinations(args) == (Path("asteria-bench-results"),
                                            Path("asteria-bench-results/report.md"), None)


def test_every_suite_has_a_title_and_a_run():
    for name in SUITES:
        suite = load(name)
        assert suite.TITLE and callable(suite.run), name


def test_time_to_loss_counts_turns_until_their_mean_reaches_the_target():
    run = {"loss": [5.0] * 10 + [3.0] * 10 + [2.0] * 10, "step_ms": [100.0] * 30,
           "p50_ms": 100.0}
    assert turns.time_to_loss(run, 3.0) == (20, 2.0)
    assert turns.time_to_loss(run, 2.0) == (30, 3.0)
    assert turns.time_to_loss(run, 1.0) == (None, None)
    assert turns.final_turn_loss(run) == 2.0
    # a one-off compilation in the warm-up counts at the median step
    run.update(step_ms=[9000.0] + [100.0] * 29, warmup_steps=10)
    assert turns.time_to_loss(run, 3.0) == (20, 2.0)


def test_configurations_in_turns_see_the_same_batches_and_report_every_step(tmp_path):
    """Two SOAPs (inline and on a worker) and AdamW, 2 turns each: every step's time and loss
    is kept, the first step's loss is the same for all (same seed, same batch), Asteria's
    staleness stays within its bound, and the idle causes are the runtime's."""
    configs = [turns.Config("AdamW", turns.ADAMW, "adamw"),
               turns.Config("native SOAP", turns.SOAP + turns.NATIVE, "soap"),
               turns.Config("Asteria-SOAP", turns.SOAP + turns.asteria(5), "soap")]
    opts = BenchOptions(quick=True, out_dir=tmp_path, corpus=None, device="cpu", peers=False,
                        command="test", progress=False)
    runs = turns.round_robin(configs, 2 * turns.INTERVAL, tmp_path, opts, TINY)
    assert [r["label"] for r in runs] == ["AdamW", "native SOAP", "Asteria-SOAP"]
    for r in runs:
        assert len(r["step_ms"]) == len(r["loss"]) == 2 * turns.INTERVAL
        assert all(ms > 0 for ms in r["step_ms"])
        assert r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] <= r["max_ms"]
        assert r["spike"] >= 1.0
    assert runs[0]["loss"][0] == pytest.approx(runs[1]["loss"][0]) == \
        pytest.approx(runs[2]["loss"][0])
    assert runs[0]["staleness_max"] == 0 and runs[2]["staleness_max"] <= 5
    assert "refresh_wait" in runs[2]["idle_s"]
    json.dumps(runs)  # the suite's file holds them as they are


def test_the_critical_path_report_compares_against_adamw(tmp_path):
    runs = [dict(label=label, family=family, peer=None, p50_ms=p50, p90_ms=p50, p99_ms=p99,
                 max_ms=p99, mean_ms=p50, spike=spike, idle_s={"refresh_wait": 0.0},
                 staleness_max=0, final_val_loss=2.0, params=1e6, warmup_steps=0,
                 loss=[3.0] * 10 + [2.0] * 10, step_ms=[p50] * 20)
            for label, family, p50, p99, spike in (
                ("AdamW", "adamw", 100, 110, 1.1), ("native SOAP", "soap", 200, 900, 3.0),
                ("Asteria-SOAP", "soap", 190, 250, 1.2))]
    words = reports.render(reports.module_of("critical-path"),
                           {"suite": "critical-path", "config": {}, "runs": runs})
    rows = {row[0]: row for row in words.tables[0].rows}
    assert rows["AdamW"][7] == "-" and rows["native SOAP"][7] == "+100%"
    assert rows["Asteria-SOAP"][11] == "3.8"  # two turns of 10 steps at 190 ms to reach 2.0
    assert words.headline["soap_spike"]["value"] == [1.2, 3.0]
