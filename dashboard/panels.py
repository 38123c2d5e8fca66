"""The live view's panels. Each takes the run's table (binned for drawing) and the policy markers,
and draws its charts, or says plainly that the run does not report that figure."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboard import charts, series
from dashboard.markdown import text

WIDE = "stretch"


def _show(where, chart, title: str, marks: pd.DataFrame | None) -> None:
    where.altair_chart(chart, width=WIDE, alt=charts.alt_text(title, marks))


def _absent(what: str, why: str) -> None:
    st.info(f"**{what}**: not reported by this run. {why}", icon=":material/visibility_off:")


def joules_text(joules: float) -> str:
    """Energy with a unit that keeps the figure short: J, kJ, MJ."""
    for unit, size in (("MJ", 1e6), ("kJ", 1e3)):
        if abs(joules) >= 10 * size:
            return f"{joules / size:,.1f} {unit}"
    return f"{joules:,.1f} J"


LOSS_ABSENT = ("not reported by this run: the runtime reads the loss from the model's output "
               "(a scalar, a tuple holding one, or .loss); a loop that computes it outside the "
               "model logs it with opt.runtime.log(loss=...)")

TILES_PER_ROW = 4
"""Seven tiles in rows of four: at 1400 px beside the sidebar a tile fits its value whole."""


def headline(df: pd.DataFrame, run: dict[str, Any]) -> None:
    last, tail = df.iloc[-1], df.tail(20)
    evals = df["eval_loss"].dropna() if "eval_loss" in df else pd.Series(dtype=float)
    seconds = tail["step_seconds"].sum()
    cols = st.columns(TILES_PER_ROW) + st.columns(TILES_PER_ROW)
    cols[0].metric("Step", f"{int(last['step'])}", help=f"of {run['total_steps']}")
    if pd.notna(last["loss"]):
        cols[1].metric("Train loss", f"{last['loss']:.4f}")
    else:  # a loop whose model returns no loss, and that does not log one
        cols[1].metric("Train loss", "-", help=LOSS_ABSENT)
    cols[2].metric("Eval loss", f"{evals.iloc[-1]:.4f}" if len(evals) else "-")
    cols[3].metric("Tokens/s", f"{tail['tokens'].sum() / seconds:,.0f}" if seconds else "-")
    cols[4].metric("Step time", f"{tail['step_seconds'].mean() * 1e3:.1f} ms")
    sources = series.columns(df, "joules_")
    if sources:
        joules = df[sources[0]].dropna().iloc[-1]
        kind = "measured" if sources[0].removeprefix("joules_") in series.MEASURED \
            else "estimate"
        cols[5].metric(f"Energy ({kind})", joules_text(joules),
                       help=series.source_note([s.removeprefix("joules_") for s in sources]))
    else:
        cols[5].metric("Energy", "-", help="not reported by this run")
    version = last.get("policy_version")
    cols[6].metric("Policy version", int(run["policy_version"] if pd.isna(version) else version))


def loss(b: pd.DataFrame, df: pd.DataFrame, marks: pd.DataFrame) -> None:
    train = series.long(b, ["loss"]).replace({"series": {"loss": "train"}})
    evals = series.long(df[df["eval_loss"].notna()], ["eval_loss"]).replace(
        {"series": {"eval_loss": "eval"}}) if "eval_loss" in df else pd.DataFrame()
    left, right = st.columns(2)
    _show(left, charts.loss(train, evals, "step", marks), "loss vs step", marks)
    _show(right, charts.loss(train, evals, "elapsed", marks), "loss vs wall-clock", marks)


def time_split(b: pd.DataFrame, marks: pd.DataFrame) -> None:
    left, right = st.columns(2)
    phases = series.columns(b, "phase_")
    idle = series.columns(b, "idle_")
    ms = b.assign(**{c: b[c] * 1e3 for c in phases + idle})
    for col, cols, prefix, title in (
            (left, phases, "phase_", "step time by phase (compute, waits excluded)"),
            (right, idle, "idle_", "device idle by cause")):
        with col:
            if cols:
                _show(st, charts.stacked(series.long(ms, cols, prefix), "step", title=title,
                                         y_title="ms per step", marks=marks), title, marks)
            else:
                _absent(title.capitalize(), "Telemetry is off for this run.")


def energy(b: pd.DataFrame, marks: pd.DataFrame) -> None:
    e = series.energy(b)
    if e.empty:
        _absent("Energy", "No measured source (NVML, RAPL) here and the estimate is off; "
                          "set telemetry.model_cpu_watts for an estimate.")
        return
    sources = sorted(e["source"].unique())
    st.caption(text(series.source_note(sources))
               + ". An estimate is CPU seconds x configured watts.")
    e = e.assign(series=e["source"] + " (" + e["kind"] + ")")
    cols = st.columns(3)
    for col, (field, title, unit) in zip(cols, (("watts", "power", "W"),
                                                 ("joules", "cumulative energy", "J"),
                                                 ("joules_per_token", "energy per token",
                                                  "J/token")), strict=True):
        data = e[["step", "elapsed", "series", field]].rename(columns={field: "value"})
        _show(col, charts.lines(data.dropna(), "step", title=title, y_title=unit,
                                marks=marks, legend="bottom"), title, marks)


def tiers(b: pd.DataFrame, marks: pd.DataFrame, policy: dict[str, Any]) -> None:
    """Bytes per tier, stacked; capacities from the records, else the policy's non-zero
    budgets."""
    used = series.columns(b, "tier_")
    if not used:
        _absent("Tier occupancy", "The tier store reports it once optimizer state is tiered.")
        return
    caps = {c.removeprefix("cap_"): b[c].dropna().iloc[-1] for c in series.columns(b, "cap_")}
    for tier in (c.removeprefix("tier_") for c in used):
        if tier not in caps and policy.get(f"{tier}_budget_bytes"):
            caps[tier] = policy[f"{tier}_budget_bytes"]
    cap_df = pd.DataFrame({"series": list(caps), "value": list(caps.values())})
    title = "optimizer state by tier (dashed: capacity)"
    _show(st, charts.stacked(series.long(b, used, "tier_"), "step", title=title,
                             y_title="bytes", marks=marks, caps=cap_df), title, marks)


def staleness(b: pd.DataFrame, marks: pd.DataFrame, history: list, policy: dict[str, Any],
              distribution: pd.DataFrame) -> None:
    if "staleness_max" not in b or not b["staleness_max"].notna().any():
        _absent("Staleness", "Only second-order optimizers with a refresh engine report it.")
        return
    if "staleness_bound" in b and b["staleness_bound"].notna().any():
        bound = b["staleness_bound"]
    else:
        bound = series.bound_by_step(history, policy["staleness_bound"], b["step"])
    data = b.assign(bound=bound)
    left, right = st.columns(2)
    # The refresh latency against its lead (d - swap window + 1): above it the step waits.
    solid = [c for c in ("staleness_max", "refresh latency p90") if c in data]
    dashed = [c for c in ("bound", "lead") if c in data]
    title = "staleness max and refresh latency vs bound and lead (dashed)"
    _show(left, charts.lines(series.long(data, solid), "step", title=title,
                             y_title="steps", marks=marks,
                             step_lines=series.long(data, dashed)), title, marks)
    with right:
        if distribution.empty:
            st.caption("Staleness distribution: no step has reported staleness and its bound.")
            return
        over = int(distribution.loc[distribution["verdict"] == series.OVER, "steps"].sum())
        name = (f"staleness distribution: {int(distribution['steps'].sum())} steps, {over} over "
               "the bound in force at them")
        st.altair_chart(charts.staleness_histogram(distribution, series.WITHIN, series.OVER),
                        width=WIDE, alt=name)


def refresh(b: pd.DataFrame, marks: pd.DataFrame) -> None:
    """Queue depth; background load (refresh work over worker capacity: above 1 the workers
    cannot keep up) with the workers' busy share."""
    left, right = st.columns(2)
    for col, fields, title, unit in (
            (left, ["queue_depth"], "refresh queue depth", "refreshes queued or running"),
            (right, ["background_load", "workers_busy"],
             "background load (above 1: workers cannot keep up)", "ratio")):
        present = [f for f in fields if f in b and b[f].notna().any()]
        with col:
            if present:
                _show(st, charts.lines(series.long(b, present), "step", title=title,
                                       y_title=unit, marks=marks), title, marks)
            else:
                _absent(title.split(" (")[0].capitalize(), "The refresh engine reports it.")


