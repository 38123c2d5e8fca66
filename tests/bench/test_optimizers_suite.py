"""The optimizers suite of `asteria bench`: its pure parts, and one tiny run end to end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from asteria import cli
from asteria_bench import resume, selection
from asteria_bench.options import BenchOptions
from asteria_bench.reports import optimizers as report
from asteria_bench.results import Words
from asteria_bench.suites import load
from asteria_bench.suites import optimizers as suite

TINY = suite.Sizes(
    steps=6, eval_interval=3, eval_batches=1, adamw_lrs=(3e-3, 1e-2),
    second_order_lrs=(1e-2,), configs=("adamw", "muon", "soap", "asteria_soap", "kl_shampoo"),
    corpora=("default", "python-source"), muon_lrs=(2e-2,),
    overrides=("--model.n_layer", "1", "--model.n_head", "2", "--model.n_embd", "16",
               "--model.block_size", "16", "--data.batch_size", "2",
               "--optim.warmup_steps", "2"),
    notes=("tiny: the test's size",), arrangement="device-host",
    beside=("adamw", "soap", "asteria_soap"), later_configs=("adamw", "muon", "soap",
                                                              "asteria_soap"))


def options(tmp_path: Path, corpus: str | None = None) -> BenchOptions:
    return BenchOptions(quick=True, out_dir=tmp_path / "out", corpus=corpus, device="cpu",
                        peers=False, command="asteria bench optimizers --quick",
                        progress=False)


def read(out_dir: Path) -> tuple[dict, dict]:
    """The suite's file as saved (figures only: the report words it), with the report's words,
    and its runs as the report reads them (each with its ratios to tuned AdamW); the figures
    behind the report's tables, per corpus."""
    data = json.loads((out_dir / "optimizers.json").read_text())
    assert not (data["tables"] or data["headline"] or data["findings"])
    assert "summary" not in data["config"] and not any("steps_ratio" in r for r in data["runs"])
    reading = report.read(data, Words())
    return {**data, **reading.words.worded(), "runs": reading.runs}, reading.summaries


def curve(*points):
    return [{"step": s, "val_loss": v, "wall_s": w, "energy_j": e} for s, v, w, e in points]


def test_reach_interpolates_between_the_evaluations_around_the_crossing():
    c = curve((0, 5.0, 0.0, 0.0), (10, 3.0, 2.0, 20.0), (20, 2.0, 4.0, 40.0),
              (30, 1.5, 6.0, 60.0))
    got = selection.reach(c, 2.5)  # halfway from step 10 (3.0) to step 20 (2.0)
    assert got == pytest.approx({"step": 15.0, "wall_s": 3.0, "energy_j": 30.0})
    assert selection.reach(c, 2.0) == pytest.approx({"step": 20.0, "wall_s": 4.0, "energy_j": 40.0})
    assert selection.reach(c, 1.5)["step"] == pytest.approx(30.0)  # the final loss itself
    assert selection.reach(c, 6.0)["step"] == 0  # at the start already
    assert selection.reach(c, 1.0) is None  # never reached: None, not a number


def test_reach_takes_the_first_crossing_of_a_curve_that_goes_back_up():
    c = curve((0, 5.0, 0.0, None), (10, 2.0, 1.0, None), (20, 2.6, 2.0, None),
              (30, 1.9, 3.0, None))
    got = selection.reach(c, 2.5)
    assert got["step"] == pytest.approx(0 + 10 * (5.0 - 2.5) / 3.0)
    assert got["energy_j"] is None  # no energy source: none made up


def test_ratio_and_efficiency():
    assert selection.ratio(60, 100) == pytest.approx(0.6)
    assert selection.ratio(None, 100) is None and selection.ratio(60, None) is None
    assert selection.efficiency(5.5, 1.5, 200.0, 100.0) == pytest.approx(2.0)  # 4 / (200 / 100)
    assert selection.efficiency(5.5, 1.5, None, 100.0) is None


