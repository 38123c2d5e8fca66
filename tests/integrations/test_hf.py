"""The Hugging Face integration, through examples/hf_trainer.py: SOAP with its refresh on a
worker inside Trainer, one step record per optimizer step with staleness and idle figures,
HF's loss and eval loss in the records, Asteria's figures in HF's logs, a live policy change at
its effective step, a stop request, gradient accumulation."""

from __future__ import annotations

import ast
import math
import subprocess
import sys

from tests.integrations.conftest import EXAMPLES, check_records, load_example, require

transformers = require("transformers", "hf")
require("accelerate", "hf")

from asteria_core.telemetry import IDLE_CAUSES  # noqa: E402

example = load_example("hf_trainer")
BOUND = 2


def build(tmp_path, *extra: str) -> tuple[transformers.Trainer, list]:
    """The example's Trainer, SOAP refreshing every 2 steps on one worker, with a listener."""
    opts = example.parse_args(["--steps", "12", "--eval-steps", "6", "--refresh-interval", "2",
                               "--staleness-bound", str(BOUND), "--workers", "1",
                               "--batch-size", "4", "--cpu-watts", "10", "--logging-steps",
                               "1", "--out", str(tmp_path), *extra])
    trainer = example.build_trainer(opts)
    records: list = []
    trainer.optimizer.runtime.add_listener(records.append)
    return trainer, records


def same_loss(ours: float, logged: float) -> bool:
    return math.isclose(ours, logged, abs_tol=1e-4)  # transformers 4 logs it rounded


def step_logs(trainer) -> dict[int, dict]:
    return {log["step"]: log for log in trainer.state.log_history if "loss" in log}


class ProposeAt(transformers.TrainerCallback):
    """Proposes a policy change at the end of one optimizer step, as a control plane would."""

    def __init__(self, runtime, step: int, changes: dict) -> None:
        self.runtime, self.step, self.changes, self.change = runtime, step, changes, None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.change = self.runtime.policy.propose(self.changes, client="test")


def test_trainer_reports_one_record_per_step_with_refresh_and_idle_figures(tmp_path):
    trainer, records = build(tmp_path)
    opt = trainer.optimizer
    runtime = opt.runtime
    propose = ProposeAt(runtime, 4, {"staleness_bound": BOUND + 1})
    trainer.add_callback(propose)
    trainer.train()

    check_records(records, runtime, propose.change, bound=BOUND)
    logs = step_logs(trainer)
    assert all(same_loss(r.loss, logs[r.step]["loss"]) for r in records)
    assert all({"forward", "backward", "optimizer", "boundary"} <= set(r.phase_seconds)
               for r in records)
    assert runtime.policy.current.staleness_bound == BOUND + 1

    # Asteria's figures are in HF's logs (what its loggers get); energy from step 2 on.
    for step, log in logs.items():
        assert {f"asteria/idle_seconds/{c}" for c in IDLE_CAUSES} <= set(log)
        assert log["asteria/staleness_max"] == records[step - 1].refresh.staleness_max
        assert log["asteria/policy_version"] == records[step - 1].policy_version
        assert step == 1 or "asteria/energy_joules/model" in log
    assert opt.runtime is None  # closed at the end of training: workers joined


def test_logged_staleness_is_the_largest_since_the_previous_log(tmp_path):
    """HF logs every 4 steps while the bases refresh every 3: the value at a logging step alone
    is often low (a fresh basis) while the steps between reached the bound; the log carries the
    largest staleness of its 4 steps, what the records show."""
    trainer, records = build(tmp_path, "--logging-steps", "4", "--eval-steps", "0",
                             "--refresh-interval", "3", "--staleness-bound", "5")
    trainer.train()
    logs = step_logs(trainer)
    assert sorted(logs) == [4, 8, 12]
    by_step = {r.step: r.refresh.staleness_max for r in records}
    for step, log in logs.items():
        assert log["asteria/staleness_max"] == max(by_step[s] for s in range(step - 3, step + 1))
    assert any(log["asteria/staleness_max"] > by_step[step] for step, log in logs.items())


def test_stop_request_stops_the_trainer_after_the_step(tmp_path):
    trainer, records = build(tmp_path, "--eval-steps", "0")
    runtime = trainer.optimizer.runtime
    runtime.at_boundary(lambda step: step == 5 and runtime.request_stop())
    trainer.train()
    assert trainer.state.global_step == 5
    assert [r.step for r in records] == [1, 2, 3, 4, 5]


def test_gradient_accumulation_gives_one_record_per_optimizer_step(tmp_path):
    trainer, records = build(tmp_path, "--steps", "4", "--grad-accum", "3", "--eval-steps", "0")
    trainer.train()
    logs = step_logs(trainer)
    assert [r.step for r in records] == [1, 2, 3, 4]
    for r in records:
        assert r.tokens == 3 * 4 * 64  # every micro-batch's forward, in one step
        # Trainer divides each micro-batch's loss by the whole step's token count: the step's
        # loss is their sum, as HF itself reports it
        assert same_loss(r.loss, logs[r.step]["loss"])
        assert set(r.timing.idle_seconds) == set(IDLE_CAUSES)


def test_the_example_as_run_logs_ten_times_with_energy_and_no_warning(tmp_path):
    """`python examples/hf_trainer.py` with its defaults, as a user runs it: HF prints its log
    ten times a run (not once a step), each with Asteria's energy so far, and transformers has
    nothing to warn about (the causal-LM loss is named where it looks)."""
    run = subprocess.run([sys.executable, str(EXAMPLES / "hf_trainer.py"), "--steps", "20",
                          "--eval-steps", "0", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, check=True)
    output = run.stdout + run.stderr
    assert "loss_type" not in output and "warn" not in output.lower(), output
    logs = [ast.literal_eval(line) for line in run.stdout.splitlines()
            if line.startswith("{'loss'")][:-1]  # the last line is the example's own summary
    assert len(logs) == 10, run.stdout
    assert all(float(log["asteria/energy_joules/model"]) > 0 for log in logs)
    assert "asteria/energy_joules/model" in run.stdout.splitlines()[-1]
