"""Settings from the environment, the session's connection, sign-in and selection, cached reads.

Environment: ASTERIA_URL (default http://127.0.0.1:8000; a browser cannot change it); the API token
from ASTERIA_TOKEN, else the file ASTERIA_TOKEN_FILE, else <ASTERIA_DATA_DIR or
asteria-data>/token (what `asteria serve` writes). The API token stays in this process: it is
never sent to a browser. Reads need no token; a browser session may change things (policy,
commands, new runs) only after signing in with the sign-in token: ASTERIA_DASHBOARD_TOKEN, else
the file ASTERIA_DASHBOARD_TOKEN_FILE, else the API token itself (which the operator already
has). Reads go through `st.cache_data` with a short ttl and bounded entries, so many open tabs
do not multiply the load on the control plane; step records are fetched incrementally (`since`)
into bounded per-session buffers.
"""

from __future__ import annotations

import hmac
import math
import os
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import streamlit as st

from dashboard.client import DEFAULT_URL, Client, NotSignedIn
from dashboard.series import StepBuffer

TTL = 2.0
SCHEMA_TTL = 60.0
"""The API description changes only with the server's version: fetched once a minute at most."""
PAGE = 2000
MAX_PAGES = 5
"""Step pages fetched per refresh: a long run's history loads over a few refreshes."""
MAX_BUFFERS = 6
"""Runs whose step rows a session keeps (least recently used dropped first)."""


def env_url() -> str:
    return os.environ.get("ASTERIA_URL", "").strip() or DEFAULT_URL


def env_token() -> tuple[str, str]:
    """(token, where it came from, said without a path: the hint is shown to anyone who opens
    the page); ("", "") when none is configured."""
    token = os.environ.get("ASTERIA_TOKEN", "").strip()
    if token:
        return token, "ASTERIA_TOKEN"
    named = os.environ.get("ASTERIA_TOKEN_FILE", "").strip()
    path = Path(named or Path(os.environ.get("ASTERIA_DATA_DIR", "").strip() or "asteria-data")
                / "token")
    try:
        token = path.read_text().strip()
    except OSError:
        return "", ""
    return token, (f"the file `{path.name}` that ASTERIA_TOKEN_FILE names" if named else
                   f"the token file `{path.name}` in the server's data folder")


def env_sign_in_token() -> tuple[str, str]:
    """(the secret a browser session signs in with, where it came from, without a path)."""
    token = os.environ.get("ASTERIA_DASHBOARD_TOKEN", "").strip()
    if token:
        return token, "ASTERIA_DASHBOARD_TOKEN"
    path = os.environ.get("ASTERIA_DASHBOARD_TOKEN_FILE", "").strip()
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError:
            return "", ""
        return token, f"the file `{Path(path).name}` that ASTERIA_DASHBOARD_TOKEN_FILE names"
    token, where = env_token()
    return token, f"the API token ({where})" if token else ""


SIGNED_IN = "_asteria_signed_in"
"""Session-state key set by `sign_in` only (not a widget's, so no browser message can set it)."""


def signed_in() -> bool:
    return bool(st.session_state.get(SIGNED_IN))


SIGN_IN_BURST = 5
"""Wrong sign-in tokens a session may type within SIGN_IN_WINDOW_SECONDS; then it waits."""
SIGN_IN_BURST_ALL = 30
"""The same for all sessions together (a new session costs a script nothing)."""
SIGN_IN_WINDOW_SECONDS = 60.0
FAILED_SIGN_INS = "_asteria_sign_in_failures"
"""Session-state key: when this session typed a wrong token (set by `sign_in` only)."""
_all_failures: deque[float] = deque()
_all_lock = threading.Lock()


def _recent(times: deque[float], now: float) -> deque[float]:
    while times and times[0] <= now - SIGN_IN_WINDOW_SECONDS:
        times.popleft()
    return times


def sign_in_wait() -> int:
    """Seconds until this session may try a token again; 0: now."""
    now = time.monotonic()
    mine = _recent(st.session_state.setdefault(FAILED_SIGN_INS, deque()), now)
    with _all_lock:
        everyone = _recent(_all_failures, now)
        waits = [times[0] + SIGN_IN_WINDOW_SECONDS - now
                 for times, burst in ((mine, SIGN_IN_BURST), (everyone, SIGN_IN_BURST_ALL))
                 if len(times) >= burst]
    return max(1, math.ceil(max(waits))) if waits else 0


