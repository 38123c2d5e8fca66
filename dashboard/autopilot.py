"""The autopilot on the Policy page: its mode (off is the kill switch), its open proposals to
accept or dismiss, and its recent decisions with their reasons. Everything it applies is an
ordinary policy change: in the history below, with client `autopilot`."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import components, state
from dashboard.client import ACTIVE, ApiError, Invalid
from dashboard.markdown import code, text

MODES = ("off", "propose", "apply")
MODE_HELP = ("off: decides nothing (the kill switch, at once); propose: each decision waits "
             "for you here; apply: decisions become policy changes at the next step boundary, "
             "within the bounds shown.")


def panel(run: dict[str, Any]) -> None:
    base, run_id = state.url(), run["id"]
    if run["status"] not in ACTIVE:
        st.caption("The run is not active: its autopilot is gone with it (its applied changes "
                   "are in the history, client `autopilot`).")
        return
    try:
        pilot = state.autopilot(base, run_id)
    except ApiError as err:  # 409: no autopilot (a first-order optimizer)
        st.caption(f"No autopilot: {text(err)}")
        return
    config = pilot["config"]
    bounds = text(", ".join(f"{k} {v}" for k, v in config["bounds"].items()) or "none")
    st.caption(f"Objective: {text(config['objective'])} · bounds: {bounds} · at least "
               f"{config['spacing']} steps between changes; your own change holds its field "
               f"for {config['hold']} steps.")
    reading_view(pilot.get("reading"), run_id)
    left, right = st.columns([3, 1])
    mode = left.radio("Autopilot mode", MODES, index=MODES.index(config["mode"]),
                      horizontal=True, key=f"ap_mode_{run_id}", help=MODE_HELP)
    if right.button("Set mode", key=f"ap_set_{run_id}", disabled=mode == config["mode"]):
        _write(lambda c: c.set_autopilot(run_id, {"mode": mode}), f"Autopilot mode: {mode}.")
    proposals = pilot["proposals"]
    for p in [p for p in proposals if p["status"] == "proposed"]:
        with st.container(border=True):
            changes = ", ".join(f"{code(k)} -> {code(v)}" for k, v in p["changes"].items())
            st.markdown(f"**Proposal {text(p['id'])}** (step {p['step']}): {changes}  \n"
                        f"{text(p['reason'])}")
            a, d, _ = st.columns([1, 1, 4])
            if a.button("Accept", key=f"ap_accept_{p['id']}", type="primary"):
                _write(lambda c, i=p["id"]: c.answer_proposal(run_id, i, "accept"),
                       f"Proposal {p['id']} accepted: in force from the next boundary.")
            if d.button("Dismiss", key=f"ap_dismiss_{p['id']}"):
                _write(lambda c, i=p["id"]: c.answer_proposal(run_id, i, "dismiss"),
                       f"Proposal {p['id']} dismissed: its fields are left alone for "
                       f"{config['hold']} steps.")
    if done := [p for p in proposals if p["status"] != "proposed"]:
        st.dataframe(pd.DataFrame([{"id": p["id"], "step": p["step"], "status": p["status"],
                                    "version": p["version"],
                                    "changes": ", ".join(f"{k} -> {v}"
                                                         for k, v in p["changes"].items()),
                                    "reason": p["reason"]} for p in reversed(done)]),
                     hide_index=True, key=f"ap_decisions_{run_id}")
    else:
        st.caption("No decision yet.")


def reading_view(reading: dict[str, Any] | None, run_id: str) -> None:
    """What the autopilot read at its latest decision, against the thresholds its rules act
    on: why it decided nothing, or what it decided from."""
    if reading is None:
        st.caption("No reading yet: the autopilot reads the step records at each boundary "
                   "while it is on.")
        return
    read, needed = reading["records_read"], reading["records_needed"]
    st.caption(f"Latest reading at step {reading['step']}: {read} of the {needed} records its "
               "window needs" + ("; no decision before the window is full." if read < needed
                                 else "; a rule acts only where a figure crosses its threshold."))
    if reading["figures"]:
        st.dataframe(pd.DataFrame([{"figure": f["name"], "read": f["value"], "low": f["low"],
                                    "target": f["target"], "high": f["high"],
                                    "what crossing does": f["acts"]}
                                   for f in reading["figures"]]),
                     hide_index=True, key=f"ap_reading_{run_id}")


def _write(call, done: str) -> None:
    """One change through the signed-in client; the answer, or why not, stays on the page."""
    try:
        call(state.client())
    except Invalid as err:
        st.error("Refused: " + text("; ".join(f"{f}: {m}" for f, m in err.errors)),
                 icon=":material/block:")
        return
    except ApiError as err:
        st.error(text(err), icon=":material/error:")
        return
    state.forget_reads()
    st.toast(done, icon=":material/check:")
    components.rerun_here()
