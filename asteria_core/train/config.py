"""Run configuration: typed dataclasses, validated at construction.

A run is described by one `RunConfig` made of one config per component. Every field
validates itself in `__post_init__` and raises `ConfigError` naming the field, the bad
value and what is allowed, so a bad config fails before any training starts.
Loading from TOML/YAML files and `--section.key value` overrides lives in `config_io.py`.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from asteria_core.autopilot.config import Mode
from asteria_core.autopilot.section import AutopilotSection
from asteria_core.compat import Choice
from asteria_core.fields import Kind, choice, setting
from asteria_core.machine import MACHINE
from asteria_core.optim.muon import MuonScale
from asteria_core.optim.registry import OptimizerName, spec_of
from asteria_core.optim.seam import BASIS_REFRESHES, MomentSwap, RefreshMethod
from asteria_core.policy import OffloadMode, Policy
from asteria_core.runtime.section import RuntimeSection
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.validation import ConfigError, check, check_settings

MAX_STEPS = 10**9
"""Steps and step intervals: far beyond any run, and well inside the run store's integers."""
PATH_CHARS = 4096
"""The longest path a config names (Linux's PATH_MAX)."""
CPU_LIST_CHARS = 1024
CPU_LIST_RULE = "a CPU list such as '0' or '0-3,6' of CPUs this machine has, or empty"
# The corpora built in beside the default (asteria_core/train/data.py's NAMED_CORPORA): a name
# here is taken where no such path exists.
BUILTIN_CORPORA = ("python-source",)
CORPUS_BYTES_PER_BYTE = 12
"""Peak memory per corpus byte while it becomes tokens (text, its UTF-8 bytes, int64 ids)."""


def max_corpus_bytes() -> int:
    """The largest corpus read into memory: its tokens must fit in the memory budget."""
    return MACHINE.memory_budget // CORPUS_BYTES_PER_BYTE


