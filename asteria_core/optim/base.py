"""Shared machinery of SOAP, Shampoo and KL-Shampoo: the step, the refresh seam, checkpoints.

A step has two parts. The per-step math (subclasses' `_step_param`) updates factors and moments
and applies the parameter update with the basis currently in use. The step boundary (end of
`step`) first swaps in every pending refresh result whose swap step has come, then, in native
mode, refreshes the blocks that fell due, through the same `snapshot` -> `refresh_fn` ->
`apply_refresh` path a runtime uses. With `refresh_delay = d` a result computed from the
statistics of step t is swapped in at the boundary of step t + d and first used by step t + d + 1;
d = 0 is the references' own order. With `external_refresh = True` the boundary never refreshes:
a runtime reads `due_blocks()` after each step and drives the seam itself.

`BlockPreconditioner` owns the step and the seam; the work behind them is its collaborators',
one job each: `blocks` (blocks.py: parameters by index, layouts, the block a key names),
`factors` (factors.py: factor statistics, copy on write, handover between ranks), `bases`
(bases.py: the bases in use and their swap) and `timeline` (timeline.py: the seam's clock).
Where a runtime keeps the state between uses is residency.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from asteria_core.optim.bases import Bases
from asteria_core.optim.blocks import ParamBlocks
from asteria_core.optim.factors import FactorStatistics
from asteria_core.optim.layout import Layout
from asteria_core.optim.residency import Residency, Writes, owns, resident
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
from asteria_core.optim.shards import local_shard
from asteria_core.optim.state_keys import (
    BASES,
    BASIS_STEPS,
    EXP_AVG,
    FACTORS,
    STEP,
    VERSIONS,
)
from asteria_core.optim.timeline import RefreshTimeline

__all__ = [
    "BASES", "BASIS_STEPS", "EXP_AVG", "EXTRA", "FACTORS", "STEP", "VERSIONS",
    "BlockKey", "BlockPreconditioner", "Residency", "Writes", "check_choice",
    "check_layout_args", "check_range", "local_shard",
]

EXTRA = "asteria"  # optimizer-level entry added to state_dict()


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
        self.timeline = RefreshTimeline(refresh_delay)
        self.external_refresh = False
        """When True, step() never refreshes; a runtime drives snapshot/refresh_fn/apply_refresh."""
        self.refresh_failures = 0
        """Refreshes (native mode) that raised or returned non-finite values; basis kept."""
        self.residency: Residency | None = None
        """Set by a tier store: state may live off the device between uses (see Residency)."""
        self.keeps_factor: Callable[[BlockKey], bool] | None = None
        """Set by a data-parallel runtime to `key -> bool`: this rank holds and updates only the
        factor statistics of the blocks it refreshes (their owner); the others' factors are
        empty placeholders. None: every factor is kept (one process)."""
        self.blocks = ParamBlocks(self)
        self.factors = FactorStatistics(self, self.blocks)
        self.bases = Bases(self, self.blocks)

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

    def _apply_refresh(self, key: BlockKey, result: RefreshResult, state: dict,
                       layout: Layout) -> None:
        """The swap of `result` into block `key`, its state resident (subclasses add to it)."""
        self.bases.swap(key, result, state,
                        lambda perm_b, p_bb: self._swap_moments(state, layout, key, perm_b, p_bb))

    # ---- properties -----------------------------------------------------------------------
    @property
    def refresh_delay(self) -> int:
        """d: a refresh computed from step-t statistics is swapped in at the boundary of t + d."""
        return self.timeline.delay

    @refresh_delay.setter
    def refresh_delay(self, value: int) -> None:
        self.timeline.delay = value

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
        return self.timeline.num_steps

    # ---- the step -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.timeline.num_steps += 1
        due: list[BlockKey] = []
        if self.residency is not None:
            self.residency.begin_step([i for i, p, _ in self.blocks.indexed()
                                       if p.grad is not None])
        for index, p, group in self.blocks.indexed():
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise TypeError(f"{type(self).__name__} does not support sparse gradients")
            shard = local_shard(p)
            if shard.numel() == 0:
                continue  # FSDP2 left this rank no rows of it
            layout = self.blocks.layout(index, p, group)
            grad = local_shard(p.grad).reshape(layout.shape)
            self.factors.stepping = (index, layout)
            with resident(self.residency, index, self.state[p], Writes.STEP):
                refresh_due = self._step_param(shard, grad, self.state[p], layout, group)
            if refresh_due:
                due.extend(BlockKey(index, dim, c) for dim, c, _ in layout.blocks())
        self._boundary(due)
        return loss

    def _boundary(self, due: list[BlockKey]) -> None:
        for ready in self.timeline.take_ready():
            self.apply_refresh(ready.key, ready)
        self.timeline.due = tuple(due)
        if self.external_refresh:
            return
        for key in due:
            try:
                result = refresh_fn(self.snapshot(key, lend=True), self.refresh_config(key))
            except torch.linalg.LinAlgError:
                result = None
            if result is None or not is_finite(result):
                self.refresh_failures += 1
                continue
            if self.refresh_delay == 0 or result.base_version == 0:  # a first basis at once
                self.apply_refresh(key, result)
            else:
                self.schedule_refresh(self.num_steps + self.refresh_delay, result)

    # ---- the seam API ---------------------------------------------------------------------
    def refresh_blocks(self) -> list[BlockInfo]:
        """Every refresh block of every parameter, in a fixed order (known before step 1)."""
        return self.blocks.infos()

    def due_blocks(self) -> tuple[BlockKey, ...]:
        """Blocks whose refresh fell due at the last step (same in native and external mode)."""
        return self.timeline.due

    def schedule_refresh(self, step: int, result: RefreshResult) -> None:
        """Hand over a computed result to be swapped in at the boundary of `step` (> num_steps).

        Scheduled results are part of state_dict(), so a runtime can settle its in-flight work
        into the optimizer before a checkpoint and a resumed run swaps it in on time. Results
        due at the same boundary are swapped in the order they were scheduled.
        """
        if step <= self.num_steps:
            raise ValueError(f"step: got {step}; allowed: > num_steps ({self.num_steps})")
        self._locate(result.key)
        self.timeline.add(step, result)

    def pending_refreshes(self) -> list[tuple[int, BlockKey]]:
        """(swap step, key) of scheduled results not yet swapped in (native delay or runtime)."""
        return self.timeline.pending()

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
        state = self.blocks.state(p, key)
        config = self._block_refresh_config(group, layout, key.dim)
        lend = lend and device is None and owns(self.residency, key.param)

        def take(t: torch.Tensor) -> torch.Tensor:
            if lend:
                return t
            if device is None:
                return t.clone()
            return t.to(device, non_blocking=non_blocking, copy=True)

        with resident(self.residency, key.param, state, Writes.NONE):
            factor = state[FACTORS][key.dim][key.chunk]
            if factor.numel() == 0:
                raise KeyError(f"{key}: its factor statistics are kept by its owner rank")
            if lend:
                self.factors.lend(factor)
            basis = state[BASES][key.dim][key.chunk]
            return FactorSnapshot(key=key, stats_step=self.num_steps,
                                  base_version=state[VERSIONS][key.dim][key.chunk],
                                  factor=take(factor),
                                  basis=take(basis) if config.needs_basis else None,
                                  scale=self._snapshot_scale(state, group))

    def apply_refresh(self, key: BlockKey, result: RefreshResult) -> None:
        """Swap a refresh result into block `key` (call between steps; see `Bases.swap`)."""
        if result.key != key:
            raise ValueError(f"result for {result.key} applied to block {key}")
        p, group, layout = self._locate(key)
        state = self.blocks.state(p, key)
        with resident(self.residency, key.param, state, Writes.ALL):
            self._apply_refresh(key, result, state, layout)

    def basis_step(self, key: BlockKey) -> int:
        """The step whose statistics made the basis in use (-1: initial identity)."""
        return self.bases.stats_step(key)

    def basis_version(self, key: BlockKey) -> int:
        return self.bases.version(key)

    def _locate(self, key: BlockKey) -> tuple[torch.Tensor, dict, Layout]:
        """(parameter, group, layout) of block `key` (`ParamBlocks.locate`)."""
        return self.blocks.locate(key)

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.residency is not None:  # state that lives off the device, read back in
            state["state"] = self.residency.materialized(state["state"])
        state[EXTRA] = {"num_steps": self.num_steps, "refresh_failures": self.refresh_failures,
                        "pending": self.timeline.pending_dicts()}
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        extra = state_dict.pop(EXTRA, None)
        super().load_state_dict(state_dict)
        if extra is None:
            raise ValueError(f"state_dict has no {EXTRA!r} entry: not saved by "
                             f"{type(self).__name__}")
        self.timeline.restore(extra["num_steps"], extra["pending"])
        self.refresh_failures = extra["refresh_failures"]
        self.factors.forget_lent()
        if self.residency is not None:
            self.residency.adopt_all()

    def state_spec(self, index: int) -> dict:
        """The state parameter `index` will hold after its first update, as meta tensors (a dry
        run of the per-step math on the meta device: shapes and dtypes, no memory, no values)."""
        for i, p, group in self.blocks.indexed():
            if i == index:
                layout = self.blocks.layout(index, p, group)
                p_meta = torch.empty_like(local_shard(p), device="meta")
                state: dict = {}
                self.factors.stepping = (index, layout)
                self._step_param(p_meta, torch.empty(layout.shape, dtype=p.dtype, device="meta"),
                                 state, layout, group)
                return state
        raise KeyError(f"no parameter with index {index}")
