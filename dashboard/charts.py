"""Altair charts. Every chart over steps or wall-clock carries the policy-change markers:
a dashed red rule at the step where each change took effect, labelled with its version.

Charts render as SVG (Streamlit's default is a canvas): every mark is then an element with an
accessible label, which screen readers and the browser tests read."""

from __future__ import annotations

import altair as alt
import pandas as pd

HEIGHT = 280
MARK = "#d62728"
WITHIN_COLOUR = "#4c78a8"
SVG = {"embedOptions": {"renderer": "svg"}}
LABEL_ROWS = 3
"""Marker labels take turns over this many rows, so changes a few steps apart stay legible."""
LABEL_ROW_PX = 16  # a label of fontSize 11 is 15 px tall
AXES = {"step": ("step:Q", "step"), "elapsed": ("elapsed:Q", "wall-clock (s)"),
        "joules": ("joules:Q", "energy (J)")}


def alt_text(title: str, marks: pd.DataFrame | None) -> str:
    """The chart's accessible name: its title and the policy changes it marks."""
    if marks is None or marks.empty:
        return f"{title}; no policy change marked"
    changes = "; ".join(f"{r.label} from step {r.step}" for r in marks.itertuples())
    return f"{title}; policy changes marked: {changes}"


def _x(x: str) -> alt.X:
    field, title = AXES[x]
    return alt.X(field, title=title)


def _legend(orient: str = "right") -> alt.Legend:
    return alt.Legend(orient=orient, title=None)


def marker_layers(marks: pd.DataFrame | None, x: str) -> list[alt.Chart]:
    if marks is None or marks.empty or x not in marks:
        return []
    shown = marks.dropna(subset=[x]).sort_values(x).reset_index(drop=True)
    shown["label_y"] = 2 + LABEL_ROW_PX * (shown.index % LABEL_ROWS)  # pixels from the top
    base = alt.Chart(shown)
    rule = base.mark_rule(color=MARK, strokeDash=[5, 3], strokeWidth=1.5).encode(
        x=_x(x), tooltip=[alt.Tooltip("label:N", title="policy"),
                          alt.Tooltip("step:Q", title="from step"),
                          alt.Tooltip("text:N", title="change")])
    label = base.mark_text(color=MARK, align="left", baseline="top", dx=3, fontSize=11).encode(
        x=_x(x), y=alt.Y("label_y:Q", scale=None), text="label:N")
    return [rule, label]


def _finish(layers: list, title: str, marks: pd.DataFrame | None, x: str) -> alt.LayerChart:
    return alt.layer(*layers, *marker_layers(marks, x)).properties(
        title=title, height=HEIGHT, usermeta=SVG)


def lines(data: pd.DataFrame, x: str, *, title: str, y_title: str,
          marks: pd.DataFrame | None = None, zero: bool = True,
          step_lines: pd.DataFrame | None = None, legend: str = "right") -> alt.LayerChart:
    """One line per `series`; `step_lines` (same shape) are drawn dashed as step functions;
    `legend`: where the series legend goes (bottom gives a narrow chart its width). Each point
    is also an invisible mark with its tooltip (a line's own tooltip shows only its first
    point), so every drawn value can be hovered and is in the chart's accessible marks."""
    y = alt.Y("value:Q", title=y_title, scale=alt.Scale(zero=zero))
    color = alt.Color("series:N", legend=_legend(legend))
    tip = ["series:N", "step:Q", alt.Tooltip("value:Q", format=".4g")]
    line = alt.Chart(data).encode(x=_x(x), y=y, color=color, tooltip=tip)
    layers = [line.mark_line(), line.mark_point(opacity=0, size=40)]
    if step_lines is not None and not step_lines.empty:
        layers.append(alt.Chart(step_lines).mark_line(strokeDash=[2, 2], interpolate="step-after")
                      .encode(x=_x(x), y=y, color=color, tooltip=tip))
    return _finish(layers, title, marks, x)


def loss(train: pd.DataFrame, evals: pd.DataFrame, x: str,
         marks: pd.DataFrame | None) -> alt.LayerChart:
    y = alt.Y("value:Q", title="loss", scale=alt.Scale(zero=False))
    color = alt.Color("series:N", legend=_legend(), scale=alt.Scale(
        domain=["train", "eval"], range=["#4c78a8", "#f58518"]))
    tip = ["series:N", "step:Q", alt.Tooltip("value:Q", format=".4f")]
    layers = [alt.Chart(train).mark_line(opacity=0.8).encode(x=_x(x), y=y, color=color,
                                                             tooltip=tip)]
    if not evals.empty:
        layers.append(alt.Chart(evals).mark_line(point=True).encode(x=_x(x), y=y, color=color,
                                                                     tooltip=tip))
    title = "loss vs step" if x == "step" else "loss vs wall-clock"
    return _finish(layers, title, marks, x)


