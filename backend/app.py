"""The control plane: a FastAPI app hosted by the trainer process.

`create_app(settings)` wires the run store, the run manager, live events and auth; the lifespan
marks runs left active by a dead process as interrupted and starts the default run, or attaches
a user's runtime (`create_app(settings, attach=runtime)`, what `backend.serve` does).
"""

from __future__ import annotations

import html
import logging
import math
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, Response, status
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.middleware.trustedhost import TrustedHostMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Receive, Scope, Send
from swagger_ui_bundle import swagger_ui_path

from asteria_core.autopilot import AutopilotError, NoProposal, ProposalNotOpen
from asteria_core.policy import PolicyError
from asteria_core.runtime import Runtime
from asteria_core.train.config import ConfigError, RunConfig, TrainConfig
from backend.auth import Throttled, TokenGuard, client_host, load_or_create_token
from backend.config_schema import in_settings_words
from backend.deps import require_token
from backend.events import Broadcaster
from backend.fastlane import LiveReadFastLane
from backend.routes import autopilot, data, policy, ranks, runs
from backend.runs import RunConflict, RunManager, RunNotFound
from backend.settings import Settings, get_settings
from backend.store import RunStore, StoreError

log = logging.getLogger(__name__)


def default_run_config() -> RunConfig:
    """The embedded default run, with periodic checkpoints so a crash loses little."""
    return RunConfig(train=TrainConfig(checkpoint_interval=100))


def json_safe(value: Any) -> Any:
    """`value` with what JSON text cannot hold written out: a non-finite number as its name
    ("nan", "inf", "-inf"), a lone surrogate as a \\udxxx escape. An error echoes its input,
    and Python's json reads NaN, Infinity, 1e400 and "\\ud800" into one."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


class ErrorResponse(JSONResponse):
    """An error answer, rendered whatever input it names (json_safe)."""

    def render(self, content: Any) -> bytes:
        return super().render(json_safe(jsonable_encoder(content)))


def _error(code: int, loc: list[int | str], msg: str, kind: str) -> JSONResponse:
    return ErrorResponse({"detail": [{"loc": loc, "msg": msg, "type": kind}]}, status_code=code)


API_MODULES = (runs, policy, autopilot, data, ranks)


def _routes(app: FastAPI) -> list[BaseRoute]:
    """Every route: the app's own (docs) and those of the API's routers, which include_router
    wraps so that they show no path or methods of their own."""
    return [*app.router.routes, *(r for m in API_MODULES for r in m.router.routes)]


def _allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method any route serves at this path (Starlette lists only the first route's)."""
    scope = {**scope, "root_path": scope.get("app_root_path", "")}  # inside a mount: the app's
    methods: set[str] = set()
    for route in _routes(app):
        if route.matches(scope)[0] == Match.NONE:
            continue
        if isinstance(route, Mount):  # the docs' static files
            methods.update(("GET", "HEAD"))
        else:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


def _needs_token(route: BaseRoute) -> bool:
    def calls(dependant) -> bool:
        return any(d.call is require_token or calls(d) for d in dependant.dependencies)

    dependant = getattr(route, "dependant", None)
    return dependant is not None and calls(dependant)


