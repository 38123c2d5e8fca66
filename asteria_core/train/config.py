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

from asteria_core.policy import Policy
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.validation import (
    ConfigError,
    check,
    finite_in,
    non_negative_int,
    one_of,
    positive_int,
)


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

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "n_embd", "block_size", "vocab_size"):
            positive_int(f"model.{name}", getattr(self, name))
        check(self.n_embd % self.n_head == 0, "model.n_head", self.n_head,
               f"a divisor of model.n_embd ({self.n_embd})")
        check(self.vocab_size >= 256, "model.vocab_size", self.vocab_size,
               "an integer >= 256 (byte-level tokenizer)")
        finite_in("model.dropout", self.dropout, 0.0, 1.0)
        if self.dropout >= 1.0:
            raise ConfigError(f"model.dropout: got {self.dropout}; allowed: a number in [0, 1)")


OPTIMIZERS = ("adamw", "soap", "shampoo", "kl_shampoo")


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

    def __post_init__(self) -> None:
        one_of("optim.name", self.name, OPTIMIZERS)
        finite_in("optim.lr", self.lr, 0.0, 10.0, lo_open=True)
        check(isinstance(self.betas, tuple) and len(self.betas) == 2, "optim.betas",
               self.betas, "two numbers in [0, 1)")
        for i, beta in enumerate(self.betas):
            finite_in(f"optim.betas[{i}]", beta, 0.0, 1.0)
            check(beta < 1.0, f"optim.betas[{i}]", beta, "a number in [0, 1)")
        finite_in("optim.eps", self.eps, 0.0, 1.0, lo_open=True)
        finite_in("optim.weight_decay", self.weight_decay, 0.0, 10.0)
        finite_in("optim.grad_clip", self.grad_clip, 0.0, 1e6)
        non_negative_int("optim.warmup_steps", self.warmup_steps)
        finite_in("optim.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        check(self.shampoo_beta == -1.0 or 0.0 <= self.shampoo_beta < 1.0,
               "optim.shampoo_beta", self.shampoo_beta, "-1 (use betas[1]) or a number in [0, 1)")
        positive_int("optim.max_precond_dim", self.max_precond_dim)
        positive_int("optim.precond_block_size", self.precond_block_size)
        one_of("optim.refresh_method", self.refresh_method, ("power_qr", "eigh"))
        one_of("optim.moment_swap", self.moment_swap, ("reference", "transport"))


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """Corpus and batches. The embedded default needs no network."""

    corpus: str = ""
    """A text file or a folder of text files; empty means the embedded default corpus
    (the English documentation text that ships inside CPython: pydoc_data.topics)."""
    val_fraction: float = 0.1
    """Share of the corpus held out for validation (the tail, so the split is deterministic)."""
    batch_size: int = 16
    """Sequences per step."""

    def __post_init__(self) -> None:
        check(isinstance(self.corpus, str), "data.corpus", self.corpus, "a path (string)")
        if self.corpus and not Path(self.corpus).expanduser().exists():
            raise ConfigError(f"data.corpus: path {self.corpus!r} does not exist; allowed: an "
                              "existing text file or folder, or empty for the embedded corpus")
        finite_in("data.val_fraction", self.val_fraction, 0.0, 0.5, lo_open=True)
        positive_int("data.batch_size", self.batch_size)


DEVICES = ("auto", "cpu", "cuda")


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
    """Path of a checkpoint to resume from; empty starts fresh."""
    threads: int = 0
    """torch intra-op threads for training; 0 keeps torch's default."""
    cpus: str = ""
    """CPUs the training thread runs on, as a Linux CPU list ("0-3,6"); threads it starts later
    (intra-op pool, refresh workers) inherit them. Empty lets the OS schedule it anywhere. Pinning
    keeps the control plane's threads off the training cores. Linux only."""

    def __post_init__(self) -> None:
        positive_int("train.steps", self.steps)
        positive_int("train.eval_interval", self.eval_interval)
        positive_int("train.eval_batches", self.eval_batches)
        positive_int("train.log_interval", self.log_interval)
        non_negative_int("train.seed", self.seed)
        one_of("train.device", self.device, DEVICES)
        non_negative_int("train.checkpoint_interval", self.checkpoint_interval)
        non_negative_int("train.threads", self.threads)
        if self.cpus:
            check(sys.platform.startswith("linux"), "train.cpus", self.cpus,
                   "empty on this platform (pinning needs Linux)")
            parse_cpu_list("train.cpus", self.cpus)
        if self.resume and not Path(self.resume).expanduser().is_file():
            raise ConfigError(f"train.resume: checkpoint {self.resume!r} does not exist; "
                              "allowed: an existing checkpoint file, or empty")


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