def test_corpus_validation_names_the_option(tmp_path):
    with pytest.raises(ValueError, match="--corpus: .* does not exist"):
        suite.check_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="--corpus: .* is not a file"):
        suite.check_corpus(str(tmp_path))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="--corpus: .* is empty"):
        suite.check_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    with pytest.raises(ValueError, match="--corpus: .* binary"):
        suite.check_corpus(str(tmp_path / "blob.bin"))
    (tmp_path / "short.txt").write_text("too short for a 128-token window\n")
    with pytest.raises(ValueError, match="--corpus: the training split has .* use a larger corpus"):
        load("optimizers").run(options(tmp_path, corpus=str(tmp_path / "short.txt")))
    (tmp_path / "ok.txt").write_text("some text\n" * 10)
    assert suite.check_corpus(str(tmp_path / "ok.txt")) == tmp_path / "ok.txt"
    with pytest.raises(ValueError, match="--corpus"):  # before anything trains
        load("optimizers").run(options(tmp_path, corpus=str(tmp_path / "missing.txt")))
    assert not (tmp_path / "out" / "optimizers.json").exists()


def test_a_tiny_run_writes_the_suite_json(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "QUICK", TINY)
    user = tmp_path / "mine.txt"
    user.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    result = load("optimizers").run(options(tmp_path, corpus=str(user)))
    data, summaries = read(tmp_path / "out")
    adamw = min((r for r in data["runs"] if r["corpus"] == "default" and r["family"] == "adamw"),
                key=lambda r: r["final_val_loss"])
    adamw_lr = adamw["lr"]
    assert data["suite"] == "optimizers" and data["quick"] is True
    assert set(data["config"]["corpora"]) == {"default", "python-source", "user"}
    assert data["config"]["lr_grid_skipped"] is False
    # the first corpus: 2 AdamW lrs, Muon, SOAP, Asteria-SOAP, KL-Shampoo; the others the race
    # alone (KL-Shampoo left out); on each, tuned AdamW, SOAP and Asteria-SOAP once more beside
    assert len(data["runs"]) == 6 + 3 + 2 * (5 + 3)
    assert [r["family"] for r in data["runs"] if r["corpus"] == "user"][:5] == [
        "adamw", "adamw", "muon", "soap", "asteria_soap"]
    muon = next(r for r in data["runs"] if r["corpus"] == "default" and r["family"] == "muon")
    assert muon["optimizer"] == "muon" and muon["extra"] == ["--optim.adamw_lr", str(adamw_lr)]
    for run in data["runs"]:
        assert len(run["step_ms"]) == TINY.steps  # every raw step time
        assert [p["step"] for p in run["curve"]] == [0, 3, 6]
        assert run["energy_source"] == "model" and "estimate" in run["energy_label"]
        assert all(p["energy_j"] >= 0 for p in run["curve"])
        assert run["final_val_loss"] == run["curve"][-1]["val_loss"]
        assert "steps_ratio" in run and "efficiency" in run
        assert run["parts_ms"]["forward"] > 0 and run["parts_ms"]["optimizer"] > 0
    assert adamw["tuned"] and adamw["steps_ratio"] == pytest.approx(1.0)
    assert adamw["arrangement"] == "device-host" and adamw["torch_threads"] == 1
    soap = next(r for r in data["runs"] if r["corpus"] == "default" and r["family"] == "soap")
    asteria = next(r for r in data["runs"]
                   if r["corpus"] == "default" and r["family"] == "asteria_soap")
    assert asteria["lr"] == soap["lr"]
    beside = [r for r in data["runs"] if r["arrangement"] == "shared"]
    assert [(r["corpus"], r["family"]) for r in beside][:3] == [
        ("default", "adamw"), ("default", "soap"), ("default", "asteria_soap")]
    assert beside[0]["lr"] == adamw["lr"] and beside[2]["lr"] == soap["lr"]
    assert beside[0]["tuned"] and beside[0]["wall_ratio"] == pytest.approx(1.0)
    # per corpus: the main table, the seeds' medians, the race, the step's parts, the grids
    assert len(data["tables"]) == 3 * 5
    titles = [t["title"] for t in data["tables"]]
    race = data["tables"][titles.index(next(t for t in titles if t.startswith("The race")))]
    assert race["columns"][:3] == ["optimizer", "arrangement", "config"]
    assert [row[:2] for row in race["rows"]] == [
        ["AdamW", "device-host"], ["Muon", "device-host"], ["SOAP (native)", "device-host"],
        ["Asteria-SOAP", "device-host"], ["AdamW", "shared"], ["SOAP (native)", "shared"],
        ["Asteria-SOAP", "shared"]]
    summary = summaries["default"]
    assert set(summary["race"]) == {"device-host", "shared"}
    assert any("device-host arrangement: Asteria-SOAP's quickest configuration" in f
               for f in data["findings"])
    assert set(summary["parts"]) >= {"adamw/device-host", "muon/device-host",
                                     "asteria_soap/device-host", "asteria_soap/shared"}
    main = data["tables"][0]  # each corpus's main table first
    assert main["title"].startswith("Optimizers on the default")
    assert main["columns"][:4] == ["optimizer", "lr", "tuned", "final val loss"]
    grids = summary["grids"]
    assert grids["adamw"]["lrs"] == [3e-3, 1e-2] and grids["adamw"]["bracketed"] is False
    tuned = summary["tuned"]
    assert set(tuned) >= {"adamw/device-host", "muon/device-host", "soap/device-host",
                          "adamw/shared"}
    assert tuned["adamw/device-host"]["seeds"] == 1
    for plot in data["plots"]:
        assert (tmp_path / "out" / plot["file"]).is_file()
    for key in ("soap_steps_ratio_default", "kl_shampoo_steps_ratio_default",
                "soap_steps_ratio_python_source", "asteria_soap_wall_vs_muon_default",
                "asteria_soap_wall_vs_native_python_source"):
        entry = data["headline"][key]
        entry["text"].format(value=entry["value"])
    assert "kl_shampoo_steps_ratio_python_source" not in data["headline"]  # first corpus only
    assert not any(k.endswith("_user") for k in data["headline"])
    assert any("published anchors" in f for f in data["findings"])
    assert any("against native SOAP at the same lr" in f for f in data["findings"])
    assert any("AdamW's tuned lr" in f and "grid" in f for f in data["findings"])
    assert not result.headline and result.plots == data["plots"]


