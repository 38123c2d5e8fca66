"""Regenerate the dashboard screenshots in docs/ from real runs (not collected by pytest).

    .venv/bin/python -m tests.dashboard.screenshots [--steps 600] [--second soap]

A control plane on a free port trains a short AdamW run and then a second run (SOAP by default,
AdamW at a lower learning rate if the second optimizer fails), each with one policy change
mid-run (CHANGE); the dashboard runs under `streamlit run`; headless Chromium saves
docs/dashboard-live.png (the live view of the second run while it trains) and
docs/dashboard-compare.png (both runs side by side).
"""

from __future__ import annotations

import argparse
import time

import httpx

from tests.backend.conftest import TOKEN, free_port
from tests.dashboard.stack import ROOT, Dashboard, chromium, control_plane, wait_until

MODEL = {"n_layer": 2, "n_head": 4, "n_embd": 64, "block_size": 64}
# The mid-run change: a tighter staleness bound, and a device budget that moves part of the
# optimizer state (SOAP's ~4.6 MB with this model) to the host tier.
CHANGE = {"staleness_bound": 4, "swap_delay": 2, "device_budget_bytes": 2_000_000,
          "offload_mode": "auto"}


def config(optim: str, lr: float, steps: int) -> dict:
    return {"model": MODEL, "optim": {"name": optim, "lr": lr, "warmup_steps": 30},
            "data": {"batch_size": 8},
            "train": {"steps": steps, "eval_interval": 50, "eval_batches": 4, "threads": 1},
            "telemetry": {"model_cpu_watts": 15.0}}


def train(http: httpx.Client, body: dict, *, change_at: int, wait: bool) -> str:
    """Start a run, apply CHANGE at `change_at`; wait for the end if asked."""
    run_id = http.post("/runs", json={"config": body}).raise_for_status().json()["id"]
    wait_until(lambda: http.get(f"/runs/{run_id}").json()["step"] >= change_at
               or http.get(f"/runs/{run_id}").json()["status"] != "running", 600, 0.2)
    http.patch(f"/runs/{run_id}/policy", json=CHANGE).raise_for_status()
    if wait:
        wait_until(lambda: http.get(f"/runs/{run_id}").json()["status"] != "running", 900, 0.5)
    return run_id


def idle(page) -> None:
    """Wait until the app's script (and fragment) run has finished and the charts are drawn."""
    page.locator("[data-testid=stApp][data-test-script-state=notRunning]").wait_for(
        timeout=60_000)
    time.sleep(1.0)  # vega draws after the run ends


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--second", default="soap")
    args = parser.parse_args()
    path, reason = chromium()
    if path is None:
        raise SystemExit(f"no Chromium: {reason}")
    from playwright.sync_api import sync_playwright

    with control_plane("asteria-shots-") as (api, http, data):
        train(http, config("adamw", 3e-3, args.steps), change_at=args.steps // 3, wait=True)
        second = train(http, config(args.second, 3e-3, args.steps), change_at=args.steps // 3,
                       wait=False)
        if http.get(f"/runs/{second}").json()["status"] == "failed":
            print(f"{args.second} failed; the second run is AdamW at lr 1e-3")
            second = train(http, config("adamw", 1e-3, args.steps), change_at=args.steps // 3,
                           wait=False)
        with Dashboard(free_port(), api.url, TOKEN, data / "streamlit.log") as dash, \
                sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(path), headless=True)
            page = browser.new_page(viewport={"width": 1500, "height": 2750})
            page.goto(dash.url)
            page.get_by_text("Policy changes (dashed red lines)").wait_for(timeout=60_000)
            # A slower timer leaves time to shoot between refreshes (a refresh fades the page).
            refresh = page.get_by_label("Refresh every (s)")
            refresh.fill("10")
            refresh.press("Enter")
            page.get_by_text("refreshing every 10 s").wait_for(timeout=30_000)
            idle(page)
            page.screenshot(path=str(ROOT / "docs" / "dashboard-live.png"))
            wait_until(lambda: http.get(f"/runs/{second}").json()["status"] != "running",
                       900, 0.5)
            page.set_viewport_size({"width": 1500, "height": 900})
            page.goto(f"{dash.url}/compare")
            page.get_by_test_id("stDataFrame").wait_for(timeout=60_000)
            idle(page)
            page.screenshot(path=str(ROOT / "docs" / "dashboard-compare.png"))
            browser.close()
    print("wrote docs/dashboard-live.png and docs/dashboard-compare.png")


if __name__ == "__main__":
    main()
