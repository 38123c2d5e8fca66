"""The selected run's live policy: every field, the tuning form and the audited history."""

from __future__ import annotations

from datetime import datetime

import pandas as pd
import streamlit as st

from dashboard import autopilot, components, state


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "queued"


def main() -> None:
    st.title("Policy")
    picked = components.selected_run()
    if picked is None:
        return
    base, run = picked
    current(base, run)
    st.subheader("Autopilot")
    autopilot_section(run)


@st.fragment
def autopilot_section(run: dict) -> None:
    autopilot.panel(run)


@st.fragment
def current(base: str, run: dict) -> None:
    """The form, the policy in force and its history: one fragment, so a submit redraws them
    together."""
    run_id = run["id"]
    st.subheader("Change it")
    components.policy_form(run)

    pol = state.policy(base, run_id)
    st.subheader(f"In force: version {pol['version']}")
    st.dataframe(pd.DataFrame({"field": list(pol["policy"]),
                               "value": [str(v) for v in pol["policy"].values()]}),
                 hide_index=True, key="policy_table", width=520)

    st.subheader("History")
    history = state.history(base, run_id)
    if not history:
        st.caption("No change yet: the run trains under the policy it started with.")
        return
    rows = [{"version": c["version"], "from step": c["effective_step"],
             "change": ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in c["diff"].items()),
             "client": c["client"], "reason": c.get("reason", ""),
             "requested": _when(c["requested_at"]),
             "applied": _when(c["applied_at"])} for c in reversed(history)]
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="policy_history")


if __name__ == "__main__":
    main()
