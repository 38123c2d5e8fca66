"""What a tier store knows about each optimizer-state tensor: where it sits and how it is used.

A parameter's state is the optimizer's per-parameter dict (`optimizer.state[p]`). Its tensor
leaves (moments, factor and basis blocks, ...) are the store's entries; ints such as step counts
and basis versions stay in the dict. An entry is named by its path in the dict, e.g.
("factors", 1, 0) for the factor block of dim 1, chunk 0.

Lifecycle classes, by how the training step touches the tensor:
- written every step (moments, factors): read before and written back after every update;
- read every step (bases, inverse roots): read every update, written only by a basis swap;
- background-only (shadow snapshots, pending refresh results): used by host workers only;
- cold: rarely touched.
The value of keeping an entry on the device is the bytes it would move per step if it were not
there, per byte held: 2 (read + write), 1 (read), 0, 0. Background-only state never occupies the
device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from asteria_core.telemetry.labels import Tier

WRITTEN = "written_every_step"
READ = "read_every_step"
BACKGROUND = "background_only"
COLD = "cold"
CLASSES = (WRITTEN, READ, BACKGROUND, COLD)
VALUE_PER_BYTE = {WRITTEN: 2, READ: 1, BACKGROUND: 0, COLD: 0}

# Top-level state keys whose tensors are only read by the per-step math (written at swaps).
READ_KEYS = frozenset({"bases"})
ALIGN = 4096
"""Entries are laid out at this alignment in staging buffers and disk files (O_DIRECT)."""

Path = tuple  # ("key", dim, chunk) or ("key",)


def padded(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def classify(path: Path) -> str:
    """Lifecycle class of a per-parameter state entry; unknown keys count as written (safe:
    they are always written back)."""
    return READ if path[0] in READ_KEYS else WRITTEN


@dataclass(slots=True)
class Entry:
    """One state tensor of one parameter."""

    param: int
    path: Path
    shape: tuple[int, ...]
    dtype: torch.dtype
    lifecycle: str
    tier: str = Tier.DEVICE.value

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize

    @property
    def name(self) -> str:
        """A file-name-safe id, e.g. p3.factors.1.0."""
        return ".".join([f"p{self.param}", *map(str, self.path)])


def leaves(state: dict) -> list[tuple[Path, torch.Tensor]]:
    """(path, tensor) of every tensor leaf in a per-parameter state dict, in a fixed order."""
    out: list[tuple[Path, torch.Tensor]] = []

    def walk(prefix: Path, value) -> None:
        if isinstance(value, torch.Tensor):
            out.append((prefix, value))
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                walk((*prefix, i), item)

    for key in sorted(state, key=str):
        walk((key,), state[key])
    return out


def get_leaf(state: dict, path: Path) -> torch.Tensor:
    value = state[path[0]]
    for i in path[1:]:
        value = value[i]
    return value


def set_leaf(state: dict, path: Path, tensor: torch.Tensor) -> None:
    if len(path) == 1:
        state[path[0]] = tensor
        return
    container = state[path[0]]
    for i in path[1:-1]:
        container = container[i]
    container[path[-1]] = tensor


def copy_structure(state: dict) -> dict:
    """A copy of a per-parameter state dict whose lists are new (tensors shared)."""

    def copy(value):
        return [copy(v) for v in value] if isinstance(value, list) else value

    return {k: copy(v) for k, v in state.items()}
