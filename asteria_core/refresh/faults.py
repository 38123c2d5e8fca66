"""Refreshes that fail: the previous basis is kept and the failure counted; `failure_limit`
consecutive failures of one block stop the run with `RefreshFailed`. (Hangs: pool.py.)"""

from __future__ import annotations

import logging

from asteria_core.optim.seam import BlockKey
from asteria_core.refresh.outstanding import Outstanding

log = logging.getLogger(__name__)


class RefreshFailed(RuntimeError):
    """A block's refresh failed `failure_limit` times in a row; the run stops."""


class Failures:
    """Consecutive failures of each block's refreshes."""

    def __init__(self, keys) -> None:
        self._consecutive: dict[BlockKey, int] = dict.fromkeys(keys, 0)

    def succeeded(self, key: BlockKey) -> None:
        self._consecutive[key] = 0

    def failed(self, item: Outstanding, failure_limit: int) -> None:
        """`item`'s refresh failed: logged, and RefreshFailed at the limit."""
        key = item.key
        self._consecutive[key] += 1
        why = (item.error or "non-finite values in the result").strip().splitlines()[-1]
        log.warning("refresh of block %s from step %d failed (%s); keeping the previous basis",
                    key, item.stats_step, why)
        if self._consecutive[key] >= failure_limit:
            raise RefreshFailed(f"refresh of block {tuple(key)} failed "
                                f"{self._consecutive[key]} times in a row (failure_limit "
                                f"{failure_limit}); last error: {why}")
