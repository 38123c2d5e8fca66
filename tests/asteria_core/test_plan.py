"""`asteria plan`: the blocks and state it plans for are the optimizer's own,
the duty and worker arithmetic is the refresh engine's, refresh costs are measured through a
real worker and cached (what is not measured is labelled an estimate), and the command prints
a plan or refuses bad input naming the field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from asteria_core.cli import main as cli_main
from asteria_core.cli import resolve_config
from asteria_core.optim.base import FACTORS
from asteria_core.policy import PolicyError
from asteria_core.tiers.lifecycle import leaves
from asteria_core.train.model import GPT
from asteria_core.train.optimizers import optimizer_from_config
from asteria_core.train.plan import memory, predict, predict_optimizer, run_shape
from asteria_core.train.refresh_cost import RefreshCost, calibrate
from asteria_core.validation import ConfigError

# Blocked (block size 32 splits 48, 144 and 192), one skipped dim (the 256-byte vocabulary is
# over max_precond_dim 100), tied weights.
SMALL = ["--optim.name", "soap", "--model.n_layer", "2", "--model.n_embd", "48",
         "--model.n_head", "2", "--model.block_size", "16", "--optim.precond_block_size", "32",
         "--optim.max_precond_dim", "100"]


def trained_optimizer(config):
    """The run's model and optimizer, built as the trainer builds them, after two real steps."""
    torch.manual_seed(0)
    model = GPT(config.model)
    opt = optimizer_from_config(config.optim, model, config.policy)
    for _ in range(2):
        ids = torch.randint(0, 256, (2, 16))
        model(ids, ids)[1].backward()
        opt.step()
        opt.zero_grad()
    return opt


def test_the_plan_has_the_optimizers_blocks_and_state():
    config = resolve_config(None, SMALL)
    shape = run_shape(config)  # meta device: no memory, no steps
    opt = trained_optimizer(config)
    real_sizes = [factor.shape[0] for group in opt.param_groups for p in group["params"]
                  for blocks in opt.state[p][FACTORS] if blocks is not None for factor in blocks]
    assert list(shape.sizes) == real_sizes
    assert {32, 16} <= set(shape.sizes) and 256 not in shape.sizes  # blocked; vocab skipped
    real_bytes = sum(t.numel() * t.element_size() for state in opt.state.values()
                     for _, t in leaves(state))
    mem = memory(shape, config.policy)
    assert sum(mem.state.values()) == real_bytes  # all on the device with offload_mode none
    assert mem.state["device"] == real_bytes
    params = [p for group in opt.param_groups for p in group["params"]]
    assert shape.parameters == sum(p.numel() for p in params)


def test_the_suites_entry_point_predicts_for_a_built_optimizer(tmp_path):
    """What the scale suite calls with its measured step time: the prediction for the
    optimizer it trained, its blocks read from that optimizer."""
    config = resolve_config(None, SMALL)
    opt = trained_optimizer(config)
    p = predict_optimizer(opt, config.policy, step_seconds=0.05, cap=32,
                          calibration=tmp_path / "cal.json")
    sizes = [b.size for b in opt.refresh_blocks()]
    assert sorted(g.size for g in p.groups) == sorted(set(sizes))
    assert sum(g.blocks for g in p.groups) == len(sizes)
    assert p.round_work_s == pytest.approx(sum(g.seconds * g.blocks for g in p.groups))
    assert p.duty(1) == pytest.approx(p.round_work_s / (config.policy.refresh_interval * 0.05))
    assert not p.estimated  # every side here is at most the cap: all measured


def test_memory_follows_the_tier_settings():
    config = resolve_config(None, [*SMALL, "--policy.offload_mode", "disk",
                                   "--policy.device_budget_bytes", "200000"])
    shape = run_shape(config)
    mem = memory(shape, config.policy)
    total = sum(e.nbytes for e in shape.entries)
    assert mem.state["disk"] > 0 and mem.staging > 0
    assert mem.state["device"] <= 200000
    assert mem.state["device"] + mem.state["disk"] + mem.state["host"] - mem.staging == total
    tight = resolve_config(None, [*SMALL, "--policy.offload_mode", "disk",
                                  "--policy.device_budget_bytes", "10"])
    with pytest.raises(PolicyError, match="device_budget_bytes"):
        memory(shape, tight.policy)


