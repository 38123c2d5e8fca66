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
from enum import StrEnum
from pathlib import Path
from typing import ClassVar

from asteria_core.machine import MACHINE
from asteria_core.optim.registry import OPTIMIZERS, spec_of
from asteria_core.optim.seam import BASIS_REFRESHES, MomentSwap
from asteria_core.policy import OffloadMode, Policy
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.validation import ConfigError, check, finite_in, int_in, one_of

MAX_STEPS = 10**9
"""Steps and step intervals: far beyond any run, and well inside the run store's integers."""
CORPUS_BYTES_PER_BYTE = 12
"""Peak memory per corpus byte while it becomes tokens (text, its UTF-8 bytes, int64 ids)."""


def max_corpus_bytes() -> int:
    """The largest corpus read into memory: its tokens must fit in the memory budget."""
    return MACHINE.memory_budget // CORPUS_BYTES_PER_BYTE


def check_limits(section: object, name: str) -> None:
    """Each integer key in `LIMITS` of a config section within its [low, high], and each key in
    `CHOICES` one of its values (the OpenAPI document lists them as the key's enum)."""
    for key, (lo, hi) in type(section).LIMITS.items():
        int_in(f"{name}.{key}", getattr(section, key), lo, hi)
    for key, allowed in getattr(type(section), "CHOICES", {}).items():
        one_of(f"{name}.{key}", getattr(section, key), allowed)


