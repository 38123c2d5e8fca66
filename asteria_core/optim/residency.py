"""Where a runtime keeps a parameter's optimizer state between uses, and how the optimizer
reads and writes that state around each use.

A tier store (asteria_core/tiers) plugs into an optimizer as its `residency`: it makes a
parameter's state resident before a use (`resident`) and may keep it in buffers of its own, which
the optimizer then writes into instead of replacing (`owns`, `install`). With no residency the
state stays where the optimizer put it and every helper here is a plain read or write.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from asteria_core.compat import Choice


class Writes(Choice):
    """What one use of a parameter's state may have changed (Residency.release)."""

    STEP = "step"  # an update: the per-step state
    ALL = "all"  # a basis swap
    NONE = "none"  # a snapshot: nothing


class Residency(Protocol):
    """Where a runtime (the tier store) makes a parameter's state resident around each use.

    `acquire` runs before the state dict of parameter `index` is read, `release` after; `writes`
    says what the use may have changed (`Writes`). `begin_step` announces the order of the
    coming updates.
    """

    def begin_step(self, order: list[int]) -> None: ...

    def acquire(self, index: int, state: dict) -> None: ...

    def release(self, index: int, state: dict, writes: Writes) -> None: ...

    def materialized(self, packed: dict) -> dict: ...

    def buffered(self, index: int) -> bool:
        """True when parameter `index`'s state passes through the runtime's own buffers, which
        it reuses or rewrites: then the optimizer copies that state, never lends or replaces it."""

    def adopt_all(self) -> None: ...


@contextmanager
def resident(residency: Residency | None, index: int, state: dict,
             writes: Writes) -> Iterator[None]:
    """Parameter `index`'s state made resident for one use that may change what `writes` says."""
    if residency is None:
        yield
        return
    residency.acquire(index, state)
    yield  # on an error the state is suspect: it is not written back
    residency.release(index, state, writes)


def owns(residency: Residency | None, index: int) -> bool:
    """Whether parameter `index`'s state tensors are the optimizer's own to lend and replace
    (see Residency.buffered)."""
    return residency is None or not residency.buffered(index)


def install(residency: Residency | None, index: int, container: Any, key: Any,
            value: torch.Tensor) -> None:
    """container[key] <- value for parameter `index`'s state: the tensor takes the old one's
    place (no copy; a snapshot holding the old one keeps it intact), or, when the state is
    in a runtime buffer, its values are copied in."""
    if owns(residency, index):
        container[key] = value.contiguous()
    else:
        container[key].copy_(value)