def sign_in(typed: str) -> bool:
    """Sign this session in if `typed` is the sign-in token. A session over its burst of wrong
    tokens is refused without a comparison, so a guess made then tells nothing."""
    if sign_in_wait():
        return False
    secret, _ = env_sign_in_token()
    ok = bool(secret) and hmac.compare_digest(typed.strip().encode(), secret.encode())
    st.session_state[SIGNED_IN] = ok
    if not ok:
        now = time.monotonic()
        st.session_state[FAILED_SIGN_INS].append(now)
        with _all_lock:
            _all_failures.append(now)
    return ok


def sign_out() -> None:
    st.session_state.pop(SIGNED_IN, None)


def url() -> str:
    return env_url()


def client() -> Client:
    """The client for changes: with the API token held here, for a signed-in session only."""
    if not signed_in():
        raise NotSignedIn("Sign in (in the sidebar) to change the policy, send commands or "
                          "start runs; watching needs no sign-in.")
    return Client(url(), env_token()[0])


def selected_run() -> str | None:
    return st.session_state.get("run_id")


def select_run_later(run_id: str) -> None:
    """Make run_id the selection on the next rerun (the picker widget already exists)."""
    st.session_state["select_run"] = run_id


# ---------------------------------------------------------------------- cached reads
@st.cache_data(ttl=TTL, max_entries=16, show_spinner=False)
def health(base: str) -> dict[str, Any]:
    return Client(base).health()


@st.cache_data(ttl=TTL, max_entries=16, show_spinner=False)
def runs(base: str) -> list[dict[str, Any]]:
    return Client(base).runs()


@st.cache_data(ttl=TTL, max_entries=64, show_spinner=False)
def run(base: str, run_id: str) -> dict[str, Any]:
    return Client(base).run(run_id)


@st.cache_data(ttl=TTL, max_entries=64, show_spinner=False)
def policy(base: str, run_id: str) -> dict[str, Any]:
    return Client(base).policy(run_id)


@st.cache_data(ttl=TTL, max_entries=64, show_spinner=False)
def history(base: str, run_id: str) -> list[dict[str, Any]]:
    return Client(base).policy_history(run_id)


@st.cache_data(ttl=TTL, max_entries=16, show_spinner=False)
def ranks(base: str, run_id: str) -> dict[str, Any]:
    return Client(base).ranks(run_id)


@st.cache_data(ttl=TTL, max_entries=16, show_spinner=False)
def autopilot(base: str, run_id: str) -> dict[str, Any]:
    return Client(base).autopilot(run_id)


@st.cache_data(ttl=SCHEMA_TTL, max_entries=16, show_spinner=False)
def openapi(base: str) -> dict[str, Any]:
    return Client(base).openapi()


@st.cache_data(ttl=TTL, max_entries=64, show_spinner=False)
def steps_page(base: str, run_id: str, since: int, limit: int) -> dict[str, Any]:
    return Client(base).steps(run_id, since=since, limit=limit)


def forget_reads() -> None:
    """After a write: the next reads go to the server."""
    for fn in (runs, run, policy, history, autopilot):
        fn.clear()


# ---------------------------------------------------------------------- step buffers
def buffer(base: str, run_id: str) -> StepBuffer:
    buffers: OrderedDict = st.session_state.setdefault("buffers", OrderedDict())
    key = (base, run_id)
    if key not in buffers:
        buffers[key] = StepBuffer()
        while len(buffers) > MAX_BUFFERS:
            buffers.popitem(last=False)
    buffers.move_to_end(key)
    return buffers[key]


def sync(base: str, run_id: str) -> StepBuffer:
    """The run's buffer with every step record the server has (up to MAX_PAGES new pages)."""
    buf = buffer(base, run_id)
    for _ in range(MAX_PAGES):
        page = steps_page(base, run_id, buf.last_step, PAGE)
        buf.extend(page["steps"])
        if len(page["steps"]) < PAGE:
            break
    return buf
