"""Memory of a long live view (not collected by pytest): the dashboard server's RSS and the
browser page's JS heap (after a forced GC) while a tiny run trains and the live view refreshes.

    .venv/bin/python -m tests.dashboard.soak --minutes 10 --refresh 2

Prints one line per sample; the server side is flat when its buffers and caches are bounded
(dashboard/series.py StepBuffer, dashboard/state.py cache limits).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from tests.backend.conftest import TOKEN, free_port
from tests.dashboard.stack import Dashboard, chromium, control_plane, tiny_run


def rss_mb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--refresh", type=int, default=2)
    parser.add_argument("--every", type=float, default=30.0, help="seconds between samples")
    args = parser.parse_args()
    path, reason = chromium()
    if path is None:
        raise SystemExit(f"no Chromium: {reason}")
    from playwright.sync_api import sync_playwright

    with control_plane("asteria-soak-") as (api, http, data):
        body = {"config": tiny_run(10**8, eval_interval=200)}
        run_id = http.post("/runs", json=body).json()["id"]
        with Dashboard(free_port(), api.url, TOKEN, data / "streamlit.log") as dash, \
                sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(path), headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1800})
            cdp = page.context.new_cdp_session(page)
            page.goto(dash.url)
            page.get_by_text("Policy changes").wait_for(timeout=60_000)
            refresh = page.get_by_label("Refresh every (s)")
            refresh.fill(str(args.refresh))
            refresh.press("Enter")
            t0 = time.monotonic()
            while time.monotonic() - t0 < args.minutes * 60:
                time.sleep(args.every)
                cdp.send("HeapProfiler.collectGarbage")
                heap = cdp.send("Runtime.getHeapUsage")["usedSize"] / 2**20
                step = http.get(f"/runs/{run_id}").json()["step"]
                print(f"{time.monotonic() - t0:6.0f} s  step {step:8d}  dashboard server RSS "
                      f"{rss_mb(dash.proc.pid):4d} MB  page JS heap {heap:6.1f} MB", flush=True)
            browser.close()
        http.post(f"/runs/{run_id}/stop")


if __name__ == "__main__":
    main()
