"""The training loop: `Trainer.train()` owns the schedule, `train_step()` owns one step.

A step runs in named phases (data, forward, backward, optimizer, boundary), each timed by
`PhaseTimer`, and ends in a `StepRecord` handed to every registered record sink. The step
boundary is where the rest of the runtime plugs in: `boundary_hooks` run there, once per step,
after the optimizer update and before the record is emitted.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from asteria_core.optim.base import BlockPreconditioner
from asteria_core.policy import LivePolicy, Policy
from asteria_core.refresh import RefreshEngine
from asteria_core.telemetry.reporter import NullReporter, RunReporter, make_reporter
from asteria_core.tiers import TierFileError, TierStore
from asteria_core.train import checkpoint as ckpt
from asteria_core.train.config import RunConfig, parse_cpu_list
from asteria_core.train.config_io import config_from_dict, config_to_dict
from asteria_core.train.data import (
    BatchLoader,
    encode,
    fixed_eval_batches,
    load_corpus,
    split_tokens,
)
from asteria_core.train.model import GPT
from asteria_core.train.optimizers import build_optimizer
from asteria_core.train.records import JsonlWriter, StepRecord
from asteria_core.train.schedule import build_scheduler
from asteria_core.train.timing import PhaseTimer

log = logging.getLogger(__name__)

RecordSink = Callable[[StepRecord], None]
BoundaryHook = Callable[[int], None]
CheckpointSink = Callable[[int, Path], None]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("train.device: got 'cuda' but no CUDA device is available; "
                         "allowed here: auto | cpu")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    train_losses: list[float] = field(default_factory=list)
    eval_losses: dict[int, float] = field(default_factory=dict)
    stopped_early: bool = False


class Trainer:
    """Builds a run from a `RunConfig` (or resumes one from its checkpoint) and trains it."""

    def __init__(self, config: RunConfig, *, run_id: str | None = None,
                 jsonl: bool = True, reporter: RunReporter | None = None,
                 policy: LivePolicy | None = None) -> None:
        resume = ckpt.load(config.train.resume) if config.train.resume else None
        if resume is not None:
            # The architecture comes from the checkpoint; the schedule and paths from `config`.
            config = dataclasses.replace(config, model=config_from_dict(resume["config"]).model)
            run_id = run_id or resume["run_id"]
        self.config = config
        self.run_id = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.run_dir = Path(config.train.out_dir).expanduser() / self.run_id
        self.device = resolve_device(config.train.device)
        if config.train.cpus:  # before any thread is started, so they inherit the CPUs
            os.sched_setaffinity(0, parse_cpu_list("train.cpus", config.train.cpus))
        if config.train.threads:
            torch.set_num_threads(config.train.threads)
        seed_everything(config.train.seed)

        tokens = encode(load_corpus(config.data.corpus))
        train_tokens, val_tokens = split_tokens(tokens, config.data.val_fraction,
                                                config.model.block_size)
        self.loader = BatchLoader(train_tokens, config.model.block_size, config.data.batch_size,
                                  config.train.seed)
        self.eval_batches = fixed_eval_batches(val_tokens, config.model.block_size,
                                               config.data.batch_size, config.train.eval_batches)
        self.model = GPT(config.model).to(self.device)
        if policy is None and resume is not None and "policy" in resume:
            policy = LivePolicy(Policy(**resume["policy"]["current"]),
                                version=resume["policy"]["version"], start_step=resume["step"])
        self.policy = policy or LivePolicy(config.policy)
        self.optimizer = build_optimizer(config.optim, self.model, self.policy.current)
        self.scheduler = build_scheduler(self.optimizer, config.optim.warmup_steps,
                                         config.train.steps, config.optim.min_lr_ratio)
        self.timer = PhaseTimer(self.device)
        self.step = 0
        self.record_sinks: list[RecordSink] = []
        self.boundary_hooks: list[BoundaryHook] = []
        # Parts that wait or report (refresh, tiers, distributed) get `self.reporter`;
        # `self.telemetry` is the same object when it exports metrics, None when telemetry is off.
        self.reporter: RunReporter = (reporter if reporter is not None
                                      else make_reporter(config.telemetry))
        self.telemetry = None if isinstance(self.reporter, NullReporter) else self.reporter
        self.reporter.attach(self)
        self.reporter.set_policy_version(self.policy.version)
        # Second-order optimizers refresh off the critical path, steered by the live policy.
        self.refresh: RefreshEngine | None = None
        if isinstance(self.optimizer, BlockPreconditioner):
            self.refresh = RefreshEngine(self.optimizer, self.policy, self.reporter)
        # Their state has a home tier under the policy's budgets, prefetched as forward starts.
        self.tiers: TierStore | None = None
        if isinstance(self.optimizer, BlockPreconditioner):
            self.tiers = TierStore(self.optimizer, self.policy, self.run_dir, self.reporter)
            self.model.register_forward_pre_hook(lambda module, args: self.tiers.announce())
        # Run between steps, outside any step's timing: commands such as pause or checkpoint.
        self.between_steps_hooks: list[BoundaryHook] = []
        self.checkpoint_sinks: list[CheckpointSink] = []
        self._stop_requested = False
        self._jsonl = JsonlWriter(self.run_dir / "steps.jsonl") if jsonl else None
        if self._jsonl is not None:
            self.record_sinks.append(self._jsonl)
        self.model_params = self.model.num_params()
        if resume is not None:
            self._restore(resume)

    # ----------------------------------------------------------------------------- checkpoints
    def checkpoint_state(self) -> dict:
        return {
            "format_version": ckpt.FORMAT_VERSION,
            "run_id": self.run_id,
            "step": self.step,
            "config": config_to_dict(self.config),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "data": self.loader.state_dict(),
            "rng": ckpt.rng_state(),
            "policy": {"current": self.policy.current.to_dict(), "version": self.policy.version},
        }

    def save_checkpoint(self, path: Path | None = None) -> Path:
        path = path or self.run_dir / ckpt.CHECKPOINT_NAME
        if self.refresh is not None:
            self.refresh.settle()  # outstanding refreshes go into the optimizer's state
        ckpt.save_atomic(self.checkpoint_state(), path)
        for sink in self.checkpoint_sinks:
            sink(self.step, path)
        return path

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.loader.load_state_dict(state["data"])
        ckpt.set_rng_state(state["rng"])
        self.step = int(state["step"])

    def close(self) -> None:
        """Release files and meters held by the run; the trainer can not train after this."""
        if self.refresh is not None:
            self.refresh.close()
        if self.tiers is not None:
            self.tiers.close()
        self.reporter.close()
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None

    # ----------------------------------------------------------------------------- the loop
    def request_stop(self) -> None:
        """Ask the loop to stop at the next step boundary (thread-safe: a flag)."""
        self._stop_requested = True

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        losses = []
        for x, y in self.eval_batches:
            with self._autocast():
                _, loss = self.model(x.to(self.device), y.to(self.device))
            losses.append(loss)
        self.model.train()
        return torch.stack(losses).mean().item()  # sync point: once per evaluation

    def _autocast(self) -> torch.autocast:
        enabled = self.device.type == "cuda" and self.config.train.autocast_bf16
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16,
                              enabled=enabled)

    def train_step(self) -> StepRecord:
        timer, cfg = self.timer, self.config
        timer.start_step()
        lr = self.scheduler.get_last_lr()[0]
        with timer.phase("data"):
            with self.reporter.wait("data_wait"):
                x, y = self.loader.next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with timer.phase("forward"), self._autocast():
            _, loss = self.model(x, y)
        with timer.phase("backward"):
            loss.backward()
        with timer.phase("optimizer"):
            grad_norm = None
            if cfg.optim.grad_clip > 0:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                           cfg.optim.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.scheduler.step()
        self.step += 1
        with timer.phase("boundary"):
            version_in_step = self.policy.version
            if self.policy.apply_pending(self.step):
                self.reporter.set_policy_version(self.policy.version)
            if self.tiers is not None:
                self.tiers.on_boundary(self.step)  # migrates after a budget change
            if self.refresh is not None:
                self.refresh.on_boundary(self.step)
            for hook in self.boundary_hooks:
                hook(self.step)
        phases, wall = timer.finish()
        extra = {"policy_version": version_in_step}
        if self.refresh is not None:
            extra.update(self.refresh.last)
        return StepRecord(
            step=self.step, time=time.time(), loss=loss.item(),  # sync point: per-step record
            lr=lr, tokens=x.numel(), step_seconds=wall, phase_seconds=phases,
            grad_norm=None if grad_norm is None else grad_norm.item(), extra=extra,
        )

    def _due_eval(self) -> bool:
        return self.step % self.config.train.eval_interval == 0 or \
            self.step == self.config.train.steps

    def train(self, *, stop_at: int | None = None, progress: bool = True) -> TrainResult:
        """Train until `train.steps` (or `stop_at`, or a stop request); checkpoint at the end."""
        cfg = self.config.train
        last = min(cfg.steps, stop_at) if stop_at is not None else cfg.steps
        result = TrainResult(run_dir=self.run_dir, step=self.step)
        bar = _progress_bar(self.step, cfg.steps, enabled=progress)
        state_ok = True
        try:
            while self.step < last:
                for hook in self.between_steps_hooks:
                    hook(self.step)
                if self._stop_requested:
                    break
                record = self.train_step()
                if self._due_eval():
                    record.eval_loss = self.evaluate()
                    result.eval_losses[record.step] = record.eval_loss
                result.train_losses.append(record.loss)
                for sink in self.record_sinks:
                    sink(record)
                if cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0:
                    self.save_checkpoint()
                _update_bar(bar, record, cfg.log_interval)
        except TierFileError:
            state_ok = False  # the step stopped halfway: keep the last good checkpoint
            raise
        finally:
            if bar is not None:
                bar.close()
            if state_ok:
                self.save_checkpoint()
        result.step = self.step
        result.stopped_early = self.step < cfg.steps
        return result


def _progress_bar(start: int, total: int, *, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=start, unit="step", dynamic_ncols=True)


def _update_bar(bar, record: StepRecord, every: int) -> None:
    if bar is None:
        return
    bar.update(1)
    if record.step % every == 0 or record.eval_loss is not None:
        post = {"loss": f"{record.loss:.4f}", "tok/s": f"{record.tokens_per_second:,.0f}",
                "step_ms": f"{record.step_seconds * 1e3:.1f}"}
        if record.eval_loss is not None:
            post["val"] = f"{record.eval_loss:.4f}"
        bar.set_postfix(post, refresh=False)
