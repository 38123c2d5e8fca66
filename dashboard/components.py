"""Pieces several pages share: error banners, the run's status banner, the policy form."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pandas as pd
import streamlit as st

from dashboard import state
from dashboard.client import ACTIVE, ApiError, Invalid, Unauthorized, Unreachable

log = logging.getLogger(__name__)
# (field, label, choices; None for an integer, AUTO_OR_INT for "auto" or an integer); the names
# are the API's.
AUTO_OR_INT = "auto or an integer"
POLICY_FIELDS = (
    ("staleness_bound", "Staleness bound S (steps)", None),
    ("swap_delay", 'Swap delay d (steps, at most S; "auto" = S)', AUTO_OR_INT),
    ("swap_mode", "Swap mode", ("deterministic", "opportunistic")),
    ("refresh_interval", "Refresh interval (steps)", None),
    ("workers", "Refresh workers (0 = inline)", None),
    ("offload_mode", "Offload mode", ("none", "host", "disk", "auto")),
    ("device_budget_bytes", "Device tier budget (bytes, 0 = no limit)", None),
    ("host_budget_bytes", "Host tier budget (bytes, 0 = no limit)", None),
)


def banner(err: ApiError) -> None:
    if isinstance(err, Unreachable):
        st.error(f"**Control plane unreachable.** {err}", icon=":material/cloud_off:")
    elif isinstance(err, Unauthorized):
        st.error(f"**Token refused.** {err}", icon=":material/key_off:")
    else:
        st.error(str(err), icon=":material/error:")


@contextmanager
def guard() -> Iterator[None]:
    """Run a block; an API failure or an unexpected error becomes a banner, never a traceback."""
    try:
        yield
    except ApiError as err:
        banner(err)
    except Exception as err:  # the operator gets a sentence; the log keeps the traceback
        log.exception("dashboard error")
        st.error(f"Unexpected error: {type(err).__name__}: {err}", icon=":material/error:")


def selected_run() -> tuple[str, dict[str, Any]] | None:
    """(base URL, run) of the run picked in the sidebar, with its status banner shown;
    None, with a notice, when there is no run yet."""
    run_id = state.selected_run()
    if run_id is None:
        st.info("No run yet: start one on the Runs page.", icon=":material/info:")
        return None
    base = state.url()
    run = state.run(base, run_id)
    run_banner(run)
    return base, run


def run_banner(run: dict[str, Any]) -> None:
    rid, status, step = run["id"], run["status"], run["step"]
    where = f"at step {step} of {run['total_steps']}"
    match status:
        case "running":
            return
        case "paused":
            st.warning(f"Run {rid} is **paused** {where}. Resume it on the Runs page.",
                       icon=":material/pause_circle:")
        case "finished":
            st.info(f"Run {rid} is **finished** ({where}). Showing its recorded history; its "
                    "policy can no longer be changed.", icon=":material/flag:")
        case "stopped" | "interrupted":
            st.warning(f"Run {rid} is **{status}** {where}. Showing its recorded history; "
                       "resume it from its last checkpoint on the Runs page.",
                       icon=":material/stop_circle:")
        case _:
            st.error(f"Run {rid} **{status}** {where}: {run.get('error') or 'no detail'}",
                     icon=":material/error:")


def markers_note(marks: pd.DataFrame) -> None:
    if marks.empty:
        st.caption("Policy changes: none yet (a change is marked on every chart by a dashed "
                   "red line at the step it took effect).")
        return
    items = [f"**{r.label}** from step {r.step}: {r.text}" for r in marks.tail(6).itertuples()]
    st.caption("Policy changes (dashed red lines): " + " · ".join(items))


def _newest(pol: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The policy with queued changes applied, and its version."""
    newest = dict(pol["policy"])
    for change in pol["pending"]:
        newest.update({k: v[1] for k, v in change["diff"].items()})
    version = pol["pending"][-1]["version"] if pol["pending"] else pol["version"]
    return newest, version


def _answer(run_id: str) -> None:
    kind, run, payload = st.session_state.get("policy_answer", (None, None, None))
    if run != run_id:
        return
    if kind == "ok":
        diff = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in payload["diff"].items())
        st.success(f"Accepted: policy **version {payload['version']}**, takes effect at "
                   f"**step {payload['effective_step']}** ({diff}).", icon=":material/check:")
    elif kind == "invalid":
        lines = "\n".join(f"- `{field}`: {msg}" for field, msg in payload)
        st.error(f"The control plane rejected the change (422), the policy is unchanged:\n"
                 f"{lines}", icon=":material/block:")


def policy_form(run: dict[str, Any]) -> None:
    """Current against new values of the live policy; one PATCH per submit."""
    base, run_id = state.url(), run["id"]
    pol = state.policy(base, run_id)
    newest, version = _newest(pol)
    active = run["status"] in ACTIVE
    pending = ", ".join(f"v{c['version']} at step {c['effective_step']}" for c in pol["pending"])
    st.caption(f"Policy version {pol['version']} in force" + (f"; queued: {pending}" if pending
                                                               else "") + ".")
    values: dict[str, Any] = {}
    with st.form(key=f"policy_form_{run_id}_{version}"):
        cols = st.columns(4)
        for i, (field, label, choices) in enumerate(POLICY_FIELDS):
            with cols[i % 4]:
                key, now = f"pf_{field}_{run_id}_{version}", newest[field]
                if choices is None:
                    values[field] = st.number_input(label, value=int(now), step=1, key=key,
                                                    disabled=not active)
                elif choices == AUTO_OR_INT:
                    text = st.text_input(label, value=str(now), key=key, disabled=not active)
                    values[field] = _auto_or_int(text)
                else:
                    values[field] = st.selectbox(label, choices, index=choices.index(now),
                                                 key=key, disabled=not active)
                st.caption(f"current: `{now}`")
        sent = st.form_submit_button("Apply policy change", type="primary",
                                     disabled=not active, key=f"pf_submit_{run_id}")
    if not active:
        st.caption("The run is not active: its policy can no longer be changed.")
    if sent:
        _send(run_id, {k: v for k, v in values.items() if v != newest[k]})
    _answer(run_id)


def _auto_or_int(text: str) -> int | str:
    """An integer when the text is one; else the text as typed (the API names what it allows)."""
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        return text


def _send(run_id: str, changes: dict[str, Any]) -> None:
    if not changes:
        st.info("Every field equals the current policy: nothing was sent.")
        return
    try:
        answer = state.client().set_policy(run_id, changes)
    except Invalid as err:
        st.session_state["policy_answer"] = ("invalid", run_id, err.errors)
        return
    except ApiError as err:
        st.session_state.pop("policy_answer", None)
        banner(err)
        return
    st.session_state["policy_answer"] = ("ok", run_id, answer)
    state.forget_reads()
    st.rerun()
