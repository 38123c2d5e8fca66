"""Request dependencies as Annotated aliases; async because they never block (a plain
`def` dependency would cost every request a thread-pool round trip)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import AfterValidator

from backend.auth import Throttled, client_host
from backend.config_schema import plain_text
from backend.runs import RunManager
from backend.settings import Settings

bearer = HTTPBearer(auto_error=False, scheme_name="token",
                    description="The API token: ASTERIA_TOKEN, or the file `token` in the "
                                "server's data folder.")
"""Declares the bearer scheme in the OpenAPI document (Swagger UI's Authorize button) on the
routes that need the token; the comparison itself is TokenGuard's."""


async def get_manager(request: Request) -> RunManager:
    return request.app.state.manager


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def throttled(err: Throttled) -> HTTPException:
    return HTTPException(status.HTTP_429_TOO_MANY_REQUESTS, str(err),
                         headers={"Retry-After": str(err.retry_after)})


def _verify(request: Request) -> bool:
    try:
        return request.app.state.guard.verify(request.headers.get("authorization"),
                                              client_host(request.scope))
    except Throttled as err:
        raise throttled(err) from None


async def has_token(request: Request) -> bool:
    """Whether a read carries the token: it then sees every field (backend/public.py). A wrong
    token reads as anonymous, and counts towards the client's throttle."""
    return _verify(request)


async def require_token(request: Request,
                        _: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
                        ) -> str:
    """401 unless the bearer token matches; returns a client label for the audit log."""
    if not _verify(request):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong bearer token",
                            headers={"WWW-Authenticate": "Bearer"})
    agent = request.headers.get("user-agent", "")[:60]
    return f"{client_host(request.scope)} {agent}".strip()


Manager = Annotated[RunManager, Depends(get_manager)]
Client = Annotated[str, Depends(require_token)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
Reader = Annotated[bool, Depends(has_token)]
"""True for a read with the token; False for an anonymous one (paths and clients hidden)."""
RunIdPath = Annotated[str, Path(description="The run's id.",
                                json_schema_extra={"pattern": "^[^\\x00]+$"}),
                      AfterValidator(plain_text)]
"""A run id in a path: plain text (a NUL byte is refused with 422, not looked up)."""
