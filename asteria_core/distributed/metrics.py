"""Every rank's own /metrics, found by Prometheus through file_sd targets with a `rank` label.

Each rank serves its figures (idle by cause including sync_wait, staleness, refresh work, bytes
exchanged) on `base_port + rank` and writes `<targets_dir>/asteria-rank<r>.yml`, the file_sd
target list deploy/prometheus/prometheus.yml reads (`targets/*.yml`): the target's labels put
`rank` on every series of that rank. Gathering all ranks at rank 0 would add a collective per
scrape and make rank 0's process serve everybody; one endpoint per rank keeps each rank's
numbers its own and costs no communication.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

TARGET_FILE = "asteria-rank{rank}.yml"
"""A rank's file_sd target file (in the targets folder Prometheus reads)."""

if TYPE_CHECKING:  # importing the runtime loads no prometheus_client
    from asteria_core.telemetry.core import Telemetry


def serve_rank_metrics(telemetry: Telemetry, rank: int, *, host: str = "127.0.0.1",
                       base_port: int = 9400, targets_dir: str | Path | None = None,
                       advertise: str | None = None) -> int:
    """Serve this rank's /metrics on base_port + rank (base_port 0: any free port); with
    `targets_dir`, write its file_sd target (`advertise`: the address Prometheus reaches it at,
    default `host`). Returns the port."""
    port = telemetry.serve(host, base_port + rank if base_port else 0)
    if targets_dir is not None:
        folder = Path(targets_dir)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / TARGET_FILE.format(rank=rank)
        scratch = target.with_suffix(".tmp")
        scratch.write_text(f'- targets: ["{advertise or host}:{port}"]\n'
                           f'  labels:\n    rank: "{rank}"\n')
        os.replace(scratch, target)  # Prometheus never reads half a file
    return port
