"""Request dependencies as Annotated aliases; async because they never block (a plain
`def` dependency would cost every request a thread-pool round trip)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from backend.auth import token_matches
from backend.runs import RunManager
from backend.settings import Settings


async def get_manager(request: Request) -> RunManager:
    return request.app.state.manager


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def has_token(request: Request) -> bool:
    """Whether a read carries the token: it then sees every field (backend/public.py)."""
    return token_matches(request.headers.get("authorization"), request.app.state.token)


async def require_token(request: Request) -> str:
    """401 unless the bearer token matches; returns a client label for the audit log."""
    if not token_matches(request.headers.get("authorization"), request.app.state.token):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    host = request.client.host if request.client else "unknown"
    agent = request.headers.get("user-agent", "")[:60]
    return f"{host} {agent}".strip()


Manager = Annotated[RunManager, Depends(get_manager)]
Client = Annotated[str, Depends(require_token)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Reader = Annotated[bool, Depends(has_token)]
"""True for a read with the token; False for an anonymous one (paths and clients hidden)."""
