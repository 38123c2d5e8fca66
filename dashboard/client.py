"""Every HTTP call the dashboard makes: a small client for the Asteria control plane.

    client = Client("http://127.0.0.1:8000", token)
    client.runs(); client.steps(run_id, since=0, limit=2000); client.set_policy(run_id, {...})

Failures come back as `ApiError` subclasses whose text is a sentence for the operator (the
pages show it in a banner); httpx exceptions and tracebacks never reach a page. Reads need no
token; mutating calls send `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import httpx

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novermin: 3.11 and later only
else:  # pragma: no cover - Python 3.10: the standard backport
    from backports.strenum import StrEnum


class RunStatus(StrEnum):
    """A run's status as the API reports it (its `RunStatus` schema; a test holds the two
    equal)."""

    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class RunCommand(StrEnum):
    """What `POST /runs/{id}/{command}` takes (the API's `RunCommand` schema)."""

    PAUSE = "pause"
    RESUME = "resume"
    STOP = "stop"
    CHECKPOINT = "checkpoint"


ACTIVE = (RunStatus.RUNNING, RunStatus.PAUSED)
"""Run statuses whose run is still training (or can be unpaused without a restart)."""
RESUMABLE = (RunStatus.PAUSED, RunStatus.STOPPED, RunStatus.INTERRUPTED, RunStatus.FAILED)
"""Statuses whose run the Resume command continues (a paused one, or one from its checkpoint)."""

DEFAULT_URL = "http://127.0.0.1:8000"
TIMEOUT = httpx.Timeout(5.0, connect=2.0)

_lock = threading.Lock()
_http: httpx.Client | None = None


def _shared_http() -> httpx.Client:
    """One connection pool for the whole dashboard process (httpx clients are thread-safe)."""
    global _http
    with _lock:
        if _http is None:
            _http = httpx.Client(timeout=TIMEOUT)
        return _http


class ApiError(Exception):
    """A call to the control plane failed; str(err) says what happened and what to do."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Unreachable(ApiError):
    """Nothing answered at the URL (refused, timed out, bad address)."""


class Unauthorized(ApiError):
    """401: the token is missing or wrong."""


class NotSignedIn(ApiError):
    """A change was asked for by a browser session that has not signed in to the dashboard."""


class NotFound(ApiError):
    """404: no such run (or no such route: the URL is not a control plane)."""


class Conflict(ApiError):
    """409: the run's state does not allow this (not active, already active)."""


class Invalid(ApiError):
    """422: the server rejected the input; `errors` are its (field, message) pairs, verbatim."""

    def __init__(self, message: str, errors: list[tuple[str, str]]) -> None:
        super().__init__(message, 422)
        self.errors = errors


def _field(loc: list[Any]) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


def without_field(field: str, message: str) -> str:
    """`message` without a leading "<field>: " (the policy's and the config's errors name their
    field, and a page that shows the field already would repeat it)."""
    head, sep, rest = message.partition(": ")
    if sep and (head == field or field.endswith("." + head)):
        return rest
    return message


def _detail(response: httpx.Response) -> Any:
    try:
        return response.json().get("detail", response.text)
    except ValueError:
        return response.text


def _raise_for(response: httpx.Response, what: str) -> None:
    code = response.status_code
    if code < 400:
        return
    detail = _detail(response)
    if code == 401:
        raise Unauthorized(f"{what}: the control plane refused the token (401) this dashboard "
                           "holds; set ASTERIA_TOKEN or ASTERIA_TOKEN_FILE where it runs.", code)
    if code == 422 and isinstance(detail, list):
        errors = [(_field(e.get("loc", [])), str(e.get("msg", e))) for e in detail]
        text = "; ".join(f"{f}: {without_field(f, m)}" for f, m in errors)
        raise Invalid(f"{what}: rejected (422): {text}", errors)
    text = detail if isinstance(detail, str) else str(detail)
    kind = {404: NotFound, 409: Conflict}.get(code, ApiError)
    raise kind(f"{what}: {text} ({code})", code)


class Client:
    """The control plane at `url`; `token` is only sent on mutating calls."""

    def __init__(self, url: str = DEFAULT_URL, token: str = "") -> None:
        self.url = url.strip().rstrip("/") or DEFAULT_URL
        self.token = token.strip()

    def _call(self, method: str, path: str, what: str, *, json: Any = None,
              params: dict[str, Any] | None = None, auth: bool = False) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if auth and self.token else {}
        try:
            response = _shared_http().request(method, self.url + path, json=json,
                                              params=params, headers=headers)
        except httpx.TimeoutException:
            raise Unreachable(f"{what}: the control plane at {self.url} did not answer in "
                              "time.") from None
        except (httpx.TransportError, httpx.InvalidURL, httpx.UnsupportedProtocol) as err:
            raise Unreachable(f"{what}: cannot reach the control plane at {self.url} "
                              f"({type(err).__name__}: {err}). Is `asteria serve` (or "
                              "`asteria start`) running? Check the URL in the sidebar or "
                              "ASTERIA_URL.") from None
        _raise_for(response, what)
        return response

    def _json(self, method: str, path: str, what: str, **kw: Any) -> Any:
        response = self._call(method, path, what, **kw)
        try:
            return response.json()
        except ValueError:
            raise ApiError(f"{what}: {self.url} answered something that is not JSON; is it "
                           "an Asteria control plane?", response.status_code) from None

    # ------------------------------------------------------------------ reads
    def health(self) -> dict[str, Any]:
        return self._json("GET", "/healthz", "health check")

    def runs(self) -> list[dict[str, Any]]:
        return self._json("GET", "/runs", "list runs")

    def run(self, run_id: str) -> dict[str, Any]:
        return self._json("GET", f"/runs/{run_id}", f"run {run_id}")

    def policy(self, run_id: str) -> dict[str, Any]:
        return self._json("GET", f"/runs/{run_id}/policy", f"policy of {run_id}")

    def policy_history(self, run_id: str) -> list[dict[str, Any]]:
        return self._json("GET", f"/runs/{run_id}/policy/history", f"policy history of {run_id}")

    def steps(self, run_id: str, *, since: int = 0, limit: int = 1000) -> dict[str, Any]:
        return self._json("GET", f"/runs/{run_id}/steps", f"steps of {run_id}",
                          params={"since": since, "limit": limit})

    def ranks(self, run_id: str) -> dict[str, Any]:
        """Every rank of a data-parallel run, read now by the control plane (RanksPublic)."""
        return self._json("GET", f"/runs/{run_id}/ranks", f"ranks of {run_id}")

    def autopilot(self, run_id: str) -> dict[str, Any]:
        """The active run's autopilot: config, proposals (newest last), decision counts."""
        return self._json("GET", f"/runs/{run_id}/autopilot", f"autopilot of {run_id}")

    def openapi(self) -> dict[str, Any]:
        """The control plane's OpenAPI document (the policy form is built from it)."""
        return self._json("GET", "/openapi.json", "API description")

    # ------------------------------------------------------------------ writes (token)
    def start_run(self, config: dict[str, dict[str, Any]],
                  policy: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._json("POST", "/runs", "start a run", auth=True,
                          json={"config": config, "policy": policy or {}})

    def command(self, run_id: str, command: str) -> dict[str, Any]:
        if command not in tuple(RunCommand):
            raise ValueError(f"command: got {command!r}; allowed: {' | '.join(RunCommand)}")
        return self._json("POST", f"/runs/{run_id}/{command}", f"{command} {run_id}", auth=True)

    def set_autopilot(self, run_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """PATCH the autopilot's settings (mode off: the kill switch); raises Invalid."""
        return self._json("PATCH", f"/runs/{run_id}/autopilot", "change the autopilot",
                          auth=True, json=changes)

    def answer_proposal(self, run_id: str, proposal_id: int, answer: str) -> dict[str, Any]:
        """Accept or dismiss one of the autopilot's open proposals."""
        if answer not in ("accept", "dismiss"):
            raise ValueError(f"answer: got {answer!r}; allowed: accept | dismiss")
        return self._json("POST", f"/runs/{run_id}/autopilot/proposals/{int(proposal_id)}/"
                          f"{answer}", f"{answer} proposal {proposal_id}", auth=True)

    def set_policy(self, run_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        """PATCH the policy; answers {version, effective_step, diff} or raises Invalid."""
        return self._json("PATCH", f"/runs/{run_id}/policy", "change the policy", auth=True,
                          json=changes)