def ranks(view: dict[str, Any]) -> None:
    """Every rank of a data-parallel run (GET /runs/{id}/ranks): a table, idle by cause per rank
    (sync_wait in red), staleness against its bound and the bytes each rank's exchange moved;
    a rank that did not answer is marked and keeps its place on every chart, without bars."""
    entries = view["ranks"]
    labels = [series.rank_label(e) for e in entries]
    nodes = {e["node"] for e in entries if e["node"] is not None}
    st.caption(f"{view['world']} ranks" + (f" on {len(nodes)} node{'s' * (len(nodes) > 1)}"
                                           if nodes else "")
               + ". Rank 0's figures are this control plane's own, every other rank's are read "
               "from its /metrics (its file_sd target); totals since the run started."
               + (f" Only the first {len(entries)} ranks are listed." if view.get("truncated")
                  else ""))
    for e in entries:
        if not e["reachable"]:
            st.warning(f"**Rank {e['rank']}** has no figures: {text(e['error'] or 'no answer')}. "
                       "Its row is blank and its place on the charts empty.",
                       icon=":material/link_off:")
    st.dataframe(series.ranks_table(view), hide_index=True, width=WIDE)
    idle = series.idle_by_rank(view)
    stale = series.rank_figures(view, {"staleness": "staleness max"})
    bounds = series.rank_figures(view, {"staleness_bound": "bound"})
    moved = series.rank_figures(view, {"bytes_sent": "sent", "bytes_received": "received"})
    cols = st.columns(3)
    title = "device idle by cause per rank"
    if idle.empty:
        with cols[0]:
            _absent(title.capitalize(), "No rank answered with its idle figures.")
    else:
        _show(cols[0], charts.rank_idle(idle, labels), title, None)
    for col, data, title, unit, ticks, why in (
            (cols[1], stale, "staleness per rank (dashed: bound)", "steps", bounds,
             "Only second-order optimizers with a refresh engine report it."),
            (cols[2], moved, "bytes of new bases per rank", "bytes", None,
             "A rank reports them after its first step.")):
        if data.empty:
            with col:
                _absent(title.split(" (")[0].capitalize(), why)
        else:
            _show(col, charts.rank_bars(data, labels, title=title, y_title=unit, ticks=ticks),
                  title, None)
