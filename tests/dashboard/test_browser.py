"""End to end in headless Chromium (Debian's package, driven by Playwright): a real control
plane training a tiny run, `streamlit run` of the dashboard, and the operator's loop: watch the
numbers move, change the staleness bound in the form, see the control plane apply it and every
chart mark it. A screenshot is kept in test-artifacts/ (and in the test's tmp folder).

When Chromium or Playwright cannot be had the test skips with the reason; under CI=true it fails.
"""

from __future__ import annotations

import os
import re
import shutil
from urllib.parse import urlsplit

import httpx
import pytest

from tests.backend.conftest import TOKEN, free_port
from tests.dashboard.stack import (
    ARTIFACTS,
    HANG_GUARD_MS,
    Dashboard,
    sign_in,
    tiny_run,
    wait_until,
)

# loss vs step and vs wall-clock, phases, idle, power, joules, joules/token, staleness max,
# refresh queue depth, background load: the charts over steps or wall-clock
LIVE_CHARTS = 10


@pytest.fixture(scope="module")
def dashboard(api, tmp_path_factory):
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with Dashboard(free_port(), api.url, TOKEN, log) as dash:
        yield dash


def test_watch_tune_and_see_the_marker(browser, dashboard, http, live_run, tmp_path):
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1600, "height": 2600})
    page.goto(dashboard.url)

    # Live numbers: the step counter moves on the fragment's timer, without a reload.
    label = page.get_by_test_id("stMetricLabel").get_by_text("Step", exact=True)
    step = page.get_by_test_id("stMetric").filter(has=label).get_by_test_id("stMetricValue")
    step.wait_for(timeout=HANG_GUARD_MS)
    first = int(step.inner_text())
    wait_until(lambda: int(step.inner_text()) > first, interval=0.2,
               what="the step counter to move")

    # The form: change the staleness bound; the server answers with a version and a step.
    sign_in(page, TOKEN)
    before = http.get(f"/runs/{live_run}/policy").json()
    version, bound = before["version"] + 1, before["policy"]["staleness_bound"] + 3
    page.get_by_label("Staleness bound S (steps)").fill(str(bound))
    page.get_by_role("button", name="Apply policy change").click()
    expect(page.get_by_test_id("stAlert").filter(has_text="Accepted")).to_contain_text(
        f"version {version}", timeout=HANG_GUARD_MS)

    # The control plane's policy changed ...
    policy = wait_until(lambda: (p := http.get(f"/runs/{live_run}/policy").json())["version"]
                        == version and p, what="the policy change to be applied")
    assert policy["policy"]["staleness_bound"] == bound
    [change] = [c for c in http.get(f"/runs/{live_run}/policy/history").json()
                if c["version"] == version]

    # ... and the marker appears: in the caption and on every live chart (accessible name).
    marker = f"v{version} from step {change['effective_step']}"
    expect(page.get_by_text(re.compile(marker))).to_be_visible(timeout=HANG_GUARD_MS)
    marked = page.locator(f'[aria-label*="{marker}"]')
    wait_until(lambda: marked.count() >= LIVE_CHARTS, interval=0.2, what="markers on every chart")

    page.get_by_role("heading", name="Live view").scroll_into_view_if_needed()
    shot = tmp_path / "dashboard-live.png"
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "dashboard-live.png")
    assert shot.stat().st_size > 10_000
    page.close()


