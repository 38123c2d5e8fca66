"""Every rank of the active data-parallel run: its place, whether it answers, its figures."""

from __future__ import annotations

import threading

from fastapi import APIRouter, Request

from backend.deps import Manager, Reader, RunIdPath
from backend.ranks import TARGETS_DIR, RankScraper, RanksPublic, anonymous

router = APIRouter(tags=["runs"])


_made = threading.Lock()


def scraper(request: Request) -> RankScraper:
    """The app's one scraper (its cache is what bounds the scrapes), made at the first read."""
    state = request.app.state
    with _made:
        if getattr(state, "ranks", None) is None:
            state.ranks = RankScraper(state.settings.data_dir / TARGETS_DIR)
        return state.ranks


@router.get("/runs/{run_id}/ranks", responses={404: {"description": "no such run"}})
def get_ranks(run_id: RunIdPath, request: Request, manager: Manager, reader: Reader) -> RanksPublic:
    """One entry per rank of the active data-parallel run, read now: rank 0's figures from its
    telemetry, every other rank's from its /metrics (the address in its file_sd target file
    under the data dir's `targets/`). A rank that does not answer is listed as unreachable,
    with the reason. A single-process or past run: `data_parallel` false and no entries. Without
    the token, addresses are hidden and each reason shortened to its kind."""
    manager.get(run_id)  # 404 first
    active = manager.active()
    runtime = active.runtime if active is not None and active.run_id == run_id else None
    view = scraper(request).view(run_id, runtime)
    return view if reader else anonymous(view)
