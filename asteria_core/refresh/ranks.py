"""The data-parallel exchange: each rank refreshes the blocks it owns, offers their outcomes to
the other ranks and expects theirs, in the order of the swaps (then the due order): the same on
every rank, so the transfers, sent one at a time in that order, arrive as the swaps need them."""

from __future__ import annotations

import time
from functools import partial

from asteria_core.optim.seam import BlockKey
from asteria_core.policy import Policy
from asteria_core.refresh.outstanding import Outcome, Outstanding, barely_moved
from asteria_core.telemetry.labels import IdleCause


class RankExchange:
    def __init__(self, engine, exchange) -> None:
        self.engine, self.exchange = engine, exchange

    def owns(self, key: BlockKey) -> bool:
        return self.exchange.owns(key)

    def trade(self, due, started: dict[BlockKey, Outstanding], t: int,
              early: dict[BlockKey, int]) -> None:
        """Offer this rank's refreshes of `due` and expect the others'."""
        engine = self.engine
        for key in sorted(due, key=lambda key: -early.get(key, 0)):
            size = engine.blocks[key].size
            item = started.get(key)
            if item is not None:
                self.exchange.offer(key, t, size, partial(self._outcome, item))
            else:
                item = Outstanding(key, t, None, delivery=self.exchange.expect(key, t, size),
                                   early=early[key], first=engine.opt.basis_version(key) == 0)
                engine.outstanding[key].append(item)

    def _outcome(self, item: Outstanding) -> Outcome | None:
        """(result, error, unchanged) of this rank's refresh once known, from any thread."""
        if item.result is not None or item.error is not None:
            result, error = item.result, item.error
        elif item.job is not None and item.job.done.is_set():
            result, error = item.job.result, item.job.error
        else:
            return None
        return result, error, barely_moved(item, result, self.engine.skip_below)

    def receive(self, item: Outstanding, policy: Policy) -> None:
        """Another rank's result, waited for (sync_wait) if it has not arrived by its swap."""
        engine = self.engine
        delivery = item.delivery
        assert delivery is not None  # another rank's block: it delivers the result
        if not delivery.done.is_set():
            t0 = time.perf_counter()
            with engine.reporter.wait(IdleCause.SYNC_WAIT):
                arrived = delivery.done.wait(policy.refresh_timeout_ms / 1e3)
            engine.waited_seconds += time.perf_counter() - t0
            if not arrived:
                raise RuntimeError(
                    f"rank {delivery.owner} did not deliver its refresh of block "
                    f"{tuple(item.key)} (statistics of step {item.stats_step}) within "
                    f"refresh_timeout_ms ({policy.refresh_timeout_ms} ms); stopping")
        item.result, item.error = delivery.result, delivery.error
        item.unchanged = delivery.unchanged
