"""The Lightning integration, through examples/lightning_module.py: SOAP with its refresh on a
worker under automatic optimization (`step(closure)`), one step record per optimizer step with
staleness and idle figures, validation loss in the records, Asteria's figures in Lightning's
logged metrics, a live policy change at its effective step, a stop request, gradient
accumulation, and manual optimization through LightningOptimizer."""

from __future__ import annotations

import math

from tests.integrations.conftest import check_records, load_example, require

pl = require("lightning.pytorch", "lightning")

from asteria_core.telemetry import IDLE_CAUSES  # noqa: E402

example = load_example("lightning_module")
BOUND = 2


class Watch(pl.Callback):
    """Collects the runtime's records; optionally proposes a policy change after one step."""

    def __init__(self, propose_at: int = 0, changes: dict | None = None) -> None:
        self.records: list = []
        self.propose_at, self.changes, self.change = propose_at, changes, None
        self.runtime = None

    def on_train_start(self, trainer, pl_module):
        self.runtime = trainer.optimizers[0].runtime
        self.runtime.add_listener(self.records.append)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.changes and trainer.global_step == self.propose_at and self.change is None:
            self.change = self.runtime.policy.propose(self.changes, client="test")


def fit(tmp_path, *extra: str, watch: Watch | None = None, model_cls=None):
    opts = example.parse_args(["--steps", "12", "--eval-steps", "6", "--refresh-interval", "2",
                               "--staleness-bound", str(BOUND), "--workers", "1",
                               "--batch-size", "4", "--cpu-watts", "10", "--out",
                               str(tmp_path), *extra])
    watch = watch or Watch()
    trainer, model, loaders = example.build(opts, [watch])
    if model_cls is not None:
        model = model_cls(opts)
    trainer.fit(model, **loaders)
    return trainer, watch


def test_fit_reports_one_record_per_step_with_refresh_and_idle_figures(tmp_path):
    trainer, watch = fit(tmp_path, watch=Watch(4, {"staleness_bound": BOUND + 1}))
    records, runtime = watch.records, watch.runtime

    check_records(records, runtime, watch.change, bound=BOUND)
    # forward and backward run inside step(closure); the hooks still tell them apart
    assert all(r.phase_seconds[p] > 0 for r in records for p in ("forward", "backward",
                                                                  "optimizer"))

    # Asteria's figures of the last step reached Lightning's loggers.
    logged = trainer.logged_metrics
    assert {f"asteria/idle_seconds/{c}" for c in IDLE_CAUSES} <= set(logged)
    assert float(logged["asteria/staleness_max"]) == records[-1].refresh.staleness_max
    assert float(logged["asteria/policy_version"]) == watch.change.version
    assert "asteria/energy_joules/model" in logged
    assert trainer.optimizers[0].runtime is None  # closed at the end of training


def test_stop_request_stops_the_trainer_after_the_step(tmp_path):
    class StopAt5(Watch):
        def on_train_start(self, trainer, pl_module):
            super().on_train_start(trainer, pl_module)
            runtime = self.runtime
            runtime.at_boundary(lambda step: step == 5 and runtime.request_stop())

    trainer, watch = fit(tmp_path, "--eval-steps", "0", watch=StopAt5())
    assert trainer.global_step == 5
    assert [r.step for r in watch.records] == [1, 2, 3, 4, 5]


def test_gradient_accumulation_gives_one_record_per_optimizer_step(tmp_path):
    trainer, watch = fit(tmp_path, "--steps", "4", "--grad-accum", "3", "--eval-steps", "0")
    assert [r.step for r in watch.records] == [1, 2, 3, 4]
    for r in watch.records:
        assert r.tokens == 3 * 4 * 64  # every micro-batch's forward, in one step
        assert math.isfinite(r.loss)
        assert set(r.timing.idle_seconds) == set(IDLE_CAUSES)


class ManualByteLM(example.ByteLM):
    """Manual optimization: training_step steps the LightningOptimizer wrapper itself."""

    def __init__(self, opts) -> None:
        super().__init__(opts)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        assert isinstance(opt, pl.core.optimizer.LightningOptimizer)
        assert opt.runtime is opt.optimizer.runtime  # the wrapper copies the attribute
        loss = self(*batch)[1]
        self.manual_backward(loss)
        opt.step()
        opt.zero_grad()
        return loss

    def configure_optimizers(self):
        return super().configure_optimizers()["optimizer"]  # no scheduler to step by hand


def test_manual_optimization_through_lightning_optimizer(tmp_path):
    trainer, watch = fit(tmp_path, "--steps", "4", "--eval-steps", "0", model_cls=ManualByteLM)
    assert [r.step for r in watch.records] == [1, 2, 3, 4]
    assert all(math.isfinite(r.loss) and r.refresh is not None for r in watch.records)


def test_energy_is_in_lightnings_logs_by_default(tmp_path):
    """The example as a user runs it, on a machine without a measured energy source: the
    modelled estimate is on by default, so Lightning's logs carry the energy figure."""
    trainer = example.main(["--steps", "4", "--eval-steps", "0", "--out", str(tmp_path)])
    assert float(trainer.logged_metrics["asteria/energy_joules/model"]) > 0
