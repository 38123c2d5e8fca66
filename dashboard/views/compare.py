"""Runs side by side: loss against wall-clock and against energy, and a summary table."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, components, series, state
from dashboard.client import ACTIVE


def label(run: dict[str, Any]) -> str:
    optim = run["config"].get("optim", {})
    return f"{run['id'][-6:]} {optim.get('name', '?')} lr={optim.get('lr', '?')}"


def one_run(base: str, run: dict[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(binned loss and energy rows, policy markers, summary) of one run."""
    name = label(run)
    df = series.frame(state.sync(base, run["id"]))
    if df.empty:
        return df, pd.DataFrame(), {"run": name, "status": run["status"], "steps": 0}
    # A comparison counts the device part and the host part alike (series.energy_parts).
    parts = series.energy_parts([s.removeprefix("joules_") for s in series.columns(df, "joules_")])
    b = series.binned(df, 150)
    b = b.assign(run=name, joules=b[[f"joules_{s}" for s in parts]].sum(
        axis=1, min_count=len(parts)) if parts else None)
    marks = series.markers(state.history(base, run["id"]), df).assign(run=name)
    evals = df["eval_loss"].dropna() if "eval_loss" in df else pd.Series(dtype=float)
    last = df.iloc[-1]
    joules = float(b["joules"].dropna().iloc[-1]) if parts else None
    summary = {"run": name, "status": run["status"], "steps": int(last["step"]),
               "last train loss": round(float(last["loss"]), 4) if pd.notna(last["loss"])
               else None,
               "last eval loss": round(float(evals.iloc[-1]), 4) if len(evals) else None,
               "wall-clock (s)": round(float(last["elapsed"]), 1),
               "energy (J)": round(joules, 1) if joules is not None else None,
               "J/token": joules / last["tokens_total"] if joules is not None else None,
               "energy source": " + ".join(
                   f"{s} ({'measured' if s in series.MEASURED else 'estimate'})" for s in parts)
               or "not reported"}
    return b[["run", "step", "elapsed", "loss", "joules"]], marks, summary


def draw(base: str, runs: list[dict[str, Any]]) -> None:
    parts = [one_run(base, r) for r in runs]
    frames = [p[0] for p in parts if not p[0].empty]
    if not frames:
        st.info("The picked runs have no step records yet.")
        return
    data = pd.concat(frames, ignore_index=True)
    marks = pd.concat([p[1] for p in parts if not p[1].empty] or [pd.DataFrame()],
                      ignore_index=True)
    left, right = st.columns(2)
    left.altair_chart(charts.compare(data, "elapsed", title="loss vs wall-clock", marks=marks),
                      width="stretch", alt=charts.alt_text("loss vs wall-clock", marks))
    with right:
        # one point per meter reading: energy moves in steps of the poll interval
        energy = data.dropna(subset=["joules"]).groupby(["run", "joules"], as_index=False)\
            .agg(loss=("loss", "mean"), step=("step", "max"))
        if energy.empty:
            st.info("**Loss vs energy**: no picked run reports energy (no measured source "
                    "here, estimate off).", icon=":material/visibility_off:")
        else:
            st.altair_chart(charts.compare(energy, "joules", title="loss vs energy"),
                            width="stretch", alt="loss vs energy, one line per run")
    st.caption("Dashed lines: policy changes of each run. Energy uses a measured source where "
               "the run has one, else the estimate (see the table).")
    st.dataframe(pd.DataFrame([p[2] for p in parts]), hide_index=True, key="compare_table")


def main() -> None:
    st.title("Compare runs")
    base = state.url()
    runs = {r["id"]: r for r in state.runs(base)}
    if not runs:
        st.info("No runs yet: start some on the Runs page.", icon=":material/info:")
        return
    picked = st.multiselect("Runs", list(runs), default=list(runs)[:2], key="compare_runs",
                            format_func=lambda i: label(runs[i]), max_selections=6)
    if not picked:
        return
    live = any(runs[r]["status"] in ACTIVE for r in picked) and st.session_state.get("live",
                                                                                     True)

    @st.fragment(run_every=5 if live else None)
    def comparison() -> None:
        with components.guard():
            draw(base, [runs[r] for r in picked])

    comparison()


if __name__ == "__main__":
    main()