def parse_cpu_list(key: str, text: str) -> frozenset[int]:
    """A Linux CPU list such as "0-3,6" as a set of CPU ids; ConfigError naming `key` if bad."""
    cpus: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        check(match is not None, key, text, CPU_LIST_RULE)
        assert match is not None  # check() raised otherwise
        first, last = int(match[1]), int(match[2] or match[1])
        check(first <= last < (os.cpu_count() or 1), key, text, CPU_LIST_RULE)
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Decoder-only GPT (pre-LayerNorm). The default is about 1M parameters."""

    # Each size on its own; together with the batch they must fit the memory (RunConfig).
    n_layer: int = setting(5, Kind.INT, "Transformer blocks.", minimum=1, maximum=1024)
    n_head: int = setting(4, Kind.INT, "Attention heads; must divide n_embd.", minimum=1,
                          maximum=1024)
    n_embd: int = setting(128, Kind.INT, "Width of the residual stream.", minimum=1,
                          maximum=65536)
    block_size: int = setting(128, Kind.INT, "Context length in tokens (bytes).", minimum=1,
                              maximum=65536)
    vocab_size: int = setting(256, Kind.INT,
                              "Byte-level vocabulary: 256 for the built-in tokenizer.",
                              minimum=256, maximum=1 << 20)  # at least the bytes
    dropout: float = setting(0.0, Kind.FLOAT, "Dropout probability in attention and MLP.",
                             minimum=0.0, maximum=1.0, hi_open=True)
    bias: bool = setting(False, Kind.BOOL, "Bias terms in Linear and LayerNorm layers.")
    tie_weights: bool = setting(True, Kind.BOOL, "Share the token embedding with the output head.")

    def __post_init__(self) -> None:
        check_settings(self, "model")
        check(self.n_embd % self.n_head == 0, "model.n_head", self.n_head,
               f"a divisor of model.n_embd ({self.n_embd})")


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    """Optimizer and learning-rate schedule. Second-order fields are ignored by AdamW and Muon."""

    name: OptimizerName = choice(OptimizerName.ADAMW, "The optimizer.")
    lr: float = setting(3e-3, Kind.FLOAT, "Peak learning rate.", minimum=0.0, maximum=10.0,
                        lo_open=True)
    betas: tuple[float, float] = setting((0.9, 0.95), Kind.FLOAT_PAIR,
                                         "First and second moment decay rates.", minimum=0.0,
                                         maximum=1.0, hi_open=True)
    eps: float = setting(1e-8, Kind.FLOAT, "Denominator epsilon.", minimum=0.0, maximum=1.0,
                         lo_open=True)
    weight_decay: float = setting(
        0.1, Kind.FLOAT, "Decoupled weight decay, applied to matrices only (not to gains, "
        "biases).", minimum=0.0, maximum=10.0)
    grad_clip: float = setting(
        1.0, Kind.FLOAT, "Clip the global gradient norm to this value; 0 disables clipping.",
        minimum=0.0, maximum=1e6)
    warmup_steps: int = setting(50, Kind.INT, "Linear warmup from 0 to lr over this many steps.",
                                minimum=0, maximum=MAX_STEPS)
    min_lr_ratio: float = setting(
        0.1, Kind.FLOAT, "Cosine decay ends at lr * min_lr_ratio at the last step.",
        minimum=0.0, maximum=1.0)
    shampoo_beta: float = setting(
        -1.0, Kind.FLOAT, "Factor EMA decay; -1 means use betas[1] (the SOAP reference's rule).",
        minimum=0.0, maximum=1.0, hi_open=True, also=(-1.0,),
        words="-1 (use betas[1]) or a number in [0, 1)")
    max_precond_dim: int = setting(
        10000, Kind.INT, "Dimensions larger than this are not preconditioned (identity), as in "
        "the SOAP reference.", minimum=1, maximum=65536)
    precond_block_size: int = setting(
        1024, Kind.INT, "Largest factor side; larger dimensions are split into blocks of this "
        "size.", minimum=1, maximum=65536)
    refresh_method: RefreshMethod = setting(
        RefreshMethod.POWER_QR, Kind.CHOICE, "SOAP/KL-Shampoo basis refresh: power_qr (the "
        "references: one power step + QR) | eigh.",
        choices=tuple(m.value for m in BASIS_REFRESHES), enum=RefreshMethod)
    moment_swap: MomentSwap = choice(
        MomentSwap.REFERENCE, "Second moment at a basis swap: reference (permute, as SOAP does) "
        "| transport.")
    muon_scale: MuonScale = choice(
        MuonScale.ORIGINAL, "Muon only: its shape scaling: original (sqrt(max(1, rows/cols)), the "
        "reference's and torch's default) | match_rms_adamw (0.2 sqrt(max(rows, cols)): AdamW's "
        "lr carries over).")
    pack_factors: bool = setting(
        False, Kind.BOOL, "SOAP only: keep each factor block's upper triangle only, b (b + 1) / 2 "
        "values (about half the factor memory, as Distributed Shampoo keeps them).")
    adamw_lr: float = setting(
        -1.0, Kind.FLOAT, "Muon only: peak lr of what AdamW steps (embeddings, head, gains, "
        "biases); -1 means optim.lr.", minimum=0.0, maximum=10.0, lo_open=True, also=(-1.0,),
        words="-1 (use optim.lr) or a number in (0, 10]")

    def __post_init__(self) -> None:
        check_settings(self, "optim")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Corpus and batches. The embedded default needs no network."""

    corpus: str = setting(
        "", Kind.STR, "A text file or a folder of text files; empty means the embedded default "
        "corpus (the English documentation text that ships inside CPython: pydoc_data.topics); "
        '"python-source" is the second built-in one (15 CPython stdlib modules\' source).',
        max_length=PATH_CHARS, words="an existing text file or folder, empty for the embedded "
        f"corpus, or a built-in one: {', '.join(BUILTIN_CORPORA)} (at most {PATH_CHARS} "
        "characters)")
    val_fraction: float = setting(
        0.1, Kind.FLOAT, "Share of the corpus held out for validation (the tail, so the split is "
        "deterministic).", minimum=0.0, maximum=0.5, lo_open=True)
    batch_size: int = setting(16, Kind.INT, "Sequences per step.", minimum=1, maximum=65536)

    def __post_init__(self) -> None:
        check_settings(self, "data")
        if self.corpus and self.corpus not in BUILTIN_CORPORA and \
                not Path(self.corpus).expanduser().exists():
            raise ConfigError(f"data.corpus: path {self.corpus!r} does not exist; allowed: an "
                              "existing text file or folder, empty for the embedded corpus, or "
                              f"a built-in one: {', '.join(BUILTIN_CORPORA)}")
        root = Path(self.corpus).expanduser()
        if self.corpus and root.is_file() and root.stat().st_size > max_corpus_bytes():
            raise ConfigError(f"data.corpus: {self.corpus!r} has {root.stat().st_size} bytes; "
                              f"allowed: at most {max_corpus_bytes()} on this machine "
                              f"({MACHINE.describe()})")


