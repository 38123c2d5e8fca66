"""Altair charts. Every chart over steps or wall-clock carries the policy-change markers:
a dashed red rule at the step where each change took effect, labelled with its version."""

from __future__ import annotations

import altair as alt
import pandas as pd

HEIGHT = 280
MARK = "#d62728"
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


def _legend() -> alt.Legend:
    return alt.Legend(orient="right", title=None)


def marker_layers(marks: pd.DataFrame | None, x: str) -> list[alt.Chart]:
    if marks is None or marks.empty or x not in marks:
        return []
    base = alt.Chart(marks.dropna(subset=[x]))
    rule = base.mark_rule(color=MARK, strokeDash=[5, 3], strokeWidth=1.5).encode(
        x=_x(x), tooltip=[alt.Tooltip("label:N", title="policy"),
                          alt.Tooltip("step:Q", title="from step"),
                          alt.Tooltip("text:N", title="change")])
    label = base.mark_text(color=MARK, align="left", baseline="top", dx=3, fontSize=11).encode(
        x=_x(x), y=alt.value(2), text="label:N")
    return [rule, label]


def _finish(layers: list, title: str, marks: pd.DataFrame | None, x: str) -> alt.LayerChart:
    return alt.layer(*layers, *marker_layers(marks, x)).properties(title=title, height=HEIGHT)


def lines(data: pd.DataFrame, x: str, *, title: str, y_title: str,
          marks: pd.DataFrame | None = None, zero: bool = True,
          step_lines: pd.DataFrame | None = None) -> alt.LayerChart:
    """One line per `series`; `step_lines` (same shape) are drawn dashed as step functions."""
    y = alt.Y("value:Q", title=y_title, scale=alt.Scale(zero=zero))
    color = alt.Color("series:N", legend=_legend())
    tip = ["series:N", "step:Q", alt.Tooltip("value:Q", format=".4g")]
    layers = [alt.Chart(data).mark_line().encode(x=_x(x), y=y, color=color, tooltip=tip)]
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


def staleness_histogram(data: pd.DataFrame, bound: int) -> alt.Chart:
    edges = data["staleness"].str.removeprefix("<= ").replace("inf", "1e18").astype(float)
    data = data.assign(over=["over the bound" if e > bound else "within the bound"
                             for e in edges])
    return alt.Chart(data).mark_bar().encode(
        x=alt.X("staleness:N", sort=None, title="staleness (steps)"),
        y=alt.Y("observations:Q", title="blocks x steps"),
        color=alt.Color("over:N", legend=_legend(),
                        scale=alt.Scale(domain=["within the bound", "over the bound"],
                                        range=["#4c78a8", MARK])),
    ).properties(title=f"staleness distribution (bound {bound})", height=HEIGHT)


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
    return alt.layer(*layers).properties(title=title, height=HEIGHT + 60)