class TokenFirst:
    """A request to a route that needs the token is answered 401 (429 for a client throttled
    after wrong tokens) before anything reads its body: FastAPI parses and validates a body
    before it runs the route's dependencies, which would tell anyone without the token what
    the API accepts (and make it parse their bytes)."""

    def __init__(self, app: ASGIApp, routes: Callable[[], list[BaseRoute]]) -> None:
        self.app, self._routes = app, routes
        self._guarded: list[BaseRoute] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in ("GET", "HEAD", "OPTIONS"):
            if self._guarded is None:
                self._guarded = [r for r in self._routes() if _needs_token(r)]
            if any(r.matches(scope)[0] == Match.FULL for r in self._guarded):
                response = self._refusal(scope)
                if response is not None:
                    await response(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    @staticmethod
    def _refusal(scope: Scope) -> JSONResponse | None:
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        try:
            if scope["app"].state.guard.verify(header, client_host(scope)):
                return None
        except Throttled as err:
            return JSONResponse({"detail": str(err)}, 429,
                                headers={"Retry-After": str(err.retry_after)})
        return JSONResponse({"detail": "missing or wrong bearer token"}, 401,
                            headers={"WWW-Authenticate": "Bearer"})


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        if err.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
            allow = ", ".join(_allowed_methods(app, request.scope))
            err = StarletteHTTPException(405, err.detail, headers={"Allow": allow})
        return await http_exception_handler(request, err)

    @app.exception_handler(RequestValidationError)
    def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        return ErrorResponse({"detail": in_settings_words(err.errors())}, 422)

    @app.exception_handler(RunNotFound)
    def not_found(_: Request, err: RunNotFound) -> JSONResponse:
        return ErrorResponse({"detail": f"no run {err.args[0]!r}"}, status.HTTP_404_NOT_FOUND)

    @app.exception_handler(RunConflict)
    def conflict(_: Request, err: RunConflict) -> JSONResponse:
        return ErrorResponse({"detail": str(err)}, status.HTTP_409_CONFLICT)

    @app.exception_handler(NoProposal)
    def no_proposal(_: Request, err: NoProposal) -> JSONResponse:
        return ErrorResponse({"detail": str(err)}, status.HTTP_404_NOT_FOUND)

    @app.exception_handler(ProposalNotOpen)
    def proposal_not_open(_: Request, err: ProposalNotOpen) -> JSONResponse:
        return ErrorResponse({"detail": str(err)}, status.HTTP_409_CONFLICT)

    @app.exception_handler(AutopilotError)
    def bad_autopilot(_: Request, err: AutopilotError) -> JSONResponse:
        where = [int(p) if p.isdigit() else p for p in err.field.split(".")]  # bounds.workers.0
        return _error(422, ["body", *where], str(err), "autopilot_error")

    @app.exception_handler(PolicyError)
    def bad_policy(_: Request, err: PolicyError) -> JSONResponse:
        return _error(422, ["body", err.field], str(err), "policy_error")

    @app.exception_handler(StoreError)
    def store_failed(_: Request, err: StoreError) -> JSONResponse:
        # Logged by the store's writer, which goes on serving; this request alone fails. The
        # cause is the server's (a full disk, most often), so the same request may pass later.
        return ErrorResponse({"detail": str(err)}, status.HTTP_503_SERVICE_UNAVAILABLE,
                             headers={"Retry-After": "5"})

    @app.exception_handler(ConfigError)
    def bad_config(_: Request, err: ConfigError) -> JSONResponse:
        return _error(422, ["body", "config", *_config_key(str(err)).split(".")], str(err),
                      "config_error")


def _config_key(message: str) -> str:
    """The dotted key a ConfigError names: "optim.lr: got ..." or, for a key the section does
    not have, "unknown config key 'optim.lrr'; allowed ..." (written as repr: escaped)."""
    if unknown := re.match(r"unknown config key '([^']*)'", message):
        return unknown.group(1)
    return message.split(":", 1)[0].strip()


DOCS_ASSETS = "/docs/assets"


def _install_docs(app: FastAPI) -> None:
    """Swagger UI at /docs from the files the swagger-ui-bundle-v2 package ships (FastAPI's
    default page loads them from a CDN, so it is blank on a machine without internet). No ReDoc:
    its page would load its script from a CDN too, and /docs renders the same document."""
    app.mount(DOCS_ASSETS, StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        assert app.openapi_url is not None  # FastAPI's default: the app serves its document
        return get_swagger_ui_html(
            openapi_url=app.openapi_url, title=f"{app.title} - API docs",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
            swagger_ui_parameters={"validatorUrl": None})  # no badge from validator.swagger.io


def _metrics(app: FastAPI) -> tuple[bytes, str]:
    """The exposition of the newest run's telemetry (kept after it ends), or an empty one,
    followed by the control plane's own (the token guard's counters)."""
    telemetry = app.state.manager.last_telemetry
    if telemetry is not None:
        run, content_type = telemetry.exposition()
    else:
        run, content_type = generate_latest(CollectorRegistry()), CONTENT_TYPE_LATEST
    return run + app.state.guard.exposition(), content_type


def _install_landing(app: FastAPI, settings: Settings) -> None:
    """GET /: the first URL `asteria start` prints, a page of links to what this server has."""
    dashboard = (f'<li><a href="{html.escape(settings.dashboard_url)}">the dashboard</a>: watch '
                 "and steer the run</li>") if settings.dashboard_url else \
        "<li>the dashboard: started by <code>asteria start</code> (port 8501 by default)</li>"
    title = html.escape(app.title)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title></head>
<body style="font-family: sans-serif; max-width: 44em; margin: 2em auto">
<h1>{title}</h1>
<p>{html.escape(app.description)}</p>
<ul>
<li><a href="/docs">/docs</a>: the API, to try out (Authorize with the token for changes)</li>
<li><a href="/healthz">/healthz</a>: whether a run is training, and which</li>
<li><a href="/runs">/runs</a>: every run, newest first</li>
<li><a href="/metrics">/metrics</a>: Prometheus metrics of the newest run</li>
{dashboard}
</ul>
</body></html>
"""

    @app.get("/", include_in_schema=False)
    def landing() -> HTMLResponse:
        return HTMLResponse(page)


LOCAL_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARD_BINDS = ("", "0.0.0.0", "::")


def served_names(settings: Settings) -> list[str]:
    """The names a request's Host header may give: loopback's, the bound address (not a
    wildcard: that names no host) and the operator's allowed_hosts."""
    names = [*LOCAL_NAMES, *settings.allowed_hosts]
    if settings.host not in WILDCARD_BINDS:
        names.append(f"[{settings.host}]" if ":" in settings.host else settings.host.lower())
    return names


def create_app(settings: Settings | None = None, default_config: RunConfig | None = None, *,
               attach: Runtime | None = None, total_steps: int = 0) -> FastAPI:
    """The app; `default_config` is the run started at start-up (if settings allow), `attach`
    a user's runtime served as the active run instead (then no default run starts)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = RunStore(settings.resolved_db_path, flush_seconds=settings.store_flush_seconds,
                         data_dir=settings.data_dir)
        interrupted = store.mark_interrupted()
        if interrupted:
            log.warning("runs left active by a previous process, now interrupted: %s",
                        ", ".join(interrupted))
        token, created = load_or_create_token(settings.token, settings.resolved_token_file)
        if created:
            print(f"asteria: API token (saved to {settings.resolved_token_file}, mode 0600): "
                  f"{token}", flush=True)
        app.state.store, app.state.token, app.state.settings = store, token, settings
        app.state.guard = TokenGuard(token, settings.auth_failures_burst,
                                     settings.auth_failures_window_seconds)
        app.state.events = Broadcaster()
        app.state.manager = RunManager(store, app.state.events, settings.runs_dir,
                                       live_window=settings.live_steps_window)
        app.state.metrics = lambda: _metrics(app)
        if attach is not None:
            app.state.manager.attach(attach, total_steps=total_steps)
        elif settings.start_default_run:
            app.state.manager.start(default_config or default_run_config())
        try:
            yield
        finally:
            app.state.manager.shutdown()
            store.close()

    app = FastAPI(
        title="Asteria control plane",
        version="0.1.0",
        description="Runs, live policy, step records, live events and metrics of an Asteria "
                    "trainer. Mutating routes need `Authorization: Bearer <token>`.",
        lifespan=lifespan,
        docs_url=None,  # _install_docs: served from the package, not a CDN
        redoc_url=None,
        max_body_size=settings.max_body_bytes,
        responses={400: {"description": "malformed request, or a Host header that names none "
                                        "of the served names (allowed_hosts)"},
                   413: {"description": "request body too large"},
                   422: {"description": "invalid input; the message names the field"},
                   429: {"description": "too many wrong tokens from this client; retry after "
                                        "the Retry-After header's seconds"}},
    )
    app.add_middleware(LiveReadFastLane)  # added first: CORS, when on, wraps it too
    app.add_middleware(TokenFirst, routes=lambda: _routes(app))
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "POST", "PATCH"],
                           allow_headers=["Authorization", "Content-Type"])
    # Outermost: a Host the server does not answer to gets 400 before anything else runs.
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=served_names(settings),
                       www_redirect=False)
    _install_error_handlers(app)
    _install_docs(app)
    _install_landing(app, settings)
    for module in API_MODULES:
        app.include_router(module.router)
    return app
