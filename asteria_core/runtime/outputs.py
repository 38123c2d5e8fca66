"""Where the runtime writes completed step records besides telemetry: the JSONL file, when the
config names one, and the experiment trackers the telemetry config names, on rank 0 only (one
run, logged once). Each is a record listener; all are closed with the runtime."""

from __future__ import annotations

from pathlib import Path

from asteria_core.runtime.callbacks import Listener
from asteria_core.telemetry.config import TelemetryConfig
from asteria_core.telemetry.records import JsonlWriter
from asteria_core.telemetry.trackers import Tracker, open_trackers


class RecordOutputs:
    def __init__(self, records: str | Path | None, telemetry: TelemetryConfig | None, *,
                 run_dir: Path, run_id: str, rank: int) -> None:
        self.jsonl = JsonlWriter(Path(records)) if records is not None else None
        self.trackers: list[Tracker] = []
        if telemetry is not None and telemetry.trackers and rank == 0:
            folder = Path(telemetry.trackers_dir) if telemetry.trackers_dir else \
                run_dir / "trackers"
            self.trackers = open_trackers(telemetry.trackers, folder, run_id)

    @property
    def listeners(self) -> list[Listener]:
        return ([self.jsonl] if self.jsonl is not None else []) + list(self.trackers)

    def close(self) -> None:
        if self.jsonl is not None:
            self.jsonl.close()
        for tracker in self.trackers:
            tracker.close()
