"""Data: step records (paged), live events (SSE), Prometheus metrics, health."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.sse import EventSourceResponse, ServerSentEvent

from backend.deps import Manager, RunIdPath
from backend.fastlane import LIMIT_DEFAULT, LIMIT_MAX, SINCE_MAX
from backend.schemas import Health, StepPage

router = APIRouter(tags=["data"])
KEEPALIVE_SECONDS = 15.0


async def existing_run(run_id: RunIdPath, manager: Manager) -> str:
    """404 (RunNotFound) before any response starts; the active run needs no store read."""
    if manager.live_run_json(run_id) is None:
        await run_in_threadpool(manager.get, run_id)
    return run_id


RunId = Annotated[str, Depends(existing_run)]


@router.get("/runs/{run_id}/steps", response_model=StepPage,
            responses={404: {"description": "no such run"}})
async def get_steps(run_id: RunId, manager: Manager,
                    since: Annotated[int, Query(ge=0, le=SINCE_MAX)] = 0,
                    limit: Annotated[int, Query(ge=1, le=LIMIT_MAX)] = LIMIT_DEFAULT
                    ) -> Response:
    """Step records after `since`: the active run's newest from memory, the rest from the store."""
    body = manager.live_steps_json(run_id, since, limit)
    if body is not None:
        return Response(body, media_type="application/json")
    steps = await run_in_threadpool(manager.store.steps, run_id, since, limit)
    # The records as stored: `StepPage` documents them (its `steps` are StepRecords); they are
    # the runtime's own JSON, so they are not parsed again on the way out.
    page = {"run_id": run_id, "steps": steps, "next_since": steps[-1]["step"] if steps else since}
    return Response(json.dumps(page), media_type="application/json")


@router.get("/runs/{run_id}/events", response_class=EventSourceResponse,
            responses={404: {"description": "no such run"}})
async def run_events(run_id: RunId, request: Request) -> AsyncIterator[ServerSentEvent]:
    """Live step records, policy changes and status changes of one run."""
    events = request.app.state.events
    sub = events.subscribe(run_id)
    try:
        while True:
            try:
                event = await asyncio.wait_for(sub.queue.get(), KEEPALIVE_SECONDS)
            except TimeoutError:
                yield ServerSentEvent(comment="keepalive")
                continue
            yield ServerSentEvent(raw_data=event.text, event=event.kind)
    finally:
        events.unsubscribe(sub)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}})
def metrics(request: Request) -> Response:
    body, content_type = request.app.state.metrics()
    return Response(content=body, media_type=content_type)


@router.get("/healthz")
def healthz(manager: Manager) -> Health:
    active = manager.active()
    return Health(status="ok", active_run=active.run_id if active else None)