class Device(Choice):
    """train.device."""

    AUTO = "auto"  # CUDA where there is one, else the CPU
    CPU = "cpu"
    CUDA = "cuda"


class DataParallelKind(Choice):
    """train.data_parallel: how a torchrun job's ranks hold the model."""

    DDP = "ddp"  # DistributedDataParallel: every rank a whole replica, gradients all-reduced
    FSDP2 = "fsdp2"  # torch's fully_shard: each rank holds a dim-0 shard of every parameter


RESUME_AUTO = "auto"
"""train.resume's word for "the newest checkpoint in out_dir, else a fresh start"."""


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """The schedule of one run: steps, evaluation, checkpoints, seeds, device."""

    steps: int = setting(500, Kind.INT, "Optimizer steps in the run.", minimum=1,
                         maximum=MAX_STEPS)
    eval_interval: int = setting(
        100, Kind.INT, "Evaluate validation loss every this many steps (and at the last step).",
        minimum=1, maximum=MAX_STEPS)
    eval_batches: int = setting(20, Kind.INT, "Validation batches per evaluation.", minimum=1,
                                maximum=100_000)
    log_interval: int = setting(10, Kind.INT, "Refresh the progress line every this many steps.",
                                minimum=1, maximum=MAX_STEPS)
    seed: int = setting(1337, Kind.INT, "Seeds torch, Python and the data order.", minimum=0,
                        maximum=2**32 - 1)  # numpy seeds are 32-bit
    device: Device = choice(Device.AUTO, "auto (CUDA when present) | cpu | cuda.")
    autocast_bf16: bool = setting(True, Kind.BOOL, "bf16 autocast on CUDA; ignored on CPU.")
    out_dir: str = setting(
        "runs", Kind.STR, "Folder for checkpoints and step records (a sub-folder per run).",
        max_length=PATH_CHARS)
    checkpoint_interval: int = setting(
        0, Kind.INT, "Write a checkpoint every this many steps; 0 means only at the end.",
        minimum=0, maximum=MAX_STEPS)
    resume: str = setting(
        "", Kind.STR, "Path of a checkpoint to resume from (in a data-parallel run rank 0's, in "
        'the run folder: rank r reads rank<r>/ beside it); "auto": the newest checkpoint in '
        "out_dir, so launching the same command again resumes (a fresh start when there is "
        "none); empty starts fresh.", max_length=PATH_CHARS,
        words=f"an existing checkpoint file, auto, or empty (at most {PATH_CHARS} characters)")
    threads: int = setting(0, Kind.INT, "torch intra-op threads for training; 0 keeps torch's "
                           "default.", minimum=0, maximum=MACHINE.max_threads)
    cpus: str = setting(
        "", Kind.STR, 'CPUs the training thread runs on, as a Linux CPU list ("0-3,6"); threads '
        "it starts later (intra-op pool, refresh workers) inherit them. Empty lets the OS "
        "schedule it anywhere. Pinning keeps the control plane's threads off the training "
        "cores. Linux only.", max_length=CPU_LIST_CHARS, words=CPU_LIST_RULE)
    data_parallel: DataParallelKind = choice(
        DataParallelKind.DDP, "Data-parallel runs (torchrun): ddp (DistributedDataParallel: "
        "every rank holds the whole model) | fsdp2 (torch's fully_shard, each transformer block "
        "a unit: each rank holds and preconditions a dim-0 shard of every parameter; "
        "runtime.distributed_state replicated).")
    split_cpus: bool = setting(
        False, Kind.BOOL, "Data-parallel runs: each rank of a node trains, and refreshes, on "
        "its own equal share of the CPUs the job may use (rank r on the r-th share; one CPU "
        "each where there are fewer CPUs than ranks), so its ranks do not contend for cores. "
        "Linux only.")
    worker_cpus: str = setting(
        "", Kind.STR, "CPUs the refresh workers run on (threads, processes and their helper "
        'threads), as a Linux CPU list ("2-7"): on a GPU host, the cores that do not feed the '
        "device. Empty: those of the training thread (`train.cpus`). Linux only.",
        max_length=CPU_LIST_CHARS, words=CPU_LIST_RULE)

    def __post_init__(self) -> None:
        check_settings(self, "train")
        for key in ("cpus", "worker_cpus"):
            if getattr(self, key):
                check(sys.platform.startswith("linux"), f"train.{key}", getattr(self, key),
                      "empty on this platform (pinning needs Linux)")
                parse_cpu_list(f"train.{key}", getattr(self, key))
        if self.split_cpus:
            check(sys.platform.startswith("linux"), "train.split_cpus", True,
                  "false on this platform (pinning needs Linux)")
        if self.resume and self.resume != RESUME_AUTO and \
                not Path(self.resume).expanduser().is_file():
            raise ConfigError(f"train.resume: checkpoint {self.resume!r} does not exist; "
                              "allowed: an existing checkpoint file, auto, or empty")


