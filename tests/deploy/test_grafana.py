"""deploy/grafana: provisioning that fits the stack, a dashboard that uses only the provisioned
datasource, and panel queries that return data from a real Prometheus scraping a real run.

Grafana itself cannot run here (no Debian package, no Docker engine): each panel's PromQL is sent
to Prometheus's HTTP API the way Grafana would send it, with Grafana's variables filled in.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.deploy.conftest import (
    DASHBOARD_JSON,
    DATASOURCES,
    DEPLOY,
    PROM_DIR,
    REPO,
    load_compose,
    wait_for,
)

DASHBOARD = json.loads(DASHBOARD_JSON.read_text())
PANELS = [p for p in DASHBOARD["panels"] if p["type"] != "row"]
ANNOTATIONS = DASHBOARD["annotations"]["list"]

# What Grafana puts in for its variables: $__rate_interval is at least four scrape intervals
# of the datasource (timeInterval 5s); $instance is the "All" value of the template variable.
GRAFANA_VARS = {"$__rate_interval": "20s", "$instance": ".+", "$rank": ".+"}

# Series that exist only when a part of the runtime produces them. A panel query may return
# nothing only if it reads one of these and that input really has no data in this run; the test
# checks both, so a query starts being required to return data as soon as its input appears.
ABSENT_WHEN = {
    "asteria_autopilot_decisions_total": "counts the autopilot's decisions; the compose "
                                         "trainer's autopilot is off (tests/backend/"
                                         "test_autopilot_api.py checks the counter)",
    "asteria_tier_bytes": "exported once a tier store reports; no part of the run reports tiers",
    "asteria_tier_capacity_bytes": "exported once a tier store reports tier budgets",
    "asteria_tier_transfer_bytes_total": "exported once a tier transfer is reported",
    "asteria_distributed_owned_blocks": "exported by data-parallel runs only (the rank row: "
                                        "test_grafana_ranks.py checks it on a 2-rank run)",
    "asteria_distributed_exchange_bytes_total": "exported by data-parallel runs only",
    "DCGM_FI_DEV_POWER_USAGE": "dcgm-exporter runs only in the compose profile gpu, on a GPU",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "dcgm-exporter runs only in the compose profile gpu",
}
METRIC = re.compile(r"\b(asteria_[a-z_]+|DCGM_[A-Z_]+)\b")
RECORDED = re.compile(r"\b[a-z_]+:asteria_[a-z_]+:[a-z0-9_]+\b")
PROPOSED_METRICS: set[str] = set()
"""Read by the dashboard and alerts, not yet exported (reported as missing)."""


def datasource_uid() -> str:
    sources = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert len(sources) == 1 and sources[0]["type"] == "prometheus"
    return sources[0]["uid"]


def fill(expr: str) -> str:
    for name, value in GRAFANA_VARS.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unfilled Grafana variable in {expr!r}"
    return expr


def queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and annotation, as Grafana would send them."""
    found = [(f"panel {p['title']!r} {t['refId']}", fill(t["expr"]))
             for p in PANELS for t in p["targets"]]
    found += [(f"annotation {a['name']!r}", fill(a["expr"])) for a in ANNOTATIONS]
    return found


def walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from walk(v, f"{path}[{i}]")


def has_data(result: list[dict]) -> bool:
    return any(v[1] not in ("NaN", "+Inf", "-Inf")
               for series in result for v in series.get("values", [series.get("value")]))


# ----------------------------------------------------------------------------- static
def test_dashboard_references_only_the_provisioned_datasource():
    uid = datasource_uid()
    refs = [(path, node["datasource"]) for path, node in walk(DASHBOARD) if "datasource" in node]
    assert refs, "no datasource references at all"
    wrong = [(path, ds) for path, ds in refs
             if ds != {"type": "prometheus", "uid": uid}]
    assert not wrong, f"datasource references other than uid {uid!r}: {wrong}"
    text = DASHBOARD_JSON.read_text()
    for exported in ("${DS_", "__inputs", "__requires"):
        assert exported not in text, f"{exported} left from a dashboard exported for sharing"


