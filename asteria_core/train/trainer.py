"""The built-in GPT trainer: a user of the public runtime API, like any other loop.

The trainer owns the model, the data, the learning-rate schedule, evaluation and checkpoints;
everything Asteria adds (refresh engine, tier store, telemetry, live policy, the step boundary)
is the `Runtime` attached to its optimizer, exactly as `asteria.optimizer()` attaches one to a
user's. `train_step()` marks the phases (data, forward, backward, optimizer) and logs the
step's figures; the boundary runs inside `optimizer.step()`.

Launched by torchrun with more than one rank, the same trainer is one rank of a data-parallel
run (`asteria_core/train/parallel.py`): DistributedDataParallel for the gradients (or FSDP2's
fully_shard, `train.data_parallel`), each rank's own batches, a checkpoint per rank at one step,
rank 0 alone writing the step records.
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
import torch.distributed as dist

from asteria_core.machine import memory_limit, memory_shortfall
from asteria_core.optim.seam import refresh_fn as default_refresh_fn
from asteria_core.policy import LivePolicy, Policy
from asteria_core.runtime.config import RefreshFn, RuntimeConfig
from asteria_core.runtime.runtime import Runtime, new_run_id
from asteria_core.telemetry.labels import IdleCause
from asteria_core.telemetry.records import StepRecord
from asteria_core.telemetry.reporter import RunReporter
from asteria_core.train import checkpoint as ckpt
from asteria_core.train import parallel
from asteria_core.train import resume as resume_choice
from asteria_core.train.config import (
    RESUME_AUTO,
    ConfigError,
    DataParallelKind,
    Device,
    RunConfig,
    parse_cpu_list,
)
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
from asteria_core.train.parallel import StopVote, job_ranks
from asteria_core.train.progress import progress_bar, progress_figures
from asteria_core.train.run_lock import RunFolderLock
from asteria_core.train.schedule import build_scheduler

log = logging.getLogger(__name__)
OptimizerFactory = Callable[[torch.nn.Module], torch.optim.Optimizer]

CheckpointSink = Callable[[int, Path], None]


def resolve_device(name: str) -> torch.device:
    if name == Device.AUTO:
        return torch.device(Device.CUDA.value if torch.cuda.is_available() else Device.CPU.value)
    if name == Device.CUDA and not torch.cuda.is_available():
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
                 optimizer_factory: OptimizerFactory | None = None,
                 refresh_fn: RefreshFn = default_refresh_fn) -> None:
        """`optimizer_factory`: builds the optimizer from the model instead of `config.optim`
        (a benchmark's peer optimizer, trained on the same model, data and schedule).
        `refresh_fn`: the refresh math (the seam; a benchmark may emulate a slower host)."""
        self.ranks = job_ranks()
        parallel.check(config, self.ranks)
        self.device = parallel.rank_device(resolve_device(config.train.device), self.ranks)
        self._owns_group = parallel.init_group(self.device, self.ranks)
        self._vote: StopVote | None = None
        self.runtime: Runtime
        """Built by `_build`: a trainer whose build failed is closed and never returned."""
        self._refresh_fn = refresh_fn
        self._folder_locks: list[RunFolderLock] = []
        """The folders this rank trains in, locked against any other process (run_lock)."""
        try:
            self._build(config, run_id, jsonl, reporter, policy, optimizer_factory)
        except BaseException:
            self.close()
            raise

    def _build(self, config: RunConfig, run_id: str | None, jsonl: bool,
               reporter: RunReporter | None, policy: LivePolicy | None,
               optimizer_factory: OptimizerFactory | None) -> None:
        ranks = self.ranks
        resume_path = self._resume_path(config)
        if ranks.parallel:  # one run: rank 0's checkpoint and id on every rank
            resume_path, run_id = parallel.share((resume_path, run_id))
        resume = None
        self.resumed: resume_choice.Choice | None = None
        """The checkpoint this run resumed, and what was passed over to get to it."""
        if resume_path is not None:  # its folder is rewritten as the checkpoint is chosen
            self._lock_folder(parallel.rank_checkpoint(Path(resume_path), ranks).parent)
            self.resumed = resume_choice.choose(Path(resume_path), ranks)
            resume = ckpt.load(self.resumed.path, verified=True)
            parallel.check_resume(resume, self.resumed.path, ranks,
                                  config.runtime.distributed_state)
            # The architecture comes from the checkpoint; the schedule and paths from `config`.
            config = dataclasses.replace(
                config, model=config_from_dict(resume["config"]).model,
                train=dataclasses.replace(config.train, resume=str(resume_path)))
            run_id = run_id or resume["run_id"]
        if run_id is None:
            run_id = parallel.share(new_run_id()) if ranks.parallel else new_run_id()
        self.config = config
        self.run_id = run_id
        self.run_dir = Path(config.train.out_dir).expanduser() / self.run_id
        self.rank_dir = parallel.rank_dir(self.run_dir, ranks)
        """Where this rank's own files go: its checkpoint and disk tier (the run folder on
        rank 0)."""
        self._lock_folder(self.rank_dir)
        if config.train.cpus:  # before any thread is started, so they inherit the CPUs
            os.sched_setaffinity(0, parse_cpu_list("train.cpus", config.train.cpus))
        elif config.train.split_cpus and ranks.parallel:
            os.sched_setaffinity(0, parallel.rank_cpus(sorted(os.sched_getaffinity(0)), ranks))
        if config.train.threads:
            torch.set_num_threads(config.train.threads)
        seed_everything(config.train.seed)  # the same initial model on every rank

        tokens = encode(load_corpus(config.data.corpus))
        train_tokens, val_tokens = split_tokens(tokens, config.data.val_fraction,
                                                config.model.block_size)
        # Each rank its own batches: one step trains world x batch_size sequences.
        self.loader = BatchLoader(train_tokens, config.model.block_size, config.data.batch_size,
                                  config.train.seed + ranks.rank)
        self.eval_batches = fixed_eval_batches(val_tokens, config.model.block_size,
                                               config.data.batch_size, config.train.eval_batches)
        ckpt.remove_leftovers(self.rank_dir)
        records = self.run_dir / "steps.jsonl"
        if resume is not None and ranks.main:
            _keep_records_until(records, int(resume["step"]))
        self.model = GPT(config.model).to(self.device)
        sharded = ranks.parallel and config.train.data_parallel == DataParallelKind.FSDP2
        if sharded:  # its parameters become this rank's shards: before the optimizer sees them
            parallel.wrap(self.model, DataParallelKind.FSDP2, self.device)
        if ranks.rank > 0:  # dropout masks of its own
            torch.manual_seed(config.train.seed + ranks.rank)
        if policy is None and resume is not None and "policy" in resume:
            policy = LivePolicy(Policy(**resume["policy"]["current"]),
                                version=resume["policy"]["version"], start_step=resume["step"])
        self.policy = policy or LivePolicy(config.policy)
        if ranks.parallel:
            self.policy.add_validator(parallel.refuse_disk_dir)
        self.optimizer = optimizer_factory(self.model) if optimizer_factory else \
            optimizer_from_config(config.optim, self.model, self.policy.current)
        self.scheduler = build_scheduler(self.optimizer, config.optim.warmup_steps,
                                         config.train.steps, config.optim.min_lr_ratio)
        if ranks.parallel:  # its gloo group before the runtime's, in one order on every rank
            self._vote = StopVote()
        self.runtime = Runtime(self.optimizer, model=self.model, config=RuntimeConfig(
            policy=self.policy, telemetry=config.telemetry, reporter=reporter,
            refresh_fn=self._refresh_fn, autopilot=config.autopilot.build(),
            run_id=self.run_id, run_dir=self.rank_dir,
            records=records if jsonl and ranks.main else None,
            optimizer_name=config.optim.name,
            start_step=int(resume["step"]) if resume is not None else 0,
            **config.runtime.options(),  # the run config's [runtime] section
            worker_cpus=parse_cpu_list("train.worker_cpus", config.train.worker_cpus)
            if config.train.worker_cpus else None))
        self._check_memory()
        self.telemetry = self.runtime.telemetry
        self.checkpoint_sinks: list[CheckpointSink] = []
        self.model_params = self.model.num_params()
        self._saved_step = -1
        """The step of this rank's newest checkpoint file (-1: none written or resumed)."""
        if resume is not None:
            self._restore(resume)
            self._saved_step = self.step
        self.net: torch.nn.Module = self.model
        """What a training step runs: the model (sharded in place under FSDP2), or its
        DistributedDataParallel wrapper."""
        if ranks.parallel and not sharded:  # broadcasts rank 0's parameters: replicas start equal
            self.net = parallel.wrap(self.model, DataParallelKind.DDP, self.device)

    def _check_memory(self) -> None:
        """Refuse, before step 1, optimizer state planned for memory (with the refresh work in
        flight) that cannot fit there next to the parameters and gradients (the cgroup would
        kill the run at its first step)."""
        tiers = self.runtime.tiers
        if tiers is None:
            return
        params = sum(p.numel() * p.element_size() for p in self.model.parameters()
                     if p.device.type == "cpu")
        in_flight = tiers.refresh_bytes()  # snapshots and results between refresh and swap
        why = memory_shortfall(tiers.memory_bytes() + in_flight, 2 * params, memory_limit(),
                               in_flight)
        if why is not None:
            self.runtime.close()
            raise ConfigError(why)

    def _resume_path(self, config: RunConfig) -> str | None:
        """The checkpoint to resume (rank 0's file in a data-parallel run): `train.resume`, or
        with "auto" the newest one in `train.out_dir` (None: there is none, start fresh)."""
        if config.train.resume != RESUME_AUTO:
            return config.train.resume or None
        if not self.ranks.main:
            return None  # rank 0's choice is shared
        found = parallel.latest_checkpoint(Path(config.train.out_dir))
        return None if found is None else str(found)

    @property
    def step(self) -> int:
        return self.runtime.step

    # ----------------------------------------------------------------------------- checkpoints
    @property
    def checkpoint_path(self) -> Path:
        """This rank's checkpoint (rank 0's is the run's, in the run folder)."""
        return self.rank_dir / ckpt.CHECKPOINT_NAME

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
            "ranks": {"rank": self.ranks.rank, "world": self.ranks.world,
                      "local_world": self.ranks.local_world},
        }

    def save_checkpoint(self, path: Path | None = None) -> Path:
        """This rank's checkpoint, the one before it kept beside it; in a data-parallel run
        every rank calls it at one step (the settle completes the transfers every rank posted,
        and the ranks agree that the state is finite). NonFiniteState, nothing written, when
        the state on some rank holds NaN or infinite values: the last good checkpoint stays."""
        path = path or self.checkpoint_path
        self.runtime.settle()  # outstanding refreshes go into the optimizer's state
        state = self.checkpoint_state()
        bad = _non_finite(state)
        if self.ranks.parallel:  # the ranks' optimizer states differ: every rank saves or none
            flag = torch.tensor([1.0 if bad else 0.0], device=self.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and not bad:
                bad = "the state of another rank"
        if bad:
            raise ckpt.NonFiniteState(
                f"step {self.step}: NaN or infinite values in {bad} (the run diverged); not "
                f"checkpointed, {path} keeps the last good state")
        ckpt.save_atomic(state, path, keep_previous=True)
        if path == self.checkpoint_path:
            self._saved_step = self.step
        for sink in self.checkpoint_sinks:
            sink(self.step, path)
        return path

    def _restore(self, state: dict) -> None:
        ckpt.restore_module(self.model, state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.loader.load_state_dict(state["data"])
        missing = ckpt.set_rng_state(state["rng"])
        if missing:  # the run goes on; its random draws on those devices are not the saved ones
            log.warning("train.resume: %s", missing)
        self.runtime.step = int(state["step"])

    def close(self) -> None:
        """Release workers, files and meters held by the run, and the process group the trainer
        created; the trainer can not train after."""
        try:
            runtime = getattr(self, "runtime", None)  # absent when the build failed before it
            if runtime is not None:
                runtime.close()
        finally:
            self._release()

    def _release(self) -> None:
        try:
            if self._vote is not None:
                self._vote.close()
                self._vote = None
        finally:
            while self._folder_locks:
                self._folder_locks.pop().release()
            if self._owns_group and dist.is_initialized():
                self._owns_group = False
                dist.destroy_process_group()

    def _lock_folder(self, folder: Path) -> None:
        """Each rank locks the folder it writes (its rank folder; rank 0's is the run folder,
        the one the control plane locks): every rank of a second job on these folders is
        refused alike, before any collective that would wait for a refused rank."""
        self._folder_locks.append(RunFolderLock(folder))

    # ----------------------------------------------------------------------------- the loop
    def request_stop(self) -> None:
        """Ask the loop to stop at the next step boundary (thread-safe: a flag)."""
        self.runtime.request_stop()

    @torch.no_grad()
    def evaluate(self) -> float:
        """The mean loss over the validation batches; in a data-parallel run each rank takes
        every world-th batch and the sums are all-reduced, so every rank gets the same value."""
        ranks = self.ranks
        self.model.eval()
        losses = []
        lockstep = self.config.train.data_parallel == DataParallelKind.FSDP2
        for (x, y), counts in parallel.eval_share(self.eval_batches, ranks, lockstep):
            with self._autocast():
                _, loss = self.model(x.to(self.device), y.to(self.device))
            if counts:
                losses.append(loss.float())
        self.model.train()
        if ranks.parallel:
            total = torch.stack(losses).sum() if losses else torch.zeros((), device=self.device)
            return parallel.all_reduce_mean(total, len(losses), self.device)
        return torch.stack(losses).mean().item()  # sync point: once per evaluation

    def _autocast(self) -> torch.autocast:
        enabled = self.device.type == "cuda" and self.config.train.autocast_bf16
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16,
                              enabled=enabled)

    def train_step(self) -> StepRecord | None:
        """One step; its record stays open for the evaluation until `runtime.end_step()`."""
        rt, cfg = self.runtime, self.config
        with rt.phase("data"):
            with rt.wait(IdleCause.DATA_WAIT):
                x, y = self.loader.next_batch()
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
        with rt.phase("forward"), self._autocast():
            _, loss = self.net(x, y)
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

    def _stopping(self) -> bool:
        """A stop was asked; in a data-parallel run, on some rank, agreed on every rank."""
        wish = self.runtime.stop_requested
        return wish if self._vote is None else self._vote.agreed(wish)

    def _due_eval(self) -> bool:
        return self.step % self.config.train.eval_interval == 0 or \
            self.step == self.config.train.steps

    def train(self, *, stop_at: int | None = None, progress: bool = True) -> TrainResult:
        """Train until `train.steps` (or `stop_at`, or a stop request); checkpoint at the end."""
        cfg = self.config.train
        last = min(cfg.steps, stop_at) if stop_at is not None else cfg.steps
        result = TrainResult(run_dir=self.run_dir, step=self.step)
        bar = progress_bar(self.step, cfg.steps) if progress and self.ranks.main else None
        ended_at_a_boundary = False
        try:
            while self.step < last and not self._stopping():
                self.train_step()
                if self._due_eval():
                    eval_loss = self.evaluate()
                    self.runtime.log(eval_loss=eval_loss)
                    result.eval_losses[self.step] = eval_loss
                record = self.runtime.end_step()  # telemetry, listeners, between-steps hooks
                # The step just taken opened its record and logged its loss.
                assert record is not None and record.loss is not None
                result.train_losses.append(record.loss)
                if cfg.checkpoint_interval and self.step % cfg.checkpoint_interval == 0:
                    self.save_checkpoint()
                _update_bar(bar, record, cfg.log_interval, self.ranks.world)
            ended_at_a_boundary = True
        finally:
            if bar is not None:
                bar.close()
        # Only a loop that ended where every rank ends (its last step, or a stop all agreed on)
        # saves: after an error the step may be half done, and in a data-parallel run the
        # others may never reach it; the last checkpoint is the one to resume.
        if ended_at_a_boundary and self._saved_step != self.step:  # not twice: prev stays older
            self.save_checkpoint()
        result.step = self.step
        result.stopped_early = self.step < cfg.steps
        return result


def _non_finite(state: dict) -> str | None:
    """Which part of a checkpoint's state holds a NaN or an infinite value (None: none)."""
    for part, name in (("model", "the model's parameters"), ("optimizer", "the optimizer's state")):
        for t in ckpt.tensors(state[part]):
            if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all()):
                return name
    return None


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


def _update_bar(bar, record: StepRecord, every: int, world: int = 1) -> None:
    """Rank 0's loss; the job's tokens per second (every rank trains as many as rank 0)."""
    if bar is None:
        return
    bar.update(1)
    if record.step % every == 0 or record.eval_loss is not None:
        bar.set_postfix(progress_figures(record.loss, record.tokens * world, record.step_seconds,
                                         record.eval_loss), refresh=False)