def parse_cpu_list(key: str, text: str) -> frozenset[int]:
    """A Linux CPU list such as "0-3,6" as a set of CPU ids; ConfigError naming `key` if bad."""
    allowed = "a CPU list such as '0' or '0-3,6' of CPUs this machine has, or empty"
    cpus: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        check(match is not None, key, text, allowed)
        first, last = int(match[1]), int(match[2] or match[1])
        check(first <= last < (os.cpu_count() or 1), key, text, allowed)
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    """Decoder-only GPT (pre-LayerNorm). The default is about 1M parameters."""

    n_layer: int = 5
    """Transformer blocks."""
    n_head: int = 4
    """Attention heads; must divide n_embd."""
    n_embd: int = 128
    """Width of the residual stream."""
    block_size: int = 128
    """Context length in tokens (bytes)."""
    vocab_size: int = 256
    """Byte-level vocabulary: 256 for the built-in tokenizer."""
    dropout: float = 0.0
    """Dropout probability in attention and MLP."""
    bias: bool = False
    """Bias terms in Linear and LayerNorm layers."""
    tie_weights: bool = True
    """Share the token embedding with the output head."""

    # Each size on its own; together with the batch they must fit the memory (RunConfig).
    LIMITS: ClassVar[dict[str, tuple[int, int]]] = {
        "n_layer": (1, 1024), "n_head": (1, 1024), "n_embd": (1, 65536),
        "block_size": (1, 65536), "vocab_size": (256, 1 << 20)}  # at least the bytes

    def __post_init__(self) -> None:
        check_limits(self, "model")
        check(self.n_embd % self.n_head == 0, "model.n_head", self.n_head,
               f"a divisor of model.n_embd ({self.n_embd})")
        finite_in("model.dropout", self.dropout, 0.0, 1.0, hi_open=True)


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    """Optimizer and learning-rate schedule. Second-order fields are ignored by AdamW."""

    name: str = "adamw"
    """One of adamw | soap | shampoo | kl_shampoo."""
    lr: float = 3e-3
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.95)
    """First and second moment decay rates."""
    eps: float = 1e-8
    """Denominator epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay, applied to matrices only (not to gains, biases)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    warmup_steps: int = 50
    """Linear warmup from 0 to lr over this many steps."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio at the last step."""
    shampoo_beta: float = -1.0
    """Factor EMA decay; -1 means use betas[1] (the SOAP reference's rule)."""
    max_precond_dim: int = 10000
    """Dimensions larger than this are not preconditioned (identity), as in the SOAP reference."""
    precond_block_size: int = 1024
    """Largest factor side; larger dimensions are split into blocks of this size."""
    refresh_method: str = "power_qr"
    """SOAP/KL-Shampoo basis refresh: power_qr (the references: one power step + QR) | eigh."""
    moment_swap: str = "reference"
    """Second moment at a basis swap: reference (permute, as SOAP does) | transport."""

    LIMITS: ClassVar[dict[str, tuple[int, int]]] = {
        "warmup_steps": (0, MAX_STEPS), "max_precond_dim": (1, 65536),
        "precond_block_size": (1, 65536)}
    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        "name": OPTIMIZERS, "refresh_method": tuple(m.value for m in BASIS_REFRESHES),
        "moment_swap": tuple(m.value for m in MomentSwap)}

    def __post_init__(self) -> None:
        finite_in("optim.lr", self.lr, 0.0, 10.0, lo_open=True)
        check(isinstance(self.betas, tuple) and len(self.betas) == 2, "optim.betas",
               self.betas, "two numbers in [0, 1)")
        for i, beta in enumerate(self.betas):
            finite_in(f"optim.betas[{i}]", beta, 0.0, 1.0, hi_open=True)
        finite_in("optim.eps", self.eps, 0.0, 1.0, lo_open=True)
        finite_in("optim.weight_decay", self.weight_decay, 0.0, 10.0)
        finite_in("optim.grad_clip", self.grad_clip, 0.0, 1e6)
        finite_in("optim.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check(self.shampoo_beta == -1.0 or 0.0 <= self.shampoo_beta < 1.0,
               "optim.shampoo_beta", self.shampoo_beta, "-1 (use betas[1]) or a number in [0, 1)")
        check_limits(self, "optim")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Corpus and batches. The embedded default needs no network."""

    corpus: str = ""
    """A text file or a folder of text files; empty means the embedded default corpus
    (the English documentation text that ships inside CPython: pydoc_data.topics);
    "python-source" is the second built-in one (15 CPython stdlib modules' source)."""
    val_fraction: float = 0.1
    """Share of the corpus held out for validation (the tail, so the split is deterministic)."""
    batch_size: int = 16
    """Sequences per step."""

    LIMITS: ClassVar[dict[str, tuple[int, int]]] = {"batch_size": (1, 65536)}

    def __post_init__(self) -> None:
        check(isinstance(self.corpus, str), "data.corpus", self.corpus, "a path (string)")
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
        finite_in("data.val_fraction", self.val_fraction, 0.0, 0.5, lo_open=True)
        check_limits(self, "data")


class Device(StrEnum):
    """train.device."""

    AUTO = "auto"  # CUDA where there is one, else the CPU
    CPU = "cpu"
    CUDA = "cuda"


RESUME_AUTO = "auto"
"""train.resume's word for "the newest checkpoint in out_dir, else a fresh start"."""
# The corpora built in beside the default (asteria_core/train/data.py's NAMED_CORPORA): a name
# here is taken where no such path exists.
BUILTIN_CORPORA = ("python-source",)


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """The schedule of one run: steps, evaluation, checkpoints, seeds, device."""

    steps: int = 500
    """Optimizer steps in the run."""
    eval_interval: int = 100
    """Evaluate validation loss every this many steps (and at the last step)."""
    eval_batches: int = 20
    """Validation batches per evaluation."""
    log_interval: int = 10
    """Refresh the progress line every this many steps."""
    seed: int = 1337
    """Seeds torch, Python and the data order."""
    device: str = "auto"
    """auto (CUDA when present) | cpu | cuda."""
    autocast_bf16: bool = True
    """bf16 autocast on CUDA; ignored on CPU."""
    out_dir: str = "runs"
    """Folder for checkpoints and step records (a sub-folder per run)."""
    checkpoint_interval: int = 0
    """Write a checkpoint every this many steps; 0 means only at the end."""
    resume: str = ""
    """Path of a checkpoint to resume from (in a data-parallel run rank 0's, in the run folder:
    rank r reads rank<r>/ beside it); "auto": the newest checkpoint in out_dir, so launching the
    same command again resumes (a fresh start when there is none); empty starts fresh."""
    threads: int = 0
    """torch intra-op threads for training; 0 keeps torch's default."""
    cpus: str = ""
    """CPUs the training thread runs on, as a Linux CPU list ("0-3,6"); threads it starts later
    (intra-op pool, refresh workers) inherit them. Empty lets the OS schedule it anywhere. Pinning
    keeps the control plane's threads off the training cores. Linux only."""
    worker_cpus: str = ""
    """CPUs the refresh workers run on (threads, processes and their helper threads), as a
    Linux CPU list ("2-7"): on a GPU host, the cores that do not feed the device. Empty: those
    of the training thread (`train.cpus`). Linux only."""

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"device": tuple(d.value for d in Device)}
    LIMITS: ClassVar[dict[str, tuple[int, int]]] = {
        "steps": (1, MAX_STEPS), "eval_interval": (1, MAX_STEPS), "eval_batches": (1, 100_000),
        "log_interval": (1, MAX_STEPS), "seed": (0, 2**32 - 1),  # numpy seeds are 32-bit
        "checkpoint_interval": (0, MAX_STEPS), "threads": (0, MACHINE.max_threads)}

    def __post_init__(self) -> None:
        check_limits(self, "train")
        for key in ("cpus", "worker_cpus"):
            if getattr(self, key):
                check(sys.platform.startswith("linux"), f"train.{key}", getattr(self, key),
                      "empty on this platform (pinning needs Linux)")
                parse_cpu_list(f"train.{key}", getattr(self, key))
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

    def __post_init__(self) -> None:
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
