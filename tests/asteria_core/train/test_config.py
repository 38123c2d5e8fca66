import subprocess
import sys

import pytest

from asteria_core.cli import resolve_config, to_toml
from asteria_core.train.config import ConfigError, OptimConfig
from asteria_core.train.config_io import (
    build_config,
    config_from_dict,
    config_to_dict,
    read_config_file,
)


def test_defaults_round_trip_through_dict_and_toml(tmp_path):
    config = build_config()
    assert config_from_dict(config_to_dict(config)) == config
    path = tmp_path / "run.toml"
    path.write_text(to_toml(config))
    assert build_config(read_config_file(path)) == config


def test_file_then_overrides_later_wins(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[optim]\nlr = 0.01\nbetas = [0.8, 0.9]\n[train]\nsteps = 7\n")
    config = resolve_config(str(path), ["--optim.lr", "3e-3", "--train.seed=5"])
    assert config.optim.lr == 3e-3
    assert config.optim.betas == (0.8, 0.9)
    assert (config.train.steps, config.train.seed) == (7, 5)


def test_yaml_file(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  n_layer: 2\n  tie_weights: false\n")
    config = resolve_config(str(path), [])
    assert config.model.n_layer == 2 and config.model.tie_weights is False


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[optim]\nlrr = 0.1\n", "unknown config key 'optim.lrr'"),
        ("[optimizer]\nlr = 0.1\n", "unknown config section 'optimizer'"),
        ("[optim]\nlr = \"fast\"\n", "optim.lr: got 'fast' (str); allowed: a number"),
        ("[train]\nsteps = 1.5\n", "train.steps: got 1.5 (float); allowed: an integer"),
        ("[model]\nbias = 1\n", "model.bias: got 1 (int); allowed: true or false"),
        ("[optim]\nlr = -0.001\n", "optim.lr: got -0.001; allowed: a number in (0.0, 10.0]"),
        ("[optim]\nbetas = [0.9]\n", "optim.betas: got [0.9]"),
        ("[model]\nn_head = 3\n", "model.n_head: got 3; allowed: a divisor of model.n_embd"),
        ("[data]\ncorpus = \"/no/such/corpus\"\n", "data.corpus: path '/no/such/corpus' does not"),
        ("[optim]\nname = \"sgd\"\n", "optim.name: got 'sgd'; allowed: adamw | soap"),
        ("[train]\ncpus = \"0-\"\n", "train.cpus: got '0-'; allowed: a CPU list"),
        ("[train]\ncpus = \"3-1\"\n", "train.cpus: got '3-1'; allowed: a CPU list"),
        ("[train]\ncpus = \"4096\"\n", "train.cpus: got '4096'; allowed: a CPU list"),
        ("[train]\nworker_cpus = \"1-\"\n", "train.worker_cpus: got '1-'; allowed: a CPU list"),
        ("[train]\nworker_cpus = \"4096\"\n",
         "train.worker_cpus: got '4096'; allowed: a CPU list"),
    ],
)
def test_bad_config_file_names_the_key(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        resolve_config(str(path), [])
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--optim.lr", "-1"], "optim.lr: got -1.0"),
        (["--optim.lr", "abc"], "optim.lr: got 'abc'; allowed: a number"),
        (["--train.stepz", "3"], "unknown config key 'train.stepz'"),
        (["--optim.betas", "0.9"], "optim.betas: got '0.9'"),
        (["--train.steps"], "missing value"),
        (["steps=3"], "unexpected argument 'steps=3'"),
    ],
)
def test_bad_override_names_the_key(args, message):
    with pytest.raises(ConfigError) as err:
        resolve_config(None, args)
    assert message in str(err.value)


def test_nan_and_bool_are_not_numbers():
    with pytest.raises(ConfigError, match="optim.lr"):
        OptimConfig(lr=float("nan"))
    with pytest.raises(ConfigError, match="optim.warmup_steps"):
        OptimConfig(warmup_steps=True)


def test_cli_fails_fast_with_exit_code_2(tmp_path):
    """A bad config stops the real command before any model is built."""
    proc = subprocess.run(
        [sys.executable, "-m", "asteria_core.cli", "train", "--optim.lr", "-3",
         "--train.out_dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "config error: optim.lr: got -3.0" in proc.stderr
    assert not any(tmp_path.iterdir()), "nothing may be written for a rejected config"


def test_policy_section_is_validated_like_the_rest(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[policy]\nstaleness_bound = 4\nswap_delay = 2\nworkers = 2\n")
    config = resolve_config(str(path), ["--policy.swap_mode", "opportunistic"])
    assert (config.policy.staleness_bound, config.policy.swap_delay, config.policy.workers,
            config.policy.swap_mode) == (4, 2, 2, "opportunistic")
    with pytest.raises(ConfigError, match=r"policy.swap_delay: got 5; allowed: at most "):
        resolve_config(str(path), ["--policy.swap_delay", "5"])
    assert resolve_config(str(path), ["--policy.swap_delay", "auto"]).policy.delay == 4
    assert resolve_config(str(path), ["--policy.swap_delay", "3"]).policy.swap_delay == 3
    with pytest.raises(ConfigError, match='policy.swap_delay: got \'soon\'; allowed: "auto" or'):
        resolve_config(str(path), ["--policy.swap_delay", "soon"])
    with pytest.raises(ConfigError, match="unknown config key 'policy.bound'"):
        resolve_config(None, ["--policy.bound", "5"])


def test_the_model_bound_leaves_out_moments_a_disk_tier_may_hold():
    """A model whose weights, gradients and two fp32 moments pass this machine's memory but
    whose weights and gradients fit is refused all in memory, and accepted for a second-order
    optimizer with a disk tier, whose in-memory share the trainer checks from the tier plan
    (the 1B headline needed a cap above its moments). AdamW keeps its moments."""
    from asteria_core.machine import MACHINE
    from asteria_core.train.config import ModelConfig, parameters

    width = 2048
    per_layer = parameters(ModelConfig(n_layer=2, n_embd=width, n_head=16)) - \
        parameters(ModelConfig(n_layer=1, n_embd=width, n_head=16))
    layers = int(MACHINE.memory_bytes / (12 * per_layer)) + 1  # ~12 bytes per parameter
    model = ["--model.n_layer", str(layers), "--model.n_embd", str(width),
             "--model.n_head", "16", "--model.block_size", "32", "--data.batch_size", "1"]
    disk = ["--policy.offload_mode", "disk"]
    with pytest.raises(ConfigError, match="weights, gradients and moments of"):
        resolve_config(None, [*model, "--optim.name", "soap"])
    with pytest.raises(ConfigError, match="weights, gradients and moments of"):
        resolve_config(None, [*model, "--optim.name", "adamw", *disk])
    config = resolve_config(None, [*model, "--optim.name", "soap", *disk])
    assert config.model.n_layer == layers