def stacked(data: pd.DataFrame, x: str, *, title: str, y_title: str,
            marks: pd.DataFrame | None = None,
            caps: pd.DataFrame | None = None) -> alt.LayerChart:
    """Stacked areas by `series`, in `order` from the bottom; `caps` (series, value) are drawn
    as dashed capacity lines."""
    names = list(data.sort_values("order")["series"].unique()) if "order" in data else None
    color = alt.Color("series:N", legend=_legend(), sort=names)
    layers = [alt.Chart(data).mark_area(opacity=0.85).encode(
        x=_x(x), y=alt.Y("value:Q", title=y_title, stack="zero"), color=color,
        order=alt.Order("order:Q") if names else alt.Undefined,
        tooltip=["series:N", "step:Q", alt.Tooltip("value:Q", format=".4g")])]
    if caps is not None and not caps.empty:
        layers.append(alt.Chart(caps).mark_rule(strokeDash=[6, 3]).encode(
            y="value:Q", color=color,
            tooltip=["series:N", alt.Tooltip("value:Q", title="capacity")]))
    return _finish(layers, title, marks, x)


def staleness_histogram(data: pd.DataFrame, within: str, over: str) -> alt.Chart:
    """Steps per staleness max (`staleness`, `verdict`, `steps`), coloured by the verdict each
    step got against the bound in force at it."""
    return alt.Chart(data).mark_bar().encode(
        x=alt.X("staleness:O", title="staleness max (steps)"),
        y=alt.Y("steps:Q", title="steps", stack="zero"),
        color=alt.Color("verdict:N", legend=_legend(),
                        scale=alt.Scale(domain=[within, over], range=[WITHIN_COLOUR, MARK])),
        tooltip=["staleness:O", "verdict:N", "steps:Q"],
    ).properties(title="staleness distribution (each step against its own bound)",
                 height=HEIGHT, usermeta=SVG)


def compare(data: pd.DataFrame, x: str, *, title: str,
            marks: pd.DataFrame | None = None) -> alt.LayerChart:
    """Loss of several runs (`run` column) against `x`; markers coloured by run."""
    color = alt.Color("run:N", legend=_legend(), scale=alt.Scale(scheme="tableau10"))
    layers = [alt.Chart(data).mark_line().encode(
        x=_x(x), y=alt.Y("loss:Q", title="loss", scale=alt.Scale(zero=False)), color=color,
        tooltip=["run:N", "step:Q", alt.Tooltip("loss:Q", format=".4f"),
                 alt.Tooltip(f"{x}:Q", format=".4g")])]
    if marks is not None and not marks.empty and x in marks:
        layers.append(alt.Chart(marks.dropna(subset=[x])).mark_rule(strokeDash=[5, 3]).encode(
            x=_x(x), color=color, tooltip=["run:N", "label:N", "step:Q", "text:N"]))
    return alt.layer(*layers).properties(title=title, height=HEIGHT + 60, usermeta=SVG)


IDLE_COLOURS = {"sync_wait": MARK, "refresh_wait": "#4c78a8", "transfer_wait": "#72b7b2",
                "data_wait": "#54a24b", "other": "#bab0ac"}
"""Idle causes per rank: sync_wait (waiting for another rank) in the marker red, the rest muted."""


def rank_idle(data: pd.DataFrame, ranks: list[str]) -> alt.Chart:
    """Idle seconds since the start per rank, stacked by cause, sync_wait at the bottom; every
    rank of `ranks` has its place on the axis (an unreachable one stays empty)."""
    causes = [c for c in IDLE_COLOURS if c in set(data["series"])] or list(IDLE_COLOURS)
    return alt.Chart(data).mark_bar().encode(
        x=alt.X("rank:N", title=None, scale=alt.Scale(domain=ranks), sort=ranks,
                axis=alt.Axis(labelAngle=0)),
        y=alt.Y("value:Q", title="seconds since the start", stack="zero"),
        color=alt.Color("series:N", legend=_legend(), sort=causes, scale=alt.Scale(
            domain=causes, range=[IDLE_COLOURS[c] for c in causes])),
        order=alt.Order("order:Q"),
        tooltip=["rank:N", alt.Tooltip("series:N", title="cause"),
                 alt.Tooltip("value:Q", title="seconds", format=".4g")],
    ).properties(title="device idle by cause per rank (red: sync_wait, waiting for other ranks)",
                 height=HEIGHT, usermeta=SVG)


def rank_bars(data: pd.DataFrame, ranks: list[str], *, title: str, y_title: str,
              ticks: pd.DataFrame | None = None) -> alt.LayerChart:
    """Bars per rank, one beside the other per `series`; `ticks` (rank, series, value) are drawn
    as dashed marks across each rank (such as the staleness bound)."""
    x = alt.X("rank:N", title=None, scale=alt.Scale(domain=ranks), sort=ranks,
              axis=alt.Axis(labelAngle=0))
    tip = ["rank:N", "series:N", alt.Tooltip("value:Q", format=",.4g")]
    layers = [alt.Chart(data).mark_bar().encode(
        x=x, xOffset="series:N", y=alt.Y("value:Q", title=y_title),
        color=alt.Color("series:N", legend=_legend("bottom")), tooltip=tip)]
    if ticks is not None and not ticks.empty:
        layers.append(alt.Chart(ticks).mark_tick(color=MARK, thickness=2, strokeDash=[4, 2])
                      .encode(x=x, y="value:Q", tooltip=tip))
    return alt.layer(*layers).properties(title=title, height=HEIGHT, usermeta=SVG)