def fake(family, lr=1e-2, seed=0, interval=None, arrangement="device-host", wall=10.0,
         steps=100, final=1.0):
    """A run that reaches loss 1.5 at `steps` after `wall` seconds (twice the seconds and steps
    to its last evaluation)."""
    return {"family": family, "label": family, "lr": lr, "seed": seed, "interval": interval,
            "arrangement": arrangement, "peer": None, "extra": [], "final_val_loss": final,
            "policy": {"swap_delay": interval or 10}, "step_ms_median": 1.0,
            "curve": curve((0, 5.0, 0.0, 0.0), (steps, 1.5, wall, 10 * wall),
                           (2 * steps, final, 2 * wall, 20 * wall))}


def test_the_race_takes_each_soaps_quickest_interval_and_compares_medians():
    runs = [fake("adamw", 3e-3, final=1.5), fake("adamw", 3e-3, seed=1, final=1.5),
            fake("muon", wall=20.0), fake("muon", seed=1, wall=30.0),
            fake("soap", wall=40.0), fake("soap", interval=2, wall=30.0),
            fake("soap", interval=2, seed=1, wall=32.0),
            fake("asteria_soap", wall=25.0, steps=110),
            fake("asteria_soap", interval=2, wall=20.0, steps=102),
            fake("asteria_soap", interval=2, seed=1, wall=18.0, steps=104),
            fake("soap", 3e-2, wall=5.0, final=1.2)]  # an lr that lost the tuning: not raced
    assert selection.target_of(runs, "device-host") == 1.5
    assert selection.quickest(runs, "soap", 1.5, "device-host")["interval"] == 2
    assert selection.quickest(runs, "muon", 1.5, "device-host") is runs[2]
    entries = report.race(runs, 1.5, "device-host")
    ours = entries["asteria_soap"]
    assert ours["interval"] == 2 and ours["seeds"] == 2
    assert ours["wall_s_to_target"]["median"] == pytest.approx(19.0)
    assert ours["wall_vs_muon"] == pytest.approx(19.0 / 25.0)
    assert ours["wall_vs_native"] == pytest.approx(19.0 / 31.0)
    assert ours["energy_vs_muon"] == pytest.approx(190.0 / 250.0)
    # the same interval, the seeds both trained: 103 against native's 100 steps
    groups = report.interval_groups(runs, "asteria_soap", "device-host")
    native = report.interval_groups(runs, "soap", "device-host")
    assert sorted(groups) == [2, 10] and len(native[2]) == 2
    assert report.same_interval_steps(native[2], groups[2], 1.5) == pytest.approx(1.03)
    assert report.same_interval_steps(native[10], groups[10], 1.5) == pytest.approx(1.1)
    assert report.same_interval_steps(native[2], groups[2], 0.5) is None  # never reached