def test_provisioning_fits_the_compose_stack():
    compose = load_compose()
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards_in_container = mounts["./deploy/grafana/dashboards"]
    provider = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/asteria.yml").read_text())["providers"][0]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == dashboards_in_container
    home = Path(grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home.parent.as_posix() == dashboards_in_container
    assert (REPO / "deploy/grafana/dashboards" / home.name).is_file()

    source = yaml.safe_load(DATASOURCES.read_text())["datasources"][0]
    prometheus = compose["services"]["prometheus"]
    listen = next(a for a in prometheus["command"] if a.startswith("--web.listen-address="))
    assert source["url"] == f"http://prometheus:{listen.rsplit(':', 1)[1]}"
    scrape = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())["global"]
    assert source["jsonData"]["timeInterval"] == scrape["scrape_interval"]


def test_dashboard_has_the_panels_operators_need():
    titles = {p["title"] for p in PANELS}
    for needed in ("Loss", "Step time quantiles", "Power", "Energy per token", "Idle by cause",
                   "Tier occupancy", "Staleness vs bound"):
        assert needed in titles, f"missing panel {needed!r}"
    step = next(p for p in PANELS if p["title"] == "Step time quantiles")
    assert all("histogram_quantile" in t["expr"] and "asteria_step_seconds_bucket" in t["expr"]
               for t in step["targets"])
    power = next(p for p in PANELS if p["title"] == "Power")
    assert "asteria_energy_joules" in power["targets"][0]["expr"]
    (policy,) = [a for a in ANNOTATIONS if "asteria_policy_version" in a["expr"]]
    assert policy["enable"] and "changes(" in policy["expr"]


def test_dashboard_layout_is_well_formed():
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: dict[tuple[int, int], str] = {}
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    for p in PANELS:
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]
    assert DASHBOARD["uid"] and DASHBOARD["templating"]["list"][0]["allValue"] == ".+"


def test_every_metric_read_is_in_the_contract_or_recorded():
    """Names in the dashboard and the rules exist in docs/metrics.md or as recording rules."""
    contract = set(re.findall(r"^\| `(asteria_[a-z_]+)`", (REPO / "docs/metrics.md").read_text(),
                              re.M))
    assert "asteria_steps_total" in contract, "could not read the table of docs/metrics.md"
    # The data-parallel series, listed under the table (a single-process run has none).
    contract |= set(re.findall(r"`(asteria_distributed_[a-z_]+)`",
                               (REPO / "docs/metrics.md").read_text()))
    histograms = {m for m in contract if m.endswith("_seconds") or m.endswith("_steps")}
    known = contract | {f"{h}_{s}" for h in histograms for s in ("bucket", "sum", "count")}
    rules = "\n".join(p.read_text() for p in sorted((PROM_DIR / "rules").glob("*.yml")))
    recorded = set(re.findall(r"record: (\S+)", rules))
    text = "\n".join(expr for _, expr in queries()) + rules
    used_recorded = set(RECORDED.findall(text))
    assert used_recorded <= recorded, f"unknown recording rules: {used_recorded - recorded}"
    stripped = RECORDED.sub("", text)
    unknown = {m for m in METRIC.findall(stripped) if m.startswith("asteria_")} - known
    assert unknown <= PROPOSED_METRICS, f"metrics not in docs/metrics.md: {unknown}"


