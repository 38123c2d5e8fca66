"""The `asteria` command (backend.cli): the core's `train` and `config` with the control plane's
`serve` and `start`; `start` and `serve` resolve their run on the product's default run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import backend.launch
from asteria_core import cli as core
from backend import cli


def test_the_console_entry_is_the_backend_cli():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"asteria": "backend.cli:main"}


def test_help_lists_every_command_in_order(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: asteria [-h] {start,train,config,serve} ...")
    assert "asteria serve --port 8000" in out
    assert set(cli.COMMANDS) == {"start", "train", "config", "serve"}


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
    monkeypatch.setattr(backend.launch, "start", lambda config: seen.append(config) or 0)
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


def test_the_core_module_alone_has_no_control_plane_commands():
    proc = subprocess.run([sys.executable, "-m", "asteria_core.cli", "serve"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "invalid choice: 'serve' (choose from 'train', 'config')" in proc.stderr
