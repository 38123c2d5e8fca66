"""Corpus, byte-level tokenizer and a resumable batch loader.

The embedded default corpus is the English documentation text that ships inside CPython
(`pydoc_data.topics`, about 465 KB), so the default run needs no download. A second built-in
corpus, "python-source", is Python code instead of English: fifteen modules of the running
Python's standard library, concatenated in a fixed order (about 505 KB on CPython 3.11), also
without a download (`NAMED_CORPORA`; `load_corpus("python-source")` when no such path exists).
The split is deterministic: the last `val_fraction` of the byte stream is validation.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from asteria_core.train.config import max_corpus_bytes

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".text", "")


def encode(text: str) -> torch.Tensor:
    """Byte-level tokenizer: UTF-8 bytes as token ids 0..255."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(tokens: torch.Tensor) -> str:
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


def embedded_corpus() -> str:
    """pydoc_data.topics, joined in sorted key order so the text is the same on every run."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


PYTHON_SOURCE_MODULES = (
    "abc", "argparse", "bisect", "calendar", "colorsys", "contextlib", "copy", "csv",
    "dataclasses", "difflib", "enum", "fnmatch", "fractions", "functools", "gettext")
"""Pure-Python standard-library modules present in every CPython 3.x of the last decade, in the
order the "python-source" corpus joins them."""


def python_source_corpus() -> str:
    """The "python-source" corpus: the source of PYTHON_SOURCE_MODULES from this interpreter's
    standard library, each behind a `# ---- name.py ----` line, in that fixed order. The same
    text on every run of one Python version (the files differ between versions)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    parts = []
    for name in PYTHON_SOURCE_MODULES:
        file = stdlib / f"{name}.py"
        if not file.is_file():
            raise ValueError(f"data.corpus: 'python-source' needs {file}, which this Python "
                             "does not have; allowed: a CPython with its standard library "
                             "sources")
        text = file.read_bytes().decode("utf-8", errors="replace")
        parts.append(f"# ---- {name}.py ----\n" + text.replace("\r\n", "\n").replace("\r", "\n"))
    return "\n\n".join(parts)


NAMED_CORPORA: dict[str, Callable[[], str]] = {"python-source": python_source_corpus}
"""Built-in corpora by name, beside the embedded default (the empty path)."""


def load_corpus(path: str, limit: int | None = None) -> str:
    """Read a text file, or every text file under a folder (sorted); empty path -> embedded;
    a name of NAMED_CORPORA that is not an existing path -> that built-in corpus.
    At most `limit` bytes (default: what this machine's memory budget holds as tokens) are
    read; a larger corpus is an error, so a huge or endless file never fills the memory."""
    if not path:
        return embedded_corpus()
    if path in NAMED_CORPORA and not Path(path).expanduser().exists():
        return NAMED_CORPORA[path]()
    limit = max_corpus_bytes() if limit is None else limit
    root = Path(path).expanduser()
    files = [root] if root.is_file() else \
        sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)
    if not files:
        raise ValueError(f"data.corpus: folder {path!r} holds no text files "
                         f"(looked for suffixes {', '.join(s or 'none' for s in TEXT_SUFFIXES)})")
    parts, left = [], limit
    for file in files:
        with file.open("rb") as f:
            data = f.read(left + 1)  # sizes can lie (/proc) or grow: read, do not stat
        if len(data) > left:
            raise ValueError(f"data.corpus: {path!r} holds more than {limit} bytes; allowed: at "
                             f"most {limit} bytes on this machine")
        left -= len(data)
        text = data.decode("utf-8", errors="replace")
        parts.append(text.replace("\r\n", "\n").replace("\r", "\n"))  # as text mode reads
    return "\n\n".join(parts)


def split_tokens(tokens: torch.Tensor, val_fraction: float, block_size: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    n_val = int(len(tokens) * val_fraction)
    train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val:]
    for name, part in (("training", train), ("validation", val)):
        if len(part) < block_size + 2:
            raise ValueError(f"data.corpus: the {name} split has {len(part)} tokens, fewer than "
                             f"model.block_size + 2 = {block_size + 2}; use a larger corpus")
    return train, val


@dataclass(slots=True)
class LoaderState:
    """Where the loader is: which epoch, and how far into that epoch's order."""

    epoch: int = 0
    cursor: int = 0


class BatchLoader:
    """Non-overlapping windows of `block_size + 1` tokens, shuffled per epoch.

    The order of an epoch depends only on (seed, epoch), so `state` (epoch, cursor) is the
    whole data position: a resumed run sees exactly the batches the uninterrupted run saw.
    Each epoch also shifts the window grid by a random offset so windows differ across epochs.
    """

    def __init__(self, tokens: torch.Tensor, block_size: int, batch_size: int, seed: int) -> None:
        self.tokens = tokens
        self.block_size = block_size
        self.batch_size = batch_size
        self.seed = seed
        self.state = LoaderState()
        self._order_epoch = -1
        self._starts = torch.empty(0, dtype=torch.long)

    def _epoch_starts(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        span = self.block_size + 1
        offset = int(torch.randint(0, span, (1,), generator=g))
        n = (len(self.tokens) - offset) // span
        starts = offset + span * torch.arange(n)
        return starts[torch.randperm(n, generator=g)]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (B, T) int64 on CPU; y is x shifted by one token."""
        rows: list[torch.Tensor] = []
        while len(rows) < self.batch_size:
            if self._order_epoch != self.state.epoch:
                self._starts = self._epoch_starts(self.state.epoch)
                self._order_epoch = self.state.epoch
            if self.state.cursor >= len(self._starts):
                self.state = LoaderState(self.state.epoch + 1, 0)
                continue
            start = int(self._starts[self.state.cursor])
            rows.append(self.tokens[start: start + self.block_size + 1])
            self.state.cursor += 1
        batch = torch.stack(rows)  # (B, T + 1)
        return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.state.epoch, "cursor": self.state.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = LoaderState(int(state["epoch"]), int(state["cursor"]))


def fixed_eval_batches(tokens: torch.Tensor, block_size: int, batch_size: int, n_batches: int
                       ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The same validation batches at every evaluation, spread evenly over the split."""
    span = block_size + 1
    n_windows = max(1, (len(tokens) - 1) // span)
    want = min(n_windows, batch_size * n_batches)
    idx = torch.linspace(0, n_windows - 1, want).long()
    windows = torch.stack([tokens[i * span: i * span + span] for i in idx.tolist()])
    return [(w[:, :-1].contiguous(), w[:, 1:].contiguous()) for w in windows.split(batch_size)]