# ----------------------------------------------------------------------------- live
@pytest.fixture(scope="module")
def policy_changed(prometheus, trainer) -> float:
    """Change the live policy once, so the policy annotation has a change to show; returns
    the new version once Prometheus has scraped it."""
    before = wait_for(lambda: prometheus.query("asteria_policy_version"), 60,
                      "asteria_policy_version in Prometheus")
    run_id = httpx.get(f"{trainer.url}/healthz", timeout=5).json()["active_run"]
    r = httpx.patch(f"{trainer.url}/runs/{run_id}/policy", json={"refresh_interval": 17},
                    headers={"Authorization": f"Bearer {trainer.token}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["version"] > float(before[0]["value"][1])
    after = wait_for(lambda: [s for s in prometheus.query("asteria_policy_version")
                              if float(s["value"][1]) == r.json()["version"]], 60,
                     f"policy version {r.json()['version']} in Prometheus")
    return float(after[0]["value"][1])


COUNTS_EVENTS = {"asteria_autopilot_decisions_total"}
"""Counters whose series exist from 0 (every bounded field), before any event."""


def input_has_data(prometheus, name: str) -> bool:
    if name in COUNTS_EVENTS:  # its series exist from 0: data means an event happened
        return bool(prometheus.query(f"count(max_over_time({name}[10m]) > 0)"))
    return bool(prometheus.query(f"count(last_over_time({name}[10m]))"))


def absent_inputs(prometheus, expr: str) -> dict[str, str]:
    """The inputs of `expr` that have no data in this run, with the reason why."""
    inputs = {re.sub(r"_(bucket|count|sum)$", "", m) for m in METRIC.findall(expr)}
    return {m: ABSENT_WHEN[m] for m in sorted(inputs)
            if m in ABSENT_WHEN and not input_has_data(prometheus, m)}


def test_every_panel_query_returns_data(prometheus, trainer, policy_changed):
    """Each panel target and annotation, as a range query, returns real (non-NaN) values, or
    reads an input that this run does not produce, for a stated reason that the test checks."""
    pending = dict(queries())
    wait_for(lambda: prometheus.query("instance:asteria_device_idle_ratio:rate1m"), 60,
             "the recording rules")

    deadline = time.monotonic() + 60
    while True:
        for where, expr in list(pending.items()):
            if has_data(prometheus.query_range(expr)):
                del pending[where]
        explained = {where: absent_inputs(prometheus, expr) for where, expr in pending.items()}
        if all(explained.values()) or time.monotonic() > deadline:
            break  # what is left reads only inputs that this run does not produce
        time.sleep(1)
    unexplained = {where: pending[where] for where, reasons in explained.items() if not reasons}
    for where, reasons in explained.items():
        if reasons:
            print(f"no data, as expected here: {where}: {reasons}")
    assert not unexplained, f"panel queries without data: {unexplained}"
    assert len(pending) < len(queries()) / 2, "most panels should show data on a CPU run"


def test_policy_annotation_marks_the_change(prometheus, policy_changed):
    """The annotation query, run as Grafana runs it (a range query at its step), marks the
    change made through the control plane."""
    [annotation] = [a for a in ANNOTATIONS if a["name"] == "Policy changes"]
    result = prometheus.query_range(fill(annotation["expr"]), seconds=120,
                                    step=annotation["step"])
    assert has_data(result), annotation["expr"]


def test_energy_panels_prefer_measured_and_fall_back_to_the_estimate(prometheus):
    """NVML and RAPL measure nothing on this machine (no GPU driver, no powercap): the energy
    panels then show the model estimate, labelled source="model"; where a measured source
    answers they show it instead."""
    available = wait_for(lambda: prometheus.query("asteria_energy_source_available"), 60,
                         "asteria_energy_source_available")
    state = {s["metric"]["source"]: s["value"][1] == "1" for s in available}
    assert set(state) == {"nvml", "rapl", "model"}
    assert state["model"], "the compose trainer turns the model estimate on"
    measured = sorted(s for s in ("nvml", "rapl") if state[s])
    power = next(p for p in PANELS if p["title"] == "Power")
    series = wait_for(lambda: prometheus.query(fill(power["targets"][0]["expr"])), 60,
                      "the power panel")
    sources = {s["metric"]["source"] for s in series}
    if measured:
        assert sources == set(measured), f"measured {measured} should replace the estimate"
    else:
        assert not prometheus.query(
            'instance_device_source:asteria_energy_joules:rate1m{source!="model"}')
        assert sources == {"model"}
    assert all(float(s["value"][1]) > 0 for s in series)


def test_trainer_variable_lists_the_trainer(prometheus, trainer):
    """The dashboard's `instance` variable (label_values(asteria_run_info, instance))."""
    (var,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "instance"]
    metric, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["definition"]).groups()
    values = wait_for(lambda: httpx.get(
        f"{prometheus.url}/api/v1/label/{label}/values", params={"match[]": metric},
        timeout=5).json()["data"], 60, "the instance label values")
    assert values == [trainer.url.removeprefix("http://")]
