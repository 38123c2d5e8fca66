"""The `asteria` command (asteria/cli.py, with backend/commands.py): the core's `train` and
`config` with the control plane's `serve` and `start`; `start` and `serve` resolve their run on
the product's default run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import backend.launch
from asteria import cli
from asteria_core import cli as core
from asteria_core.compat import tomllib
from asteria_core.train.config_docs import describe_keys

ROOT = Path(__file__).resolve().parents[2]


def test_the_console_entry_is_the_command_table():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"asteria": "asteria.cli:main"}


def test_help_lists_every_command_in_order(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: asteria [-h] {start,train,config,keys,plan,serve,bench} ...")
    assert "asteria serve --port 8000" in out
    assert set(cli.COMMANDS) == {"start", "train", "config", "keys", "plan", "serve", "bench"}
    assert "asteria bench all --quick" in out


@pytest.mark.parametrize("command", ["start", "serve"])
def test_start_and_serve_default_to_the_served_run(monkeypatch, command):
    seen = []
    monkeypatch.setitem(cli.COMMANDS, command, lambda config, args: seen.append(config) or 7)
    assert cli.main([command, "--train.steps", "5"]) == 7
    (config,) = seen
    assert (config.optim.name, config.optim.lr) == ("soap", 1e-2)
    assert config.policy.workers == 1
    assert (config.train.steps, config.train.checkpoint_interval) == (5, 100)
    assert config.telemetry.model_cpu_watts == 15.0


def test_start_hands_the_resolved_config_to_the_launcher(monkeypatch):
    seen = []
    monkeypatch.setattr(backend.launch, "start", lambda config, **_: seen.append(config) or 0)
    assert cli.main(["start", "--optim.name", "adamw"]) == 0
    assert seen[0].optim.name == "adamw" and seen[0].train.steps == 3000


def test_config_and_train_are_the_cores_and_have_no_served_defaults(capsys):
    assert cli.main(["config"]) == 0
    from_backend = capsys.readouterr().out
    assert core.main(["config"]) == 0
    assert capsys.readouterr().out == from_backend
    assert tomllib.loads(from_backend)["optim"]["name"] == "adamw"
    assert cli.main(["config", "--optim.lr", "x"]) == 2
    assert "asteria: config error: optim.lr: got 'x'" in capsys.readouterr().err


def exit_status(main, argv: list[str]) -> int:
    """A command's exit status, run in this process (`python -m asteria` and `python -m
    asteria_core.cli` are `sys.exit(main())`): argparse's usage errors raise SystemExit."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def test_the_core_module_alone_has_no_control_plane_commands(capsys):
    assert exit_status(core.main, ["serve"]) == 2
    assert "invalid choice: 'serve' (choose from 'train', 'config', 'keys', 'plan')" in \
        capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "config", "start", "serve"])
def test_help_says_how_overrides_work_lists_the_sections_and_names_keys(capsys, command):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--SECTION.KEY VALUE (or --SECTION.KEY=VALUE) sets any config key" in out
    for section in ("model", "optim", "data", "train", "policy", "telemetry"):
        assert re.search(rf"^    {section} +\S", out, re.M), section
    assert "`asteria keys` prints every key with its type, allowed values, default and help" \
        in out
    if command in ("start", "serve"):  # their default run is not train's
        assert "--optim.name soap --optim.lr 0.01 --policy.workers 1" in out


def test_keys_prints_each_key_with_type_range_default_and_help():
    proc = subprocess.run([sys.executable, "-m", "asteria", "keys", "optim", "policy"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("[optim]  Optimizer and learning-rate schedule.")
    assert "\n  optim.lr  a number in (0.0, 10.0]; default 0.003\n      Peak learning rate.\n" \
        in out
    assert '\n  optim.name  a string; allowed: adamw | soap | shampoo | kl_shampoo | muon; ' \
        'default "adamw"\n' in out
    assert "\n  policy.staleness_bound  an integer in [0, 1000000]; default 10\n      S: " in out
    assert "[model]" not in out and "[policy]" in out
    every = subprocess.run([sys.executable, "-m", "asteria", "keys"], capture_output=True,
                           text=True, timeout=120).stdout
    assert len(re.findall(r"^  \w+\.\w+  ", every, re.M)) == len(describe_keys())
    bad = subprocess.run([sys.executable, "-m", "asteria", "keys", "optimizer"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "unknown section 'optimizer'; allowed: model, optim, data" in bad.stderr


@pytest.mark.parametrize(("typo", "meant"), [(["--no-progres"], "--no-progress"),
                                             (["--metrics-por", "0"], "--metrics-port"),
                                             (["--con", "RUN"], "--config")])
def test_a_mistyped_option_is_an_error_and_nothing_trains(tmp_path, capsys, typo, meant):
    run = tmp_path / "run.toml"
    run.write_text("[train]\nsteps = 1\n")
    typo = [str(run) if a == "RUN" else a for a in typo]
    status = exit_status(cli.main, ["train", *typo, "--train.steps", "1", "--train.out_dir",
                                    str(tmp_path / "runs")])
    stderr = capsys.readouterr().err
    assert status == 2, stderr
    assert f"unknown option {typo[0]!r}; did you mean {meant}?" in stderr
    assert stderr.startswith("usage: asteria train")
    assert not (tmp_path / "runs").exists(), "a mistyped option must stop before training"


def test_overrides_still_pass_through_whole_options(capsys):
    assert cli.main(["config", "--no-progress", "--optim.lr", "-1e-3"]) == 2  # a value, not a flag
    assert "optim.lr: got -0.001" in capsys.readouterr().err
    assert cli.main(["config", "--config=/nonexistent.toml"]) == 2
    assert "--config: file '/nonexistent.toml' does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["config", "--optim.lr", "3e-3", "--no-progress-bar"])
    assert "unknown option '--no-progress-bar'" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "resume"), [([], None), (["--resume"], backend.launch.NEWEST),
                                              (["--resume", "20261201-120000-abcdef"],
                                               "20261201-120000-abcdef")])
def test_start_resume_hands_the_run_to_resume_to_the_launcher(monkeypatch, argv, resume):
    seen = []
    monkeypatch.setattr(backend.launch, "start", lambda config, **kw: seen.append(kw) or 0)
    assert cli.main(["start", *argv, "--no-progress"]) == 0
    assert seen == [{"progress": False, "resume": resume}]


@pytest.mark.parametrize("extra", [["--train.steps", "300"], ["--config", "run.toml"]])
def test_start_resume_refuses_a_config_of_its_own(monkeypatch, tmp_path, capsys, extra):
    (tmp_path / "run.toml").write_text("[train]\nsteps = 300\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(backend.launch, "start", lambda *a, **kw: pytest.fail("started"))
    assert cli.main(["start", "--resume", *extra]) == 2
    assert "--resume continues a run with the config it was started with" in \
        capsys.readouterr().err