def test_duty_and_workers_are_the_engines_arithmetic():
    sizes = [100] * 4 + [50] * 2
    cost = {100: 1.0, 50: 0.5}
    p = predict(sizes, cost, step_seconds=1.0, interval=10, bound=10, spread=1)
    assert p.round_work_s == pytest.approx(5.0)
    assert p.interval_train_s == pytest.approx(10.0)
    assert p.duty(1) == pytest.approx(0.5) and p.duty(2) == pytest.approx(0.25)
    assert p.workers == 1
    # The default ("auto") swap window fits the blocks: a 100-wide block is 24% of a round's
    # cost, 1.88 steps of work on workers loaded as planned (a round in 0.8 x min(d, interval)
    # = 8 steps), so V = 9 slots (one block each, three empty) with a lead of d - V + 1 = 2
    # steps from a slot's read to its swap: its one block (<= 1 s) ends within 0.8 x 2 s on
    # one worker.
    spread = predict(sizes, cost, step_seconds=1.0, interval=10, bound=10)
    assert spread.spread == 9 and spread.window_s == pytest.approx(2.0)
    assert sorted(len(slot) for slot in spread.slots) == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert spread.workers == 1
    # A window the lead cannot carry: V = 10 leaves one step (0.8 s) for a 1 s block.
    narrow = predict(sizes, cost, step_seconds=1.0, interval=10, bound=10, spread=10)
    assert narrow.workers is None and "swap_window" in narrow.why_none
    # Throughput: 5 worker-s per 3 s interval at duty <= 0.8 needs ceil(5 / 2.4) = 3 workers,
    # whose round (2 s) ends within 0.8 x 3 s.
    assert predict(sizes, cost, step_seconds=3.0, interval=1, bound=1).workers == 3
    # A window of 1: the swap comes d = 2 steps (2 s) after the read: a round packed on n
    # workers must end within 0.8 x 2 s = 1.6 s. Three workers carry 2 s; four carry 1.5 s.
    tight = predict(sizes, cost, step_seconds=1.0, interval=10, bound=2, spread=1)
    assert tight.duty(1) == pytest.approx(0.5)
    assert tight.workers == 4
    # "auto" at d = 2 fits the blocks to workers that do a round in 2 steps: V = 2 halves of
    # the round, each swapped one step after its read, which 1 s blocks miss at 0.8 x 1 s: the
    # plan says so (a narrower window, or S)
    fitted = predict(sizes, cost, step_seconds=1.0, interval=10, bound=2)
    assert fitted.spread == 2 and fitted.workers is None and "swap_window" in fitted.why_none
    # One block alone outlasts the window: no count helps, and the plan says what would.
    slow = predict(sizes, {100: 3.0, 50: 0.5}, step_seconds=1.0, interval=10, bound=2,
                   spread=1)
    assert slow.workers is None and "precond_block_size" in slow.why_none
    assert predict(sizes, cost, step_seconds=1.0, interval=10, bound=2, delay=0).workers is None


@pytest.mark.parametrize(("field", "kwargs"), [
    ("step_seconds", {"step_seconds": 0.0}),
    ("step_seconds", {"step_seconds": float("nan")}),
    ("headroom", {"headroom": 1.5}),
    ("policy.refresh_interval", {"interval": 0}),
])
def test_predict_refuses_bad_input_naming_the_field(field, kwargs):
    args = {"step_seconds": 1.0, "interval": 10, "bound": 10, **kwargs}
    with pytest.raises(ConfigError, match=rf"^{field}: got .*; allowed: "):
        predict([8], {8: 0.1}, **args)


def test_what_is_not_measured_is_an_estimate():
    cost = RefreshCost({64: 0.01, 128: 0.08})
    assert not cost.is_estimate(64) and cost.seconds(128) == 0.08
    assert cost.is_estimate(256) and cost.seconds(256) == pytest.approx(0.64)  # b^3 above
    assert 0.01 < cost.seconds(96) < 0.08 and cost.is_estimate(96)  # log-log between
    p = predict([256, 64], cost, step_seconds=1.0, interval=10, bound=10)
    assert p.estimated and [g.estimated for g in p.groups] == [True, False]


def test_calibration_runs_the_refresh_on_a_worker_and_is_cached(tmp_path):
    config = run_shape(resolve_config(None, SMALL)).configs[32]
    path = tmp_path / "cost.json"
    cost, measured = calibrate([8, 16, 2048], config, 1, path=path, cap=32)
    assert measured == [8, 16, 32]  # 2048 is over the cap: 32 anchors its extrapolation
    assert all(cost.seconds(b) > 0 for b in (8, 16, 32))
    assert cost.is_estimate(2048) and cost.seconds(2048) == pytest.approx(
        cost.seconds(32) * 64 ** 3)
    again, measured = calibrate([8, 16, 2048], config, 1, path=path, cap=32)
    assert measured == [] and again.measured == cost.measured  # from the file
    _, measured = calibrate([8], config, 1, path=path, recalibrate=True, cap=32)
    assert measured == [8]
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="^calibration: cannot read"):
        calibrate([8], config, 1, path=path)