def test_a_grid_grows_past_the_edge_its_best_sits_at():
    assert selection.widen([1e-3, 3e-3, 1e-2], 1e-2) == pytest.approx(3.33e-2)
    assert selection.widen([1e-3, 3e-3, 1e-2], 1e-3) == pytest.approx(3.33e-4)
    assert selection.widen([1e-3, 3e-3, 1e-2], 3e-3) is None  # inside: bracketed
    assert selection.widen([1e-2], 1e-2) is None  # one lr: nothing to step by
    assert selection.widen([3.0, 9.0], 9.0) is None  # past the trainer's largest lr
    assert selection.bracketed([1e-3, 3e-3, 1e-2], 3e-3)
    assert not selection.bracketed([1e-3, 3e-3], 3e-3) and not selection.bracketed([3e-3], 3e-3)


def test_spread_counts_the_runs_that_never_reach():
    assert selection.spread([3.0, None, 1.0, 2.0]) == {"n": 3, "missing": 1, "median": 2.0,
                                                   "min": 1.0, "max": 3.0}
    assert selection.spread([None])["median"] is None


def test_sizes_by_rung_and_seeds(tmp_path):
    opts = options(tmp_path)
    assert suite.pick_sizes(opts) is suite.QUICK
    full = BenchOptions(**{**opts.__dict__, "quick": False, "rung": "large", "seeds": 2})
    large = suite.pick_sizes(full)
    assert large.rung == "large" and large.seeds == 2 and large.steps == 2 * suite.FULL.steps
    with pytest.raises(ValueError, match="^--rung: got 'huge'"):
        suite.pick_sizes(BenchOptions(**{**opts.__dict__, "quick": False, "rung": "huge"}))
    assert suite.planned_runs(suite.LARGE, 1) == {"least": 6, "most": 6}
    # the full default rung, first corpus: 3 + 3 + 3 + 1 + 3 + 3 runs to tune, 2 more seeds of
    # 6 tuned ones, 4 intervals x 2 SOAPs on one seed and 2 more seeds of each one's quickest,
    # the race's 4 beside; the second corpus the race alone: 3 + 3 + 3 + 1, 2 x 4 seeds, the
    # same intervals and beside
    first, second = 16 + 12 + (8 + 4) + 4, 10 + 8 + (8 + 4) + 4
    assert suite.planned_runs(suite.FULL, 2) == {"least": first + second,
                                                 "most": first + second + 2 * (5 + 3)}
    assert suite.planned_runs(suite.FULL, 2, peers=2)["least"] == first + second + 2 * 3