@dataclass(kw_only=True, slots=True)
class RunConfig:
    """Everything one training run needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    policy: Policy = field(default_factory=Policy)
    """The live policy a run starts with (refresh interval, staleness bound, workers, ...)."""
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    autopilot: AutopilotSection = field(default_factory=AutopilotSection)
    """The autopilot the run starts with (off unless set; second-order optimizers)."""
    runtime: RuntimeSection = field(default_factory=RuntimeSection)
    """How a data-parallel run keeps and updates the optimizer state (replicated or sharded)."""

    def __post_init__(self) -> None:
        if self.autopilot.mode != Mode.OFF and not spec_of(self.optim.name).second_order:
            raise ConfigError(f"autopilot.mode: got {self.autopilot.mode!r} with optim.name "
                              f"{self.optim.name!r}; allowed: off (a first-order optimizer has "
                              "no refresh policy to tune)")
        # A second-order optimizer's state has a home tier: with a disk tier its moments may
        # all live on disk, and the trainer checks what the tier plan keeps in memory
        # (Trainer._check_memory). AdamW's moments stay in memory.
        tiered = spec_of(self.optim.name).second_order and \
            self.policy.offload_mode in (OffloadMode.DISK, OffloadMode.AUTO)
        need = minimum_bytes(self.model, self.data.batch_size, moments=not tiered)
        if need > MACHINE.memory_bytes:
            held = "weights and gradients" if tiered else "weights, gradients and moments"
            raise ConfigError(
                f"model: got a model and batch that need at least {need / 2**30:.1f} GiB "
                f"({held} of {parameters(self.model):,} parameters, "
                f"activations of {self.data.batch_size} x {self.model.block_size} tokens); "
                f"allowed: what fits in this machine's memory ({MACHINE.describe()})")


def parameters(model: ModelConfig) -> int:
    """The GPT's parameter count, from its sizes (biases and gains left out)."""
    d = model.n_embd
    head = 0 if model.tie_weights else model.vocab_size * d
    return model.n_layer * 12 * d * d + (model.vocab_size + model.block_size) * d + head


def minimum_bytes(model: ModelConfig, batch_size: int, moments: bool = True) -> int:
    """A lower estimate of the memory a run needs: fp32 weights and gradients (8 bytes per
    parameter), two moments unless the optimizer's state may leave memory (8 more), and the
    activations kept for backward (about 34 bytes per token, layer and unit of width, plus the
    logits)."""
    tokens = batch_size * model.block_size
    activations = tokens * (34 * model.n_layer * model.n_embd + 12 * model.vocab_size)
    return (16 if moments else 8) * parameters(model) + activations
