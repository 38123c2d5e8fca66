"""The autopilot end to end in headless Chromium: a run whose one worker cannot keep up with its
refreshes (slowed at the seam, tests/asteria_core/refresh/faults.py) gets an interval change from
its autopilot. The operator sees the proposal and its reason on the Policy page, accepts it
there, and finds it applied at a boundary: in the audit with client `autopilot` and the reason,
counted in /metrics, and on the Live page's chart markers with the reason. A screenshot of the
Policy page is kept in test-artifacts/."""

from __future__ import annotations

import re
import shutil

import httpx
import pytest

from tests.backend.conftest import free_port
from tests.backend.test_autopilot_api import slow_refresh_run
from tests.dashboard.stack import ARTIFACTS, HANG_GUARD_MS, Dashboard, sign_in, wait_until

pytestmark = pytest.mark.usefixtures("one_thread")


def test_accept_a_proposal_in_the_browser_and_see_it_everywhere(browser, tmp_path):
    from playwright.sync_api import expect

    with slow_refresh_run(tmp_path, "propose") as plane, \
            httpx.Client(base_url=plane.url, timeout=30) as http, \
            Dashboard(free_port(), plane.url, plane.token, tmp_path / "streamlit.log") as dash:
        run_id = wait_until(lambda: http.get("/healthz").json()["active_run"],
                            what="the attached run")
        proposal = wait_until(lambda: [p for p in http.get(f"/runs/{run_id}/autopilot").json()
                                       ["proposals"] if p["status"] == "proposed"],
                              what="a proposal")[0]
        assert set(proposal["changes"]) == {"refresh_interval"}
        assert "refresh_wait" in proposal["reason"]

        page = browser.new_page(viewport={"width": 1600, "height": 2400})
        page.goto(f"{dash.url}/policy")
        sign_in(page, plane.token)
        card = page.get_by_text(f"Proposal {proposal['id']}")
        expect(card).to_be_visible(timeout=HANG_GUARD_MS)
        # Streamlit's markdown draws "->" as an arrow
        expect(page.get_by_text(proposal["reason"].replace("->", "\u2192"))).to_be_visible()
        shot = tmp_path / "dashboard-autopilot.png"
        page.screenshot(path=str(shot), full_page=True)
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(shot, ARTIFACTS / "dashboard-autopilot.png")

        page.get_by_role("button", name="Accept").click()
        expect(page.get_by_text(f"Proposal {proposal['id']} accepted")).to_be_visible(
            timeout=HANG_GUARD_MS)

        # Applied at a boundary, audited with its actor and reason ...
        change = wait_until(lambda: [c for c in http.get(f"/runs/{run_id}/policy/history")
                                     .json() if c["client"] == "autopilot"
                                     and c["applied_at"] is not None],
                            what="the accepted change, applied")[0]
        assert change["reason"] == proposal["reason"]
        assert change["diff"]["refresh_interval"][1] == proposal["changes"]["refresh_interval"]
        # ... counted in /metrics ...
        wait_until(lambda: 'asteria_autopilot_decisions_total{field="refresh_interval",'
                           'outcome="accepted"} 1.0' in http.get("/metrics").text,
                   what="the accepted decision in /metrics")
        # ... and marked on the Live page's charts, with the reason.
        page.goto(dash.url)
        marker = f"v{change['version']} from step {change['effective_step']}"
        expect(page.get_by_text(re.compile(marker))).to_be_visible(timeout=HANG_GUARD_MS)
        # a marker's rule carries the change as its accessible label (its tooltip's fields)
        marks = page.locator(f'[aria-label*="(autopilot: {change["reason"]})"]')
        wait_until(lambda: marks.count() > 0, interval=0.2,
                   what="the autopilot's reason on a chart marker")
        assert f"v{change['version']}" in marks.first.get_attribute("aria-label")
        # this loop's model returns no loss (the loss is computed outside it): the page says so
        assert page.get_by_text("Unexpected error").count() == 0
        page.close()