# What the page draws, read from its SVG charts (dashboard/charts.py renders SVG): each mark's
# accessible label ("field: value; ..."), its colour, and the boxes of text and tiles.
READ_PAGE = """() => {
  const chart = (t) => [...document.querySelectorAll('[aria-label]')]
      .find(e => (e.getAttribute('aria-label') || '').startsWith(t));
  const box = (e) => { const r = e.getBoundingClientRect();
                       return [r.left, r.top, r.right, r.bottom]; };
  const staleness = chart('staleness distribution');
  const power = chart('power');
  return {
    bars: staleness ? [...staleness.querySelectorAll('g.mark-rect.role-mark path[aria-label]')]
        .map(p => [p.getAttribute('aria-label'), p.getAttribute('fill')]) : null,
    power: power ? [...power.querySelectorAll('g.mark-symbol.role-mark path[aria-label]')]
        .map(p => p.getAttribute('aria-label')) : null,
    cut: [...document.querySelectorAll('[data-testid=stMetric]')].flatMap(tile =>
        [tile, ...tile.querySelectorAll('*')]
            .filter(e => e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1)
            .map(e => tile.innerText.replace(/\\n/g, ' ') + ' <' + e.tagName + ' ' +
                 e.scrollWidth + 'x' + e.scrollHeight + ' in ' + e.clientWidth + 'x' +
                 e.clientHeight + '>')),
    labels: [...document.querySelectorAll('[aria-label*="policy changes marked"]')].map(c =>
        [c.getAttribute('aria-label').split(';')[0],
         [...c.querySelectorAll('g.mark-text text')].filter(t => /^v\\d+$/.test(t.textContent))
             .map(t => [t.textContent, box(t)])]),
  };
}"""


def fields(label: str) -> dict[str, str]:
    """An SVG mark's accessible label, "name: value; name: value", as a dict."""
    return dict(part.split(": ", 1) for part in label.split("; "))


def all_steps(http, run_id: str) -> list[dict]:
    steps, since = [], 0
    while page := http.get(f"/runs/{run_id}/steps", params={"since": since,
                                                           "limit": 1000}).json()["steps"]:
        steps += page
        since = page[-1]["step"]
    return steps


def overlaps(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def test_the_live_view_tells_the_truth(browser, fresh_api, tmp_path):
    """On a control plane and dashboard of its own: a SOAP run that evaluates
    often (an evaluation runs between a step's end and its record's completion) with the energy
    estimate on; S lowered mid-run, once in the form, then over HTTP with another change at once
    (their markers land a step apart or less); the run paused so the page and the control plane
    hold the same steps. Then, at 1400 px: each step's staleness coloured by the bound in force
    at it, the power no higher than the estimate's own ceiling (cores x watts), every tile's
    value whole, marker labels apart, no request from the page to any host but the dashboard's
    (its server talks to the control plane; the browser needs no other), no Deploy button."""
    from playwright.sync_api import expect

    config = tiny_run(10_000_000, eval_interval=20, optim="soap")
    config["train"]["eval_batches"] = 40
    config["telemetry"]["energy_poll_seconds"] = 0.0  # every record reads the meters
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=fresh_api.url, timeout=30, headers=headers) as http, \
            Dashboard(free_port(), fresh_api.url, TOKEN, tmp_path / "streamlit.log") as dash:
        created = http.post("/runs", json={"config": config})
        assert created.status_code == 201, created.text
        live_run = created.json()["id"]
        wait_until(lambda: any((s["refresh"] or {}).get("staleness_max", 0) > 3
                               for s in all_steps(http, live_run)), 120, 0.5,
                   "a staleness the lowered bound would exceed")
        _check_the_truth(browser, dash, http, live_run, fresh_api, expect)


