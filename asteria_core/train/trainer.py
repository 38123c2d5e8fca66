"""The built-in GPT trainer: a user of the public runtime API, like any other loop.

The trainer owns the model, the data, the learning-rate schedule, evaluation and checkpoints;
everything Asteria adds (refresh engine, tier store, telemetry, live policy, the step boundary)
is the `Runtime` attached to its optimizer, exactly as `asteria.optimizer()` attaches one to a
user's. `train_step()` marks the phases (data, forward, backward, optimizer) and logs the
step's figures; the boundary runs inside `optimizer.step()`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from asteria_core.policy import LivePolicy, Policy
from asteria_core.runtime.runtime import Runtime, new_run_id
from asteria_core.telemetry.records import StepRecord
from asteria_core.telemetry.reporter import RunReporter
from asteria_core.tiers import TierFileError
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
from asteria_core.train.optimizers import optimizer_from_config
from asteria_core.train.progress import progress_bar, progress_figures
from asteria_core.train.schedule import build_scheduler

log = logging.getLogger(__name__)

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
                 policy: LivePolicy | None = None,
                 optimizer_factory: Callable[[torch.nn.Module], torch.optim.Optimizer] | None = None
                 ) -> None:
        """`optimizer_factory`: builds the optimizer from the model instead of `config.optim`
        (a benchmark's peer optimizer, trained on the same model, data and schedule)."""
        resume = ckpt.load(config.train.resume) if config.train.resume else None
        if resume is not None:
            # The architecture comes from the checkpoint; the schedule and paths from `config`.
            config = dataclasses.replace(config, model=config_from_dict(resume["config"]).model)
            run_id = run_id or resume["run_id"]
        self.config = config
        self.run_id = run_id or new_run_id()
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
        ckpt.remove_leftovers(self.run_dir)
        records = self.run_dir / "steps.jsonl"
        if resume is not None:
            _keep_records_until(records, int(resume["step"]))
        self.model = GPT(config.model).to(self.device)
        if policy is None and resume is not None and "policy" in resume:
            policy = LivePolicy(Policy(**resume["policy"]["current"]),
                                version=resume["policy"]["version"], start_step=resume["step"])
        self.policy = policy or LivePolicy(config.policy)
        self.optimizer = optimizer_factory(self.model) if optimizer_factory else \
            optimizer_from_config(config.optim, self.model, self.policy.current)
        self.scheduler = build_scheduler(self.optimizer, config.optim.warmup_steps,
                                         config.train.steps, config.optim.min_lr_ratio)
        self.runtime = Runtime(
            self.optimizer, model=self.model, policy=self.policy, telemetry=config.telemetry,
            reporter=reporter, run_id=self.run_id, run_dir=self.run_dir,
            records=records if jsonl else None,
            optimizer_name=config.optim.name)
        self.telemetry = self.runtime.telemetry
        self.checkpoint_sinks: list[CheckpointSink] = []
        self.model_params = self.model.num_params()
        if resume is not None:
            self._restore(resume)

    @property
    def step(self) -> int:
        return self.runtime.step

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
            "policy": self.runtime.state_dict()["policy"],
        }

    def save_checkpoint(self, path: Path | None = None) -> Path:
        path = path or self.run_dir / ckpt.CHECKPOINT_NAME
        self.runtime.settle()  # outstanding refreshes go into the optimizer's state
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
        self.runtime.step = int(state["step"])

    def close(self) -> None:
        """Release workers, files and meters held by the run; the trainer can not train after."""
        self.runtime.close()

    # ----------------------------------------------------------------------------- the loop
    def request_stop(self) -> None:
        """Ask the loop to stop at the next step boundary (thread-safe: a flag)."""
        self.runtime.request_stop()

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
        """One step; its record stays open for the evaluation until `runtime.end_step()`."""
        rt, cfg = self.runtime, self.config
        with rt.phase("data"):
            with rt.wait("data_wait"):
                x, y = self.loader.next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with rt.phase("forward"), self._autocast():
            _, loss = self.model(x, y)
        with rt.phase("backward"):
            loss.backward()
        with rt.phase("optimizer"):
            if cfg.optim.grad_clip > 0:
                rt.log(grad_norm=torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                                cfg.optim.grad_clip))
            rt.log(loss=loss, tokens=x.numel())
            self.optimizer.step()  # the step boundary runs inside
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return rt.last_record

    def _due_eval(self) -> bool:
        return self.step % self.config.train.eval_interval == 0 or \
            self.step == self.config.train.steps

    def train(self, *, stop_at: int | None = None, progress: bool = True) -> TrainResult:
        """Train until `train.steps` (or `stop_at`, or a stop request); checkpoint at the end."""
        cfg = self.config.train
        last = min(cfg.steps, stop_at) if stop_at is not None else cfg.steps
        result = TrainResult(run_dir=self.run_dir, step=self.step)
        bar = progress_bar(self.step, cfg.steps) if progress else None
        state_ok = True
        try:
            while self.step < last and not self.runtime.stop_requested:
                self.train_step()
                if self._due_eval():
                    eval_loss = self.evaluate()
                    self.runtime.log(eval_loss=eval_loss)
                    result.eval_losses[self.step] = eval_loss
                record = self.runtime.end_step()  # telemetry, listeners, between-steps hooks
                result.train_losses.append(record.loss)
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


def _keep_records_until(path: Path, step: int) -> None:
    """A resumed run trains the steps after its checkpoint again: their old records (written
    before a crash) go, and so does a line the crash cut short, so the file has each step once."""
    if not path.is_file():
        return
    kept = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                if line.endswith("\n") and json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def _update_bar(bar, record: StepRecord, every: int) -> None:
    if bar is None:
        return
    bar.update(1)
    if record.step % every == 0 or record.eval_loss is not None:
        bar.set_postfix(progress_figures(record.loss, record.tokens, record.step_seconds,
                                         record.eval_loss), refresh=False)
