"""Results that wait for their swap go where their block's state lives: a block homed on disk
keeps them in a file of the disk tier (tiers/results.py), not in memory."""

from __future__ import annotations

from asteria_core.refresh.outstanding import Outstanding, barely_moved


class Staging:
    def __init__(self, engine) -> None:
        self.engine = engine

    def stage(self, item: Outstanding) -> None:
        """Stage `item`'s result (a worker's once it is done) if its block's results wait in a
        file; `unchanged` is decided first, from its snapshot."""
        engine = self.engine
        if item.staged or not self._stages(item):
            return
        job = item.job
        if job is not None:  # a worker's: decide `unchanged` from its snapshot, then take it
            if not job.done.is_set():
                return
            barely_moved(item, job.result, engine.skip_below)
            item.result, item.error = job.result, job.error
            engine.meter.took(item.key, job.seconds)
            engine.meter.ready(item.released, job)
            job.result = None
        item.staged = True
        if item.result is not None:
            item.result = engine.opt.residency.stage_result(item.result)

    def _stages(self, item: Outstanding) -> bool:
        """Whether its block's results wait in a file: its state lives on disk (a tier store)."""
        stages = getattr(self.engine.opt.residency, "stages_results", None)
        return stages is not None and stages(item.key.param)

    def finished(self) -> None:
        """Results workers finished since the last boundary, staged."""
        for item in self.engine.pending:
            if item.job is not None and not item.staged and item.job.done.is_set():
                self.stage(item)
