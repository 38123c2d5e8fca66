"""A fast lane for the two reads that dashboards poll: the active run and its newest steps.

The control plane shares a process, and so the GIL, with the training thread: every
microsecond of Python a request runs is a microsecond training may wait. FastAPI's routing,
dependency solving and response validation cost a few hundred microseconds per request, which
at a few hundred polls a second slows training measurably. This ASGI middleware answers
`GET /runs/{active run}` and `GET /runs/{active run}/steps?since=&limit=` straight from the live
view's pre-serialized JSON. Anything else, including a query it does not fully understand or
accept (the route then answers 422 with its usual message), falls through to the app unchanged,
so the routes, their OpenAPI schema and their errors stay the single definition of the API.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Receive, Scope, Send

from backend.auth import client_host

# Kept equal to the /steps route's Query(...) bounds (backend/routes/data.py).
SINCE_MAX = 2**53
LIMIT_MAX = 10_000
LIMIT_DEFAULT = 1000


class LiveReadFastLane:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            body = self._answer(scope)
            if body is not None:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _answer(scope: Scope) -> bytes | None:
        manager = getattr(scope["app"].state, "manager", None)
        if manager is None:
            return None
        active = manager.active()
        if active is None:
            return None
        prefix = f"/runs/{active.run_id}"
        path = scope["path"]
        if path == prefix and not scope["query_string"]:
            header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
            guard, client = scope["app"].state.guard, client_host(scope)
            if guard.throttled(header, client):
                return None  # the route answers 429
            anonymous = not guard.verify(header, client)
            return manager.live_run_json(active.run_id, anonymous=anonymous)
        if path == prefix + "/steps":
            query = _steps_query(scope["query_string"])
            if query is not None:
                return manager.live_steps_json(active.run_id, *query)
        return None


def _steps_query(raw: bytes) -> tuple[int, int] | None:
    """(since, limit) when the query is exactly what the route accepts; else None."""
    values = {"since": 0, "limit": LIMIT_DEFAULT}
    try:
        pairs = parse_qsl(raw.decode("ascii"), strict_parsing=bool(raw))
    except (UnicodeDecodeError, ValueError):
        return None
    seen = set()
    for key, text in pairs:
        if key not in values or key in seen or not text.isdigit():
            return None
        seen.add(key)
        values[key] = int(text)
    if values["since"] > SINCE_MAX or not 1 <= values["limit"] <= LIMIT_MAX:
        return None
    return values["since"], values["limit"]