def _check_the_truth(browser, dashboard, http, live_run, api, expect) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 3400})
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(dashboard.url)
    label = page.get_by_test_id("stMetricLabel").get_by_text("Step", exact=True)
    step = page.get_by_test_id("stMetric").filter(has=label).get_by_test_id("stMetricValue")
    step.wait_for(timeout=HANG_GUARD_MS)

    sign_in(page, TOKEN)
    before = http.get(f"/runs/{live_run}/policy").json()
    page.get_by_label("Staleness bound S (steps)").fill("3")
    page.get_by_role("button", name="Apply policy change").click()
    expect(page.get_by_test_id("stAlert").filter(has_text="Accepted")).to_contain_text(
        f"version {before['version'] + 1}", timeout=HANG_GUARD_MS)
    # two more changes at once: their markers fall on the same step or the next one
    assert http.patch(f"/runs/{live_run}/policy", json={"staleness_bound": 2}).status_code == 200
    answer = http.patch(f"/runs/{live_run}/policy", json={"refresh_interval": 5}).json()
    wait_until(lambda: http.get(f"/runs/{live_run}/policy").json()["version"] ==
               answer["version"], what="both changes applied")
    wait_until(lambda: http.get(f"/runs/{live_run}").json()["step"] >
               answer["effective_step"] + 30, what="steps under the new bound")
    assert http.post(f"/runs/{live_run}/pause").status_code == 202
    try:
        wait_until(lambda: http.get(f"/runs/{live_run}").json()["status"] == "paused",
                   what="the run paused")
        steps = wait_until(lambda: (s := all_steps(http, live_run)) and
                           s[-1]["step"] == http.get(f"/runs/{live_run}").json()["step"] and s,
                           what="every step record stored")
        last = steps[-1]["step"]
        wait_until(lambda: step.inner_text() == str(last), interval=0.2,
                   what="the page at the last step")
        page.wait_for_timeout(3000)  # the charts of that refresh are drawn
        # On a loaded machine Vega may still be drawing them: read once they have marks.
        seen = wait_until(lambda: (s := page.evaluate(READ_PAGE))["bars"] and s["power"] and s,
                          30, 0.5, "the staleness and power charts drawn")
    finally:
        http.post(f"/runs/{live_run}/resume")

    # Staleness: every step judged against its own bound (the record's refresh section: the
    # state the next step sees, max and bound alike). A bar is red exactly when it counts
    # steps over their bound; the counts are the control plane's.
    expected: dict[tuple[int, str], int] = {}
    for s in steps:
        if s["refresh"] is not None:
            verdict = "over its bound" if s["refresh"]["staleness_max"] > \
                s["refresh"]["staleness_bound"] else "within its bound"
            key = (s["refresh"]["staleness_max"], verdict)
            expected[key] = expected.get(key, 0) + 1
    assert seen["bars"], "no staleness distribution drawn"
    drawn = {}
    for aria, fill in seen["bars"]:
        bar = fields(aria)
        key = (int(bar["staleness"]), bar["verdict"])
        drawn[key] = int(bar["steps"])
        assert (fill.lower() == "#d62728") == (bar["verdict"] == "over its bound"), (aria, fill)
    assert drawn == expected
    assert any(value > 2 and verdict == "within its bound" for value, verdict in drawn), \
        "no step was staler than the bound in force now, yet within its own: nothing tested"

    # Power: an estimate is CPU seconds x watts, so it never exceeds every core busy.
    watts = 15.0  # tests/dashboard/stack.py tiny_run's telemetry.model_cpu_watts
    ceiling = len(os.sched_getaffinity(0)) * watts  # the control plane trains in this process
    assert seen["power"], "no power drawn"
    power = [float(fields(p)["W"]) for p in seen["power"]]
    assert 0 < max(power) <= ceiling * 1.01, (max(power), ceiling)
    assert all("model (estimate)" in p for p in seen["power"])  # an estimate says so

    assert seen["cut"] == []  # every tile's label and value whole at 1400 px
    for title, labels in seen["labels"]:
        for i, (name_a, box_a) in enumerate(labels):
            for name_b, box_b in labels[i + 1:]:
                assert not overlaps(box_a, box_b), (title, name_a, name_b)
    assert {name for _, labels in seen["labels"] for name, _ in labels} >= \
        {f"v{answer['version'] - 2}", f"v{answer['version'] - 1}", f"v{answer['version']}"}

    # Requests: the page loads from, and talks to, the dashboard's server only; no Deploy.
    hosts = {urlsplit(u).netloc for u in requests if urlsplit(u).scheme in ("http", "https",
                                                                             "ws", "wss")}
    assert hosts <= {urlsplit(dashboard.url).netloc, urlsplit(api.url).netloc}, hosts
    assert page.get_by_test_id("stAppDeployButton").count() == 0
    assert page.get_by_role("button", name="Deploy").count() == 0
    page.close()
    # a page's own address, loaded directly (Streamlit first asks /policy/_stcore/health there,
    # a 404 from the dashboard's server, to find its base path: streamlit/streamlit#7074)
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    direct: list[str] = []
    page.on("request", lambda r: direct.append(r.url))
    page.goto(dashboard.url + "/policy")
    expect(page.get_by_role("heading", name="Policy")).to_be_visible(timeout=HANG_GUARD_MS)
    page.wait_for_timeout(2000)
    assert {urlsplit(u).netloc for u in direct if urlsplit(u).scheme != "data"} == \
        {urlsplit(dashboard.url).netloc}, direct
    page.close()
