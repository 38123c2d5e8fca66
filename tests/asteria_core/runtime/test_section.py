"""The run config's `[runtime]` section (asteria_core/runtime/section.py): a config file and
`--runtime.KEY` overrides set the runtime's data-parallel options, bad values are refused naming
the key and what it allows, `asteria keys` lists them, and `RuntimeConfig` holds a script's
values to the same settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from asteria_core import cli
from asteria_core.distributed.sharded import DistributedState, UpdateDtype
from asteria_core.runtime import RuntimeConfig
from asteria_core.runtime.section import SETTINGS, RuntimeSection
from asteria_core.torchrun import Ranks
from asteria_core.train import parallel
from asteria_core.train.config import ConfigError
from asteria_core.train.config_io import config_from_dict, config_to_dict


def test_a_file_and_overrides_set_the_runtime_options(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[runtime]\ndistributed_state = "sharded"\ncoherence_threshold = 0\n')
    config = cli.resolve_config(str(path), ["--runtime.update_dtype", "bf16",
                                            "--runtime.rebalance_rounds=4"])
    assert config.runtime == RuntimeSection(distributed_state="sharded", update_dtype="bf16",
                                            rebalance_rounds=4, coherence_threshold=0.0)
    assert config_from_dict(config_to_dict(config)) == config
    assert 'distributed_state = "sharded"' in cli.to_toml(config)
    # What the trainer builds its runtime with.
    built = RuntimeConfig(**config.runtime.options())
    assert (built.distributed_state, built.update_dtype, built.rebalance_rounds) == \
        ("sharded", "bf16", 4)
    assert cli.resolve_config(None, []).runtime == RuntimeSection()


@pytest.mark.parametrize(("args", "message"), [
    (["--runtime.distributed_state", "zero"],
     "runtime.distributed_state: got 'zero'; allowed: replicated | sharded"),
    (["--runtime.update_dtype", "fp8"], "runtime.update_dtype: got 'fp8'; allowed: exact | bf16"),
    (["--runtime.rebalance_rounds", "-1"],
     "runtime.rebalance_rounds: got -1; allowed: an integer in [0, 1000000]"),
    (["--runtime.rebalance_rounds", "2.5"],
     "runtime.rebalance_rounds: got '2.5'; allowed: an integer"),
    (["--runtime.coherence_threshold", "1.5"],
     "runtime.coherence_threshold: got 1.5; allowed: a number in [0.0, 1.0]"),
    (["--runtime.worker_cpus", "0"], "unknown config key 'runtime.worker_cpus'; allowed in "
     "[runtime]: distributed_state, update_dtype, rebalance_rounds, coherence_threshold"),
])
def test_a_bad_value_names_the_key_and_what_it_allows(args, message):
    with pytest.raises(ConfigError) as err:
        cli.resolve_config(None, args)
    assert str(err.value) == message


def test_a_scripts_runtime_config_is_held_to_the_same_settings():
    assert [s.name for s in SETTINGS] == list(RuntimeSection().options())
    assert {s.name: s.choices for s in SETTINGS if s.choices} == {
        "distributed_state": tuple(DistributedState), "update_dtype": tuple(UpdateDtype)}
    defaults = RuntimeConfig()
    assert all(getattr(defaults, s.name) == s.default for s in SETTINGS)
    for wrong, message in [({"update_dtype": "fp8"}, "update_dtype: got 'fp8'; allowed: "
                                                     "exact | bf16"),
                           ({"rebalance_rounds": True}, "rebalance_rounds: got True; allowed: "
                                                        "an integer in [0, 1000000]"),
                           ({"coherence_threshold": -0.1}, "coherence_threshold: got -0.1; "
                                                           "allowed: a number in [0.0, 1.0]")]:
        with pytest.raises(ValueError) as err:
            RuntimeConfig(**wrong)
        assert str(err.value) == message


def test_keys_lists_the_section(capsys):
    assert cli.main(["keys", "runtime"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"[runtime]  {RuntimeSection.__doc__}\n")
    assert "\n  runtime.distributed_state  a string; allowed: replicated | sharded; default " \
           '"replicated"\n' in out
    assert '\n  runtime.update_dtype  a string; allowed: exact | bf16; default "exact"\n' in out
    assert "\n  runtime.rebalance_rounds  an integer in [0, 1000000]; default 0\n" in out
    assert "\n  runtime.coherence_threshold  a number in [0.0, 1.0]; default 0.0\n" in out


def test_a_checkpoint_resumes_only_the_state_mode_that_wrote_it():
    two = Ranks(rank=0, world=2, local_rank=0, local_world=2)
    written = {"ranks": {"world": 2, "local_world": 2},
               "config": {"runtime": {"distributed_state": "sharded"}}}
    parallel.check_resume(written, Path("ckpt.pt"), two, "sharded")
    with pytest.raises(ValueError, match=r"^runtime.distributed_state: got 'replicated', but "
                                         r"ckpt.pt was written by a sharded run; allowed: "
                                         r"sharded \("):
        parallel.check_resume(written, Path("ckpt.pt"), two, "replicated")
    older = {"ranks": {"world": 2, "local_world": 2}, "config": {}}  # before [runtime]
    parallel.check_resume(older, Path("ckpt.pt"), two, "replicated")
    with pytest.raises(ValueError, match="written by a replicated run"):
        parallel.check_resume(older, Path("ckpt.pt"), two, "sharded")
