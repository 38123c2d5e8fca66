"""Shared machinery of SOAP, Shampoo and KL-Shampoo: block layout, the refresh seam, swaps.

A step has two parts. The per-step math (subclasses' `_step_param`) updates factors and moments
and applies the parameter update with the basis currently in use. The step boundary (end of
`step`) first swaps in every pending refresh result whose swap step has come, then, in native
mode, refreshes the blocks that fell due, through the same `snapshot` -> `refresh_fn` ->
`apply_refresh` path a runtime uses. With `refresh_delay = d` a result computed from the
statistics of step t is swapped in at the boundary of step t + d and first used by step t + d + 1;
d = 0 is the references' own order. With `external_refresh = True` the boundary never refreshes:
a runtime reads `due_blocks()` after each step and drives the seam itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from asteria_core.compat import StrEnum
from asteria_core.optim.layout import (
    Layout,
    chunk_slice,
    make_layout,
    map_dim_by,
    new_blocks,
    permute_dim,
)
from asteria_core.optim.matrix_functions import overlap_transport
from asteria_core.optim.seam import (
    REFRESH_DTYPES,
    BlockInfo,
    BlockKey,
    FactorSnapshot,
    MomentSwap,
    RefreshConfig,
    RefreshResult,
    is_finite,
    refresh_fn,
)

# Per-parameter state keys shared by all three optimizers.
STEP = "step"                # int: steps that updated this parameter (the first call does not)
EXP_AVG = "exp_avg"          # first moment, original basis, work shape
FACTORS = "factors"          # [dim][chunk] (b, b) factor statistics
BASES = "bases"              # [dim][chunk] (b, b) basis in use (Shampoo: inverse root)
VERSIONS = "basis_versions"  # [dim][chunk] int: swaps so far (0: initial identity)
BASIS_STEPS = "basis_steps"  # [dim][chunk] int: stats step behind the basis in use (-1: none)
EXTRA = "asteria"            # optimizer-level entry added to state_dict()


class Writes(StrEnum):
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


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 (DTensor) parameter or gradient, a view that shares its
    storage; any other tensor itself. Under FSDP2 every rank preconditions its own shard as a
    tensor of its own (docs/architecture.md, "Data-parallel runs")."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def check_choice(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name}: got {value!r}; allowed: {' | '.join(map(str, choices))}")


def check_range(name: str, value: float, lo: float, hi: float) -> None:
    if not lo <= value <= hi:
        raise ValueError(f"{name}: got {value!r}; allowed: a number in [{lo}, {hi}]")


def check_layout_args(defaults: dict) -> None:
    """Validate the layout and seam options every block preconditioner takes."""
    if defaults["block_size"] is not None and defaults["block_size"] < 1:
        raise ValueError(f"block_size: got {defaults['block_size']!r}; allowed: None or >= 1")
    if defaults["max_precond_dim"] < 0:
        raise ValueError(f"max_precond_dim: got {defaults['max_precond_dim']!r}; allowed: >= 0")
    if defaults["precondition_frequency"] < 1:
        raise ValueError(f"precondition_frequency: got {defaults['precondition_frequency']!r}; "
                         "allowed: an integer >= 1")
    check_choice("moment_swap", defaults["moment_swap"], tuple(MomentSwap))
    check_choice("refresh_dtype", defaults["refresh_dtype"], tuple(REFRESH_DTYPES))
    check_range("weight_decay", defaults["weight_decay"], 0.0, float("inf"))
    check_range("lr", defaults["lr"], 0.0, float("inf"))


class BlockPreconditioner(torch.optim.Optimizer):
    """Base class: subclasses implement the per-step math and the refresh config of a block."""

    def __init__(self, params, defaults: dict, *, refresh_delay: int = 0) -> None:
        check_layout_args(defaults)
        super().__init__(params, defaults)
        self.refresh_delay = refresh_delay
        self.external_refresh = False
        """When True, step() never refreshes; a runtime drives snapshot/refresh_fn/apply_refresh."""
        self.refresh_failures = 0
        """Refreshes (native mode) that raised or returned non-finite values; basis kept."""
        self._num_steps = 0
        self._pending: list[tuple[int, RefreshResult]] = []  # (swap step, result), in order
        self._due: tuple[BlockKey, ...] = ()
        self._layouts: dict[int, tuple[tuple, Layout]] = {}
        self._lent: weakref.WeakValueDictionary[int, torch.Tensor] = \
            weakref.WeakValueDictionary()
        """Factor blocks a snapshot holds without a copy, by id: their next update writes a new
        tensor (copy on write). An entry goes when its tensor dies, before its id can be reused."""
        self.residency: Residency | None = None
        """Set by a tier store: state may live off the device between uses (see Residency)."""
        self.keeps_factor: Callable[[BlockKey], bool] | None = None
        """Set by a data-parallel runtime to `key -> bool`: this rank holds and updates only the
        factor statistics of the blocks it refreshes (their owner); the others' factors are
        empty placeholders. None: every factor is kept (one process)."""
        self._stepping: int | None = None  # the parameter whose per-step math is running

    # ---- subclass hooks -------------------------------------------------------------------
    def _step_param(self, p: torch.Tensor, grad: torch.Tensor, state: dict, layout: Layout,
                    group: dict) -> bool:
        """Per-step math for one parameter; grad is in work shape. True: refresh due now."""
        raise NotImplementedError

    def _block_refresh_config(self, group: dict, layout: Layout, dim: int) -> RefreshConfig:
        raise NotImplementedError

    def _swap_moments(self, state: dict, layout: Layout, key: BlockKey, perm_b, p_bb) -> None:
        """Re-express per-coordinate statistics of `key` in the new basis (perm or transport)."""

    def _snapshot_scale(self, state: dict, group: dict) -> float:
        return 1.0

    # ---- properties -----------------------------------------------------------------------
    @property
    def refresh_delay(self) -> int:
        """d: a refresh computed from step-t statistics is swapped in at the boundary of t + d."""
        return self._refresh_delay

    @refresh_delay.setter
    def refresh_delay(self, value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"refresh_delay: got {value!r}; allowed: an integer >= 0")
        self._refresh_delay = value

    def set_refresh_interval(self, steps: int) -> None:
        """Refresh every block every `steps` steps from now on (a runtime's live policy sets it;
        the optimizer's own `precondition_frequency` option, in every parameter group)."""
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"refresh interval: got {steps!r}; allowed: an integer >= 1")
        for group in self.param_groups:
            group["precondition_frequency"] = steps

    @property
    def num_steps(self) -> int:
        """Calls of step() so far: the clock that stats steps and swap steps use."""
        return self._num_steps

    # ---- the step -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._num_steps += 1
        due: list[BlockKey] = []
        if self.residency is not None:
            self.residency.begin_step([i for i, p, _ in self._indexed_params()
                                       if p.grad is not None])
        for index, p, group in self._indexed_params():
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise TypeError(f"{type(self).__name__} does not support sparse gradients")
            shard = local_shard(p)
            if shard.numel() == 0:
                continue  # FSDP2 left this rank no rows of it
            layout = self._layout(index, p, group)
            grad = local_shard(p.grad).reshape(layout.shape)
            self._stepping = index
            with self._resident(index, self.state[p], Writes.STEP):
                refresh_due = self._step_param(shard, grad, self.state[p], layout, group)
            if refresh_due:
                due.extend(BlockKey(index, dim, c) for dim, c, _ in layout.blocks())
        self._boundary(due)
        return loss

    def _boundary(self, due: list[BlockKey]) -> None:
        now = self._num_steps
        ready = sorted((item for item in self._pending if item[0] <= now), key=lambda i: i[0])
        self._pending = [item for item in self._pending if item[0] > now]
        for _, ready_result in ready:
            self.apply_refresh(ready_result.key, ready_result)
        self._due = tuple(due)
        if self.external_refresh:
            return
        for key in due:
            result = self._refresh_inline(key)
            if result is None:
                continue
            if self._refresh_delay == 0 or result.base_version == 0:  # a first basis at once
                self.apply_refresh(key, result)
            else:
                self.schedule_refresh(now + self._refresh_delay, result)

    def _refresh_inline(self, key: BlockKey) -> RefreshResult | None:
        try:
            result = refresh_fn(self.snapshot(key, lend=True), self.refresh_config(key))
        except torch.linalg.LinAlgError:
            result = None
        if result is None or not is_finite(result):
            self.refresh_failures += 1
            return None
        return result

    # ---- the seam API ---------------------------------------------------------------------
    def refresh_blocks(self) -> list[BlockInfo]:
        """Every refresh block of every parameter, in a fixed order (known before step 1)."""
        return [BlockInfo(BlockKey(index, dim, c), size, float(size) ** 3,
                          layout.numel / layout.shape[dim] * size * size)
                for index, p, group in self._indexed_params() if local_shard(p).numel()
                for layout in [self._layout(index, p, group)]
                for dim, c, size in layout.blocks()]

    def due_blocks(self) -> tuple[BlockKey, ...]:
        """Blocks whose refresh fell due at the last step (same in native and external mode)."""
        return self._due

    def schedule_refresh(self, step: int, result: RefreshResult) -> None:
        """Hand over a computed result to be swapped in at the boundary of `step` (> num_steps).

        Scheduled results are part of state_dict(), so a runtime can settle its in-flight work
        into the optimizer before a checkpoint and a resumed run swaps it in on time. Results
        due at the same boundary are swapped in the order they were scheduled.
        """
        if step <= self._num_steps:
            raise ValueError(f"step: got {step}; allowed: > num_steps ({self._num_steps})")
        self._locate(result.key)
        self._pending.append((step, result))

    def pending_refreshes(self) -> list[tuple[int, BlockKey]]:
        """(swap step, key) of scheduled results not yet swapped in (native delay or runtime)."""
        return [(at, result.key) for at, result in self._pending]

    def refresh_config(self, key: BlockKey) -> RefreshConfig:
        p, group, layout = self._locate(key)
        return self._block_refresh_config(group, layout, key.dim)

    def snapshot(self, key: BlockKey, device: torch.device | str | None = None,
                 non_blocking: bool = False, *, lend: bool = False) -> FactorSnapshot:
        """One block's factor (and basis, when the refresh reads it) at this boundary.

        Cloned by default. With `lend` (and no tier store, whose buffers are reused) nothing is
        copied: the snapshot holds the live tensors, which the optimizer then never writes in
        place again (a basis is replaced at a swap, and the block's next factor update writes a
        new tensor). So a boundary that starts a refresh copies nothing. Treat a lent snapshot's
        tensors as read-only.
        """
        p, group, layout = self._locate(key)
        state = self._block_state(p, key)
        config = self._block_refresh_config(group, layout, key.dim)
        lend = lend and device is None and self._owns(key.param)

        def take(t: torch.Tensor) -> torch.Tensor:
            if lend:
                return t
            if device is None:
                return t.clone()
            return t.to(device, non_blocking=non_blocking, copy=True)

        with self._resident(key.param, state, Writes.NONE):
            factor = state[FACTORS][key.dim][key.chunk]
            if factor.numel() == 0:
                raise KeyError(f"{key}: its factor statistics are kept by its owner rank")
            if lend:
                self._lent[id(factor)] = factor
            basis = state[BASES][key.dim][key.chunk]
            return FactorSnapshot(key=key, stats_step=self._num_steps,
                                  base_version=state[VERSIONS][key.dim][key.chunk],
                                  factor=take(factor),
                                  basis=take(basis) if config.needs_basis else None,
                                  scale=self._snapshot_scale(state, group))

    def apply_refresh(self, key: BlockKey, result: RefreshResult) -> None:
        """Swap a refresh result into block `key` (call between steps).

        The moment swap uses the result's perm/transport when the result was computed from the
        basis still in use; if another swap happened since its snapshot, the transport is
        recomputed against the current basis (and a reference permutation, which only makes sense
        relative to the basis it was computed from, is skipped).
        """
        if result.key != key:
            raise ValueError(f"result for {result.key} applied to block {key}")
        p, group, layout = self._locate(key)
        state = self._block_state(p, key)
        with self._resident(key.param, state, Writes.ALL):
            self._apply_refresh(key, result, state, layout)

    def _apply_refresh(self, key: BlockKey, result: RefreshResult, state: dict,
                       layout: Layout) -> None:
        basis_bb = state[BASES][key.dim][key.chunk]
        if result.basis.shape != basis_bb.shape:
            raise ValueError(f"result basis {tuple(result.basis.shape)} does not fit block {key} "
                             f"{tuple(basis_bb.shape)}")
        version = state[VERSIONS][key.dim][key.chunk]
        # non_blocking: from a worker's pinned result the copy to a CUDA device is asynchronous
        new_bb = result.basis.to(basis_bb.device, basis_bb.dtype, non_blocking=True)
        perm_b, p_bb = result.perm, result.transport
        if result.base_version != version:
            perm_b = None
            p_bb = None if p_bb is None else overlap_transport(basis_bb, new_bb)
        if p_bb is not None:
            p_bb = p_bb.to(basis_bb.device, basis_bb.dtype, non_blocking=True)
        self._swap_moments(state, layout, key, perm_b, p_bb)
        self._install(key.param, state[BASES][key.dim], key.chunk, new_bb)
        state[VERSIONS][key.dim][key.chunk] = version + 1
        state[BASIS_STEPS][key.dim][key.chunk] = result.stats_step

    def factor_of(self, key: BlockKey) -> torch.Tensor:
        """A copy of block `key`'s factor statistics (empty where another rank keeps them)."""
        p, _, _ = self._locate(key)
        state = self._block_state(p, key)
        with self._resident(key.param, state, Writes.NONE):
            return state[FACTORS][key.dim][key.chunk].clone()

    def holds_factor(self, key: BlockKey) -> bool:
        """Whether this rank holds block `key`'s factor statistics (False before the block's
        parameter took its first step)."""
        p, _, _ = self._locate(key)
        state = self.state.get(p)
        if not state:
            return False
        return state[FACTORS][key.dim][key.chunk].numel() > 0

    def factor_like(self, key: BlockKey) -> torch.Tensor:
        """An uninitialised CPU tensor shaped as block `key`'s factor statistics (to receive
        them): (b, b), or b (b + 1) / 2 values when the optimizer packs them."""
        p, group, layout = self._locate(key)
        sizes = layout.chunks[key.dim]
        assert sizes is not None  # a refresh block's dim (_locate)
        b = sizes[key.chunk]
        like = self._block_state(p, key)[FACTORS][key.dim][key.chunk]
        shape = (b * (b + 1) // 2,) if group.get("pack_factors") else (b, b)
        return torch.empty(shape, dtype=like.dtype)

    def hand_factor(self, key: BlockKey, factor: torch.Tensor | None) -> None:
        """Block `key` changed owner rank (distributed/rebalance.py): keep `factor`, its
        statistics as the old owner had them, or None: keep none (an empty placeholder)."""
        p, _, _ = self._locate(key)
        state = self._block_state(p, key)
        with self._resident(key.param, state, Writes.ALL):
            old = state[FACTORS][key.dim][key.chunk]
            kept = torch.empty(0, dtype=old.dtype, device=old.device) if factor is None else \
                factor.to(old.device, old.dtype)
            state[FACTORS][key.dim][key.chunk] = kept

    def basis_step(self, key: BlockKey) -> int:
        """The step whose statistics made the basis in use (-1: initial identity)."""
        p, _, _ = self._locate(key)
        return self._block_state(p, key)[BASIS_STEPS][key.dim][key.chunk]

    def basis_version(self, key: BlockKey) -> int:
        p, _, _ = self._locate(key)
        return self._block_state(p, key)[VERSIONS][key.dim][key.chunk]

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.residency is not None:  # state that lives off the device, read back in
            state["state"] = self.residency.materialized(state["state"])
        state[EXTRA] = {"num_steps": self._num_steps, "refresh_failures": self.refresh_failures,
                        "pending": [{"at": at, **result.to_dict()} for at, result in self._pending]}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop(EXTRA, None)
        super().load_state_dict(state_dict)
        if extra is None:
            raise ValueError(f"state_dict has no {EXTRA!r} entry: not saved by "
                             f"{type(self).__name__}")
        self._num_steps = extra["num_steps"]
        self.refresh_failures = extra["refresh_failures"]
        self._pending = [(item["at"], RefreshResult.from_dict(item)) for item in extra["pending"]]
        self._due = ()
        self._lent.clear()
        if self.residency is not None:
            self.residency.adopt_all()

    def state_spec(self, index: int) -> dict:
        """The state parameter `index` will hold after its first update, as meta tensors (a dry
        run of the per-step math on the meta device: shapes and dtypes, no memory, no values)."""
        for i, p, group in self._indexed_params():
            if i == index:
                layout = self._layout(index, p, group)
                p_meta = torch.empty_like(local_shard(p), device="meta")
                state: dict = {}
                self._stepping = index
                self._step_param(p_meta, torch.empty(layout.shape, dtype=p.dtype, device="meta"),
                                 state, layout, group)
                return state
        raise KeyError(f"no parameter with index {index}")

    # ---- helpers --------------------------------------------------------------------------
    def _indexed_params(self):
        index = 0
        for group in self.param_groups:
            for p in group["params"]:
                yield index, p, group
                index += 1

    def _keeps(self, dim: int, chunk: int | None = None) -> bool:
        """Whether this rank keeps the factor of block (stepping parameter, dim, chunk); with
        chunk None, of any block of that dim (else the dim's factor work can be skipped)."""
        keeps, stepping = self.keeps_factor, self._stepping
        if keeps is None:
            return True
        assert stepping is not None  # called from a parameter's per-step math
        layout = self._layouts[stepping][1]  # laid out before its math runs
        chunks: Sequence[int]
        if chunk is None:
            sizes = layout.chunks[dim]
            assert sizes is not None  # a preconditioned dim
            chunks = range(len(sizes))
        else:
            chunks = (chunk,)
        return any(keeps(BlockKey(stepping, dim, c)) for c in chunks)

    def _factor_out(self, blocks: list[torch.Tensor], chunk: int) -> torch.Tensor | None:
        """Where an update of factor `blocks[chunk]` writes its result: in place, or into a new
        tensor that takes the block's place when a snapshot holds it (lent); None when this rank
        does not keep that factor (skip the update). The update reads the old values from the
        tensor it held before calling this."""
        old = blocks[chunk]
        if old.numel() == 0:
            return None  # another rank's factor
        if self._lent.pop(id(old), None) is None:
            return old
        blocks[chunk] = torch.empty_like(old)
        return blocks[chunk]

    def _owns(self, index: int) -> bool:
        """Whether parameter `index`'s state tensors are the optimizer's own to lend and replace
        (see Residency.buffered)."""
        return self.residency is None or not self.residency.buffered(index)

    def _install(self, index: int, container, key, value: torch.Tensor) -> None:
        """container[key] <- value for parameter `index`'s state: the tensor takes the old one's
        place (no copy; a snapshot holding the old one keeps it intact), or, when the state is
        in a runtime buffer, its values are copied in."""
        if self._owns(index):
            container[key] = value.contiguous()
        else:
            container[key].copy_(value)

    @contextmanager
    def _resident(self, index: int, state: dict, writes: Writes):
        if self.residency is None:
            yield
            return
        self.residency.acquire(index, state)
        yield  # on an error the state is suspect: it is not written back
        self.residency.release(index, state, writes)

    def _layout(self, index: int, p: torch.Tensor, group: dict) -> Layout:
        """The layout of this rank's part of p (all of it, unless FSDP2 shards it)."""
        shape = tuple(local_shard(p).shape)
        spec = (shape, group["max_precond_dim"], group["block_size"],
                group["merge_dims"], group["precondition_1d"])
        cached = self._layouts.get(index)
        if cached is None or cached[0] != spec:
            layout = make_layout(shape, max_precond_dim=spec[1], block_size=spec[2],
                                 merge=spec[3], precondition_1d=spec[4])
            cached = self._layouts[index] = (spec, layout)
        return cached[1]

    def _locate(self, key: BlockKey) -> tuple[torch.Tensor, dict, Layout]:
        found = self._params_by_index().get(key.param)
        if found is None:
            raise KeyError(f"{key}: no parameter with index {key.param}")
        p, group = found
        layout = self._layout(key.param, p, group)
        sizes = layout.chunks[key.dim] if key.dim < len(layout.chunks) else None
        if sizes is None or not 0 <= key.chunk < len(sizes):
            raise KeyError(f"{key} is not a refresh block (layout {layout})")
        return p, group, layout

    def _params_by_index(self) -> dict[int, tuple[torch.Tensor, dict]]:
        """index -> (parameter, group), kept until the groups change: a boundary looks up
        every block it snapshots or swaps, and a scan per lookup made that quadratic in the
        parameters (seconds per round with thousands of blocks)."""
        shape = tuple((id(g["params"]), len(g["params"])) for g in self.param_groups)
        cached = getattr(self, "_by_index", None)
        if cached is None or cached[0] != shape:
            cached = self._by_index = (shape, {i: (p, g) for i, p, g in self._indexed_params()})
        return cached[1]

    def _block_state(self, p: torch.Tensor, key: BlockKey) -> dict:
        state = self.state.get(p)
        if not state:
            raise KeyError(f"{key}: the parameter has not taken a step yet")
        return state

    def _init_blocks(self, state: dict, layout: Layout, like: torch.Tensor,
                     packed: bool = False) -> None:
        """Zero factors (an empty placeholder where another rank keeps the factor; `packed`:
        the upper triangle only), identity bases, version 0 and no stats step for every
        block."""
        kw: dict[str, Any] = {"dtype": like.dtype, "device": like.device}

        def factor(b: int) -> torch.Tensor:
            return torch.zeros(b * (b + 1) // 2, **kw) if packed else torch.zeros(b, b, **kw)

        state[FACTORS] = [None if sizes is None else
                          [factor(b) if self._keeps(dim, c) else
                           torch.empty(0, **kw) for c, b in enumerate(sizes)]
                          for dim, sizes in enumerate(layout.chunks)]
        state[BASES] = new_blocks(layout, lambda b: torch.eye(b, **kw))
        state[VERSIONS] = [None if s is None else [0] * len(s) for s in layout.chunks]
        state[BASIS_STEPS] = [None if s is None else [-1] * len(s) for s in layout.chunks]

    def _swap_chunk(self, state: dict, name: str, layout: Layout, key: BlockKey,
                    fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """state[name] (work shape) with the chunk of block `key` along its dim replaced by
        fn(chunk). With one chunk on the dim the result takes the old tensor's place; with
        several only the chunk is written, in place, so a swap costs the chunk's size, not the
        whole parameter's per block."""
        sizes = layout.chunks[key.dim]
        assert sizes is not None  # a refresh block's dim
        if len(sizes) == 1:
            self._install(key.param, state, name, fn(state[name]))
            return
        part = chunk_slice(state[name], key.dim, sizes, key.chunk)
        part.copy_(fn(part))

    def _swap_along_dim(self, state: dict, name: str, layout: Layout, key: BlockKey, perm_b,
                        p_bb) -> None:
        """state[name] re-expressed for a swap of block `key`: perm or transport on its chunk."""
        if p_bb is not None:
            self._swap_chunk(state, name, layout, key, lambda x: map_dim_by(x, key.dim, p_bb))
        elif perm_b is not None:
            self._swap_chunk(state, name, layout, key, lambda x: permute_dim(x, key.dim, perm_b))
