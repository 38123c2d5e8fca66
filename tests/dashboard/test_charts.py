"""Chart specs: marker labels that stay apart, SVG rendering, the staleness distribution's
colours by each step's own verdict."""

from __future__ import annotations

import pandas as pd

from dashboard import charts, series


def layers(chart) -> list[dict]:
    spec = chart.to_dict()
    return spec.get("layer", [spec])


def test_marker_labels_of_nearby_changes_take_different_rows():
    marks = pd.DataFrame({"step": [40, 41, 42, 300], "label": ["v2", "v3", "v4", "v5"],
                          "text": ["staleness_bound 10 -> 6"] * 4, "version": [2, 3, 4, 5],
                          "elapsed": [1.0, 1.1, 1.2, 9.0]})
    data = pd.DataFrame({"step": [1, 400], "elapsed": [0.0, 10.0], "series": ["loss"] * 2,
                         "value": [3.0, 2.0]})
    chart = charts.lines(data, "step", title="t", y_title="y", marks=marks)
    spec = chart.to_dict()
    assert spec["usermeta"] == {"embedOptions": {"renderer": "svg"}}
    [text] = [layer for layer in spec["layer"] if layer["mark"].get("type") == "text"]
    assert text["encoding"]["y"] == {"field": "label_y", "type": "quantitative", "scale": None}
    rows = {d["label"]: d["label_y"] for d in spec["datasets"][text["data"]["name"]]}
    assert len({rows["v2"], rows["v3"], rows["v4"]}) == 3  # three changes two steps apart
    assert all(0 < y < charts.HEIGHT / 4 for y in rows.values())


def test_the_staleness_distribution_colours_each_steps_own_verdict():
    dist = pd.DataFrame({"staleness": [3, 8, 9], "verdict": [series.WITHIN, series.WITHIN,
                                                             series.OVER], "steps": [5, 2, 1]})
    spec = charts.staleness_histogram(dist, series.WITHIN, series.OVER).to_dict()
    color = spec["encoding"]["color"]
    assert color["field"] == "verdict"
    assert dict(zip(color["scale"]["domain"], color["scale"]["range"], strict=True)) == \
        {series.WITHIN: charts.WITHIN_COLOUR, series.OVER: charts.MARK}
    assert spec["usermeta"] == {"embedOptions": {"renderer": "svg"}}