SEEDED = suite.Sizes(
    steps=4, eval_interval=2, eval_batches=1, adamw_lrs=(3e-3, 1e-2), second_order_lrs=(1e-2,),
    configs=("adamw", "soap", "asteria_soap"), corpora=("default",), overrides=TINY.overrides,
    seeds=2, intervals=(2,), max_widen=1)


def test_seeds_intervals_and_a_widened_grid(tmp_path, monkeypatch):
    monkeypatch.setattr(suite, "QUICK", SEEDED)
    load("optimizers").run(options(tmp_path))
    data, summaries = read(tmp_path / "out")
    runs = data["runs"]
    adamw = [r for r in runs if r["family"] == "adamw" and not r["seed"]]
    assert len(adamw) == 3  # two lrs, and one past the edge the best sat at
    summary = summaries["default"]
    assert summary["grids"]["adamw"]["lrs"] == sorted(r["lr"] for r in adamw)
    for family in ("adamw", "soap", "asteria_soap"):
        assert summary["tuned"][f"{family}/shared"]["seeds"] == 2
    first, second = ([r for r in runs if r["family"] == "adamw" and r["seed"] == seed
                      and r["lr"] == summary["tuned"]["adamw/shared"]["lr"]] for seed in (0, 1))
    assert len(first) == len(second) == 1
    assert first[0]["train_losses"] != second[0]["train_losses"]  # another seed, another run
    # every interval on the first seed; the other seed where that interval is the quicker
    quicker = quicker_at_2(runs)
    axis = [(r["family"], r["interval"], r["seed"]) for r in runs if r["interval"] is not None]
    assert sorted(axis) == sorted([("asteria_soap", 2, 0), ("soap", 2, 0),
                                   *((f, 2, 1) for f in quicker)])
    assert all(r["policy"]["refresh_interval"] == 2 for r in runs if r["interval"] == 2)
    assert all(r["policy"]["swap_delay"] == 2 for r in runs
               if r["interval"] == 2 and r["family"] == "asteria_soap")  # "auto": the interval
    assert set(summary["intervals"]) == {"soap/2", "soap/10", "asteria_soap/2",
                                         "asteria_soap/10"}
    assert len(runs) == 3 + 1 + 1 + 3 + 2 + len(quicker)


def quicker_at_2(runs: list[dict]) -> list[str]:
    """The SOAPs of a SEEDED run whose quickest interval is 2 (timing decides it): they train
    their second seed there too."""
    target = selection.target_of(runs, "shared")
    return [f for f in ("asteria_soap", "soap")
            if selection.quickest(runs, f, target, "shared")["interval"] == 2]


def bench(out: Path, *args: str) -> int:
    """`asteria bench optimizers --quick` (the sizes SEEDED, patched in) into `out`, in this
    process: its exit status."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(suite, "QUICK", SEEDED)
        return cli.main(["bench", "optimizers", "--quick", "--no-progress", "--out", str(out),
                         *args])


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict:
    """A whole run's JSON, as `asteria bench` leaves it."""
    out = tmp_path_factory.mktemp("finished")
    assert bench(out) == 0
    return json.loads((out / "optimizers.json").read_text())


