"""Live view of the selected run: refreshed by a fragment timer, the tuning form below."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import components, panels, series, state
from dashboard.client import ACTIVE, ApiError
from dashboard.markdown import code, text


def ranks_view(base: str, run: dict[str, Any]) -> dict[str, Any] | None:
    """The active run's ranks (GET /runs/{id}/ranks) when it has more than one; else None (a
    past run, a single-process run, or a control plane without the route)."""
    if run["status"] not in ACTIVE:
        return None
    try:
        view = state.ranks(base, run["id"])
    except ApiError:
        return None
    return view if view.get("data_parallel") and view.get("world", 1) > 1 else None


def draw(base: str, run: dict[str, Any]) -> None:
    """Everything that moves: headline numbers, markers and every chart."""
    run_id = run["id"]
    now = state.run(base, run_id)
    if now["status"] != run["status"]:
        st.rerun()  # the banner, the timer and the form follow the new status
    buffer = state.sync(base, run_id)
    df = series.frame(buffer)
    if df.empty:
        st.info("No step recorded yet; the first records arrive within a second of the "
                "run's first step.", icon=":material/hourglass_empty:")
        return
    history = state.history(base, run_id)
    policy = state.policy(base, run_id)["policy"]
    marks = series.markers(history, df)
    binned = series.binned(df)
    panels.headline(df, now)
    components.markers_note(marks)
    st.subheader("Loss")
    panels.loss(binned, df, marks)
    st.subheader("Where the step time goes")
    panels.time_split(binned, marks)
    st.subheader("Energy")
    panels.energy(binned, marks)
    st.subheader("Preconditioner staleness")
    panels.staleness(binned, marks, history, policy, series.staleness_distribution(buffer))
    st.subheader("Refresh queue and background load")
    panels.refresh(binned, marks)
    st.subheader("Optimizer-state tiers")
    panels.tiers(binned, marks, policy)
    view = ranks_view(base, now)
    if view is not None:
        st.subheader("Ranks")
        panels.ranks(view)


def main() -> None:
    st.title("Live view")
    picked = components.selected_run()
    if picked is None:
        return
    base, run = picked
    run_id = run["id"]
    live = run["status"] in ACTIVE and st.session_state.get("live", True)
    every = st.session_state.get("refresh_s", 2) if live else None
    optim = run["config"].get("optim", {}).get("name", "?")
    st.caption(f"Run {code(run_id)} · {text(optim)} · " + (
        f"refreshing every {every} s" if every else
        "not refreshing (run not active or live updates off)"))

    @st.fragment(run_every=every)
    def live_panels() -> None:
        with components.guard():
            draw(base, run)

    @st.fragment
    def tune() -> None:
        components.policy_form(run)

    live_panels()
    st.subheader("Tune the policy")
    tune()


if __name__ == "__main__":
    main()
