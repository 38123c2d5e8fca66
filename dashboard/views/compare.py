"""Runs side by side: loss against wall-clock and against energy, and a summary table."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import charts, components, series, state
from dashboard.client import ACTIVE

st.title("Compare runs")
base = state.url()
runs = {r["id"]: r for r in state.runs(base)}
if len(runs) < 1:
    st.info("No runs yet: start some on the Runs page.", icon=":material/info:")
    st.stop()


def label(run_id: str) -> str:
    optim = runs[run_id]["config"].get("optim", {})
    return f"{run_id[-6:]} {optim.get('name', '?')} lr={optim.get('lr', '?')}"


picked = st.multiselect("Runs", list(runs), default=list(runs)[:2], format_func=label,
                        key="compare_runs", max_selections=6)
if not picked:
    st.stop()
live = any(runs[r]["status"] in ACTIVE for r in picked) and st.session_state.get("live", True)


def one_run(run_id: str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(binned loss and energy rows, policy markers, summary) of one run."""
    df = series.frame(state.sync(base, run_id))
    if df.empty:
        return df, pd.DataFrame(), {"run": label(run_id), "steps": 0}
    sources = [s.removeprefix("joules_") for s in series.columns(df, "joules_")]
    source = next((s for s in series.MEASURED if s in sources), sources[0] if sources else None)
    b = series.binned(df, 150)
    b = b.assign(run=label(run_id), joules=b[f"joules_{source}"] if source else None)
    marks = series.markers(state.history(base, run_id), df).assign(run=label(run_id))
    evals = df["eval_loss"].dropna() if "eval_loss" in df else pd.Series(dtype=float)
    last = df.iloc[-1]
    joules = float(b["joules"].dropna().iloc[-1]) if source else None
    kind = "measured" if source in series.MEASURED else "estimate"
    summary = {"run": label(run_id), "status": runs[run_id]["status"], "steps": int(last["step"]),
               "last train loss": round(float(last["loss"]), 4),
               "last eval loss": round(float(evals.iloc[-1]), 4) if len(evals) else None,
               "wall-clock (s)": round(float(last["elapsed"]), 1),
               "energy (J)": round(joules, 1) if joules is not None else None,
               "J/token": joules / last["tokens_total"] if joules is not None else None,
               "energy source": f"{source} ({kind})" if source else "not reported"}
    return b[["run", "step", "elapsed", "loss", "joules"]], marks, summary


@st.fragment(run_every=5 if live else None)
def comparison() -> None:
    with components.guard():
        parts = [one_run(r) for r in picked]
        data = pd.concat([p[0] for p in parts if not p[0].empty], ignore_index=True)
        if data.empty:
            st.info("The picked runs have no step records yet.")
            return
        marks = pd.concat([p[1] for p in parts if not p[1].empty], ignore_index=True)
        left, right = st.columns(2)
        left.altair_chart(charts.compare(data, "elapsed", title="loss vs wall-clock",
                                         marks=marks), width="stretch")
        with right:
            # one point per meter reading: energy moves in steps of the poll interval
            energy = data.dropna(subset=["joules"]).groupby(["run", "joules"], as_index=False)\
                .agg(loss=("loss", "mean"), step=("step", "max"))
            if energy.empty:
                st.info("**Loss vs energy**: no picked run reports energy (no measured source "
                        "here, estimate off).", icon=":material/visibility_off:")
            else:
                st.altair_chart(charts.compare(energy, "joules", title="loss vs energy",
                                               marks=None), width="stretch")
        st.caption("Dashed lines: policy changes of each run. Energy uses a measured source "
                   "where the run has one, else the estimate (see the table).")
        st.dataframe(pd.DataFrame([p[2] for p in parts]), hide_index=True,
                     key="compare_table")


comparison()