def test_a_run_cut_short_resumes_from_its_runs_and_follows_their_choices(tmp_path, finished,
                                                                         capsys):
    assert finished["complete"] is True and "resumed" not in finished["config"]
    grid = finished["runs"][:2]  # AdamW's two lrs; the third run widens past the best one
    assert [r["lr"] for r in grid] == list(SEEDED.adamw_lrs)
    # The saved losses decide: make the lr that lost win, and the widening must follow it.
    best = min(grid, key=lambda r: r["final_val_loss"])
    loser = next(r for r in grid if r is not best)
    loser["final_val_loss"] = loser["curve"][-1]["val_loss"] = best["final_val_loss"] - 1.0
    stray = {**grid[0], "lr": 0.5}  # a configuration the choices never reach again
    cut = {**finished, "runs": [*grid, stray], "complete": False, "seconds": 1000.0,
           "machine": {**finished["machine"], "torch_threads": 7}}  # a process's, not compared
    (tmp_path / "optimizers.json").write_text(json.dumps(cut))
    assert bench(tmp_path, "--resume") == 0
    data = json.loads((tmp_path / "optimizers.json").read_text())
    assert data["complete"] is True
    assert [r["step_ms"] for r in data["runs"][:2]] == [r["step_ms"] for r in grid]  # kept
    assert data["runs"][2]["family"] == "adamw"
    assert data["runs"][2]["lr"] == pytest.approx(selection.widen(SEEDED.adamw_lrs, loser["lr"]))
    assert 0.5 not in [r["lr"] for r in data["runs"]]
    assert len(data["runs"]) == 3 + 1 + 1 + 3 + 2 + len(quicker_at_2(data["runs"]))
    resumed = data["config"]["resumed"]
    assert [(r["runs_found"], r["runs_kept"], r["runs_dropped"]) for r in resumed] == [(3, 2, 1)]
    assert data["started"] == finished["started"] and data["seconds"] >= 1000.0
    assert "1 saved run(s) were not reached again" in capsys.readouterr().err


def test_resume_with_no_file_starts_from_the_first_run_and_says_so(tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.setattr(suite, "QUICK", SEEDED)
    opts = BenchOptions(**{**options(tmp_path).__dict__, "resume": True})
    empty = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):  # stop it at its first run: the message came first
        monkeypatch.setattr(suite, "train_one", _interrupt)
        load("optimizers").run(opts)
    assert f"nothing to continue at {empty / 'optimizers.json'}" in capsys.readouterr().err


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["config"].update(measured_code="0" * 16), "the code it measures changed"),
    (lambda d: d["config"].pop("measured_code"), "records no digest of the code"),
    (lambda d: d["config"].update(seeds=3), "other settings (config seeds 3 then, 2 now)"),
    (lambda d: d["config"].update(device="cuda"), "(config device 'cuda' then, 'cpu' now)"),
    (lambda d: d["config"]["corpora"]["default"].update(sha256="0" * 16), "config corpora"),
    (lambda d: d["machine"].update(cpu="another"), "another machine (machine cpu 'another'"),
    (lambda d: d.update(quick=False), "it holds suite 'optimizers' (quick False)"),
])
def test_a_run_that_would_not_come_out_the_same_is_not_continued(tmp_path, finished, capsys,
                                                                  change, message):
    saved = json.loads(json.dumps(finished))
    change(saved)
    path = tmp_path / "optimizers.json"
    path.write_text(json.dumps(saved))
    before = path.read_bytes()
    assert bench(tmp_path, "--resume") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # one line, after the suite's title
    assert err.startswith(f"asteria bench: --resume: {path} can not be continued")
    assert message in err
    assert path.read_bytes() == before  # left as it was


def test_the_digest_follows_the_code_a_suite_measures(tmp_path, monkeypatch):
    assert resume.code_digest("optimizers") == resume.code_digest("optimizers")
    tree = tmp_path / "tree"
    shutil.copytree(resume.ROOT / "asteria_bench", tree / "asteria_bench",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "asteria_core").mkdir()
    (tree / "asteria_core" / "step.py").write_text("x = 1\n")
    monkeypatch.setattr(resume, "ROOT", tree)
    one = resume.code_digest("optimizers")
    (tree / "asteria_core" / "step.py").write_text("x = 2\n")
    two = resume.code_digest("optimizers")
    (tree / "asteria_bench" / "report.py").write_text("# not code a suite measures\n")
    assert two != one and resume.code_digest("optimizers") == two
    with (tree / "asteria_bench" / "suites" / "optimizers.py").open("a") as module:
        module.write("# its own module is\n")
    assert resume.code_digest("optimizers") != two
