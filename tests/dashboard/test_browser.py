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

import pytest

from tests.backend.conftest import TOKEN, free_port
from tests.dashboard.stack import ARTIFACTS, Dashboard, chromium, wait_until

# loss vs step and vs wall-clock, phases, idle, power, joules, joules/token, staleness max,
# refresh queue depth, background load: the charts over steps or wall-clock
LIVE_CHARTS = 10


def unavailable(reason: str) -> None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"CI=true and a component of the browser test is missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    path, reason = chromium()
    if path is None:
        unavailable(reason)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        unavailable(f"playwright is not installed: {err}")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(path), headless=True)
        yield b
        b.close()


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
    step.wait_for(timeout=60_000)
    first = int(step.inner_text())
    wait_until(lambda: int(step.inner_text()) > first, 60, 0.2, "the step counter to move")

    # The form: change the staleness bound; the server answers with a version and a step.
    before = http.get(f"/runs/{live_run}/policy").json()
    version, bound = before["version"] + 1, before["policy"]["staleness_bound"] + 3
    page.get_by_label("Staleness bound S (steps)").fill(str(bound))
    page.get_by_role("button", name="Apply policy change").click()
    expect(page.get_by_test_id("stAlert").filter(has_text="Accepted")).to_contain_text(
        f"version {version}", timeout=30_000)

    # The control plane's policy changed ...
    policy = wait_until(lambda: (p := http.get(f"/runs/{live_run}/policy").json())["version"]
                        == version and p, what="the policy change to be applied")
    assert policy["policy"]["staleness_bound"] == bound
    [change] = [c for c in http.get(f"/runs/{live_run}/policy/history").json()
                if c["version"] == version]

    # ... and the marker appears: in the caption and on every live chart (accessible name).
    marker = f"v{version} from step {change['effective_step']}"
    expect(page.get_by_text(re.compile(marker))).to_be_visible(timeout=30_000)
    marked = page.locator(f'[aria-label*="{marker}"]')
    wait_until(lambda: marked.count() >= LIVE_CHARTS, 30, 0.2, "markers on every chart")

    page.get_by_role("heading", name="Live view").scroll_into_view_if_needed()
    shot = tmp_path / "dashboard-live.png"
    page.screenshot(path=str(shot), full_page=True)
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "dashboard-live.png")
    assert shot.stat().st_size > 10_000
    page.close()
