"""Run configuration: typed dataclasses, validated at construction.

A run is described by one `RunConfig` made of one config per component. Every field
validates itself in `__post_init__` and raises `ConfigError` naming the field, the bad
value and what is allowed, so a bad config fails before any training starts.
Loading from TOML/YAML files and `--section.key value` overrides lives in `config_io.py`.
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from asteria_core.policy import Policy


class ConfigError(ValueError):
    """A config value a user wrote is wrong; the message names the key and what is allowed."""


def _check(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: got {value!r}; allowed: {allowed}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(key: str, value: int) -> None:
    _check(_is_int(value) and value > 0, key, value, "an integer > 0")


def _non_negative_int(key: str, value: int) -> None:
    _check(_is_int(value) and value >= 0, key, value, "an integer >= 0")


def _finite_in(key: str, value: float, lo: float, hi: float, *, lo_open: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (lo < value if lo_open else lo <= value) and value <= hi
    _check(ok, key, value, f"a number in {'(' if lo_open else '['}{lo}, {hi}]")


def _one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    _check(value in choices, key, value, " | ".join(choices))


def parse_cpu_list(key: str, text: str) -> frozenset[int]:
    """A Linux CPU list such as "0-3,6" as a set of CPU ids; ConfigError naming `key` if bad."""
    allowed = "a CPU list such as '0' or '0-3,6' of CPUs this machine has, or empty"
    cpus: set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        _check(match is not None, key, text, allowed)
        first, last = int(match[1]), int(match[2] or match[1])
        _check(first <= last < (os.cpu_count() or 1), key, text, allowed)
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
            _positive_int(f"model.{name}", getattr(self, name))
        _check(self.n_embd % self.n_head == 0, "model.n_head", self.n_head,
               f"a divisor of model.n_embd ({self.n_embd})")
        _check(self.vocab_size >= 256, "model.vocab_size", self.vocab_size,
               "an integer >= 256 (byte-level tokenizer)")
        _finite_in("model.dropout", self.dropout, 0.0, 1.0)
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
        _one_of("optim.name", self.name, OPTIMIZERS)
        _finite_in("optim.lr", self.lr, 0.0, 10.0, lo_open=True)
        _check(isinstance(self.betas, tuple) and len(self.betas) == 2, "optim.betas",
               self.betas, "two numbers in [0, 1)")
        for i, beta in enumerate(self.betas):
            _finite_in(f"optim.betas[{i}]", beta, 0.0, 1.0)
            _check(beta < 1.0, f"optim.betas[{i}]", beta, "a number in [0, 1)")
        _finite_in("optim.eps", self.eps, 0.0, 1.0, lo_open=True)
        _finite_in("optim.weight_decay", self.weight_decay, 0.0, 10.0)
        _finite_in("optim.grad_clip", self.grad_clip, 0.0, 1e6)
        _non_negative_int("optim.warmup_steps", self.warmup_steps)
        _finite_in("optim.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        _check(self.shampoo_beta == -1.0 or 0.0 <= self.shampoo_beta < 1.0,
               "optim.shampoo_beta", self.shampoo_beta, "-1 (use betas[1]) or a number in [0, 1)")
        _positive_int("optim.max_precond_dim", self.max_precond_dim)
        _positive_int("optim.precond_block_size", self.precond_block_size)
        _one_of("optim.refresh_method", self.refresh_method, ("power_qr", "eigh"))
        _one_of("optim.moment_swap", self.moment_swap, ("reference", "transport"))


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
        _check(isinstance(self.corpus, str), "data.corpus", self.corpus, "a path (string)")
        if self.corpus and not Path(self.corpus).expanduser().exists():
            raise ConfigError(f"data.corpus: path {self.corpus!r} does not exist; allowed: an "
                              "existing text file or folder, or empty for the embedded corpus")
        _finite_in("data.val_fraction", self.val_fraction, 0.0, 0.5, lo_open=True)
        _positive_int("data.batch_size", self.batch_size)


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
        _positive_int("train.steps", self.steps)
        _positive_int("train.eval_interval", self.eval_interval)
        _positive_int("train.eval_batches", self.eval_batches)
        _positive_int("train.log_interval", self.log_interval)
        _non_negative_int("train.seed", self.seed)
        _one_of("train.device", self.device, DEVICES)
        _non_negative_int("train.checkpoint_interval", self.checkpoint_interval)
        _non_negative_int("train.threads", self.threads)
        if self.cpus:
            _check(sys.platform.startswith("linux"), "train.cpus", self.cpus,
                   "empty on this platform (pinning needs Linux)")
            parse_cpu_list("train.cpus", self.cpus)
        if self.resume and not Path(self.resume).expanduser().is_file():
            raise ConfigError(f"train.resume: checkpoint {self.resume!r} does not exist; "
                              "allowed: an existing checkpoint file, or empty")


@dataclass(kw_only=True, slots=True)
class TelemetryConfig:
    """Metrics, energy meters and in-process step history (asteria_core.telemetry)."""

    enabled: bool = True
    """Collect metrics, idle attribution and energy; false runs with a no-op reporter."""
    history_size: int = 10000
    """Step records kept in memory for the control plane (the oldest are dropped)."""
    energy_poll_seconds: float = 1.0
    """Read the energy meters at most this often during training (and at every scrape)."""
    nvml: bool = True
    """Read GPU energy, power, memory and utilization from NVML where it is present."""
    rapl: bool = True
    """Read CPU package energy from RAPL where it is readable (root only on Linux >= 5.10)."""
    rapl_root: str = "/sys/class/powercap"
    """Folder of the powercap sysfs tree."""
    model_cpu_watts: float = 0.0
    """> 0 turns on a modelled CPU energy estimate: process CPU seconds x these watts per
    busy core, exported only with source="model"; 0 leaves it off."""
    target_loss: float = 0.0
    """Record the energy used until eval loss first reaches this value; 0 disables."""
    metrics_host: str = "127.0.0.1"
    """Address `asteria train` serves /metrics on, when metrics_port is set."""
    metrics_port: int = 0
    """Serve /metrics on this port during `asteria train`; 0 does not serve."""

    def __post_init__(self) -> None:
        _positive_int("telemetry.history_size", self.history_size)
        _finite_in("telemetry.energy_poll_seconds", self.energy_poll_seconds, 0.0, 3600.0)
        _finite_in("telemetry.model_cpu_watts", self.model_cpu_watts, 0.0, 10000.0)
        _finite_in("telemetry.target_loss", self.target_loss, 0.0, 1e6)
        _check(isinstance(self.metrics_host, str) and self.metrics_host != "",
               "telemetry.metrics_host", self.metrics_host, "a host name or address")
        _check(_is_int(self.metrics_port) and 0 <= self.metrics_port <= 65535,
               "telemetry.metrics_port", self.metrics_port, "an integer in [0, 65535]")
        _check(not (self.metrics_port and not self.enabled), "telemetry.metrics_port",
               self.metrics_port, "0 while telemetry.enabled is false")


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