def asteria_plan(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asteria_core.cli", "plan", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_the_command_prints_a_plan_and_its_json(tmp_path):
    cal = tmp_path / "cal.json"
    base = [*SMALL, "--step-seconds", "0.02", "--policy.refresh_interval", "5",
            "--calibration", str(cal)]
    run = asteria_plan(*base, "--json")
    assert run.returncode == 0, run.stderr
    plan = json.loads(run.stdout)
    refresh = plan["refresh"]
    shape = run_shape(resolve_config(None, SMALL))
    assert sum(g["blocks"] for g in refresh["blocks"]) == len(shape.sizes)
    assert refresh["round_work_s"] == pytest.approx(sum(g["round_seconds"]
                                                        for g in refresh["blocks"]))
    assert refresh["duty"]["1"] == pytest.approx(refresh["round_work_s"] / (5 * 0.02))
    workers = refresh["workers"]
    assert workers >= 1 and refresh["duty"][str(workers)] <= 0.8
    assert plan["memory"]["state_bytes"]["device"] == sum(e.nbytes for e in shape.entries)
    assert sorted(plan["calibration"]["measured_now"]) == sorted(set(shape.sizes))
    text = asteria_plan(*base)
    assert text.returncode == 0, text.stderr
    assert "blocks by size" in text.stdout and f"--policy.workers {workers}" in text.stdout
    assert "memory per tier" in text.stdout


def test_a_plan_is_for_soap_unless_told_otherwise(tmp_path):
    """The train default (AdamW) has nothing to plan: `asteria plan` starts from SOAP."""
    assert SMALL[:2] == ["--optim.name", "soap"]
    run = asteria_plan(*SMALL[2:], "--step-seconds", "0.02", "--calibration",
                       str(tmp_path / "cal.json"), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["refresh"]["round_work_s"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--step-seconds", "0"], "step_seconds: got 0.0; allowed: a number in (0.0, 86400.0]"),
    (["--step-seconds", "1", "--headroom", "-1"], "headroom: got -1.0; allowed: a number in"),
    (["--step-seconds", "1", "--optim.name", "adamw"], "optim.name: got 'adamw'; allowed: soap"),
    (["--step-seconds", "1", "--policy.offload_mode", "disk",
      "--policy.device_budget_bytes", "10"], "device_budget_bytes: got 10; allowed:"),
    (["--step-seconds", "1", "--policy.staleness_bound", "-3"], "staleness_bound"),
    (["--step-seconds", "1", "--measure-up-to", "0"],
     "measure_up_to: got 0; allowed: an integer in [1, 65536]"),
    ([], "the following arguments are required: --step-seconds"),
])
def test_the_command_refuses_bad_input_naming_the_field(tmp_path, capsys, args, message):
    """In this process (`python -m asteria_core.cli` is `sys.exit(main())`; the tests above run
    the command itself): a refusal is its exit status and message, nothing measured."""
    cal = tmp_path / "cal.json"
    try:
        status = cli_main(["plan", *SMALL, "--calibration", str(cal), *args])
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    assert status == 2
    stderr = capsys.readouterr().err
    assert message in stderr, stderr
    assert not cal.exists()  # refused before anything was measured


def test_the_plan_names_the_cores_and_never_recommends_more_workers_than_they_run():
    from asteria_core.machine import Machine
    from asteria_core.train.plan import RunPlan, render

    config = resolve_config(None, SMALL)
    shape = run_shape(config)
    costly = {b: 0.05 for b in set(shape.sizes)}  # slow refreshes: many workers needed
    prediction = predict(shape.sizes, costly, step_seconds=0.01, interval=10, bound=50)
    assert prediction.workers > 2
    two = Machine(cores=2, memory_bytes=8 << 30)
    planned = RunPlan(config, shape, prediction, memory(shape, config.policy), [], "", two)
    text = render(planned)
    assert "this machine: 2 core(s)" in text
    assert "recommended: 2 host worker(s) (--policy.workers 2)" in text
    assert f"--policy.workers {prediction.workers}" not in text
    assert planned.to_dict()["recommended_workers"] == 2
    assert planned.to_dict()["machine"] == {"cores": 2, "max_workers": 2}
