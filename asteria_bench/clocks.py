"""The training thread's CPU inside an optimizer's basis swaps, for the suites that time them."""

from __future__ import annotations

import time


class SwapClock:
    """The training thread's CPU inside the optimizer's basis swaps (`apply_refresh`: installing
    a new basis and re-expressing the moments in it); zero for an optimizer without them."""

    def __init__(self, optimizer) -> None:
        self.seconds = 0.0
        apply = getattr(optimizer, "apply_refresh", None)
        if apply is None:
            return

        def timed(key, result):
            t0 = time.thread_time()
            try:
                return apply(key, result)
            finally:
                self.seconds += time.thread_time() - t0
        optimizer.apply_refresh = timed
