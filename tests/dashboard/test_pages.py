"""Each page under AppTest, against a real control plane (no mocked client).

AppTest runs a fragment once per run and never on its timer; the timer is tested in a real
browser (test_browser.py).
"""

from __future__ import annotations

import re

import httpx
import pandas as pd
import pyarrow as pa
import streamlit as st
from streamlit.testing.v1 import AppTest

from dashboard.state import SIGNED_IN
from tests.backend.conftest import free_port
from tests.dashboard.conftest import wait_status
from tests.dashboard.stack import APP, wait_until


def app(run_id: str | None = None, page: str | None = None) -> AppTest:
    """The app after a first run, signed in (as an operator who typed the sign-in token; the
    browser test signs in through the form)."""
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.session_state[SIGNED_IN] = True
    if run_id is not None:
        at.session_state["select_run"] = run_id
    if page is not None:
        at.switch_page(page)
    return at.run()


def texts(elements) -> str:
    """The elements' Markdown, with the escapes that keep values literal taken out (what a
    reader sees, markup aside)."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", "\n".join(str(e.value) for e in elements))


def charts(at: AppTest) -> list:
    return at.get("vega_lite_chart")


def chart_data(chart) -> list[pd.DataFrame]:
    """The tables a chart element carries (Arrow IPC streams in its proto)."""
    return [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]


def test_live_page_shows_the_live_run(dashboard_env, http, live_run):
    at = app(live_run)
    assert not at.exception, at.exception
    assert at.session_state["run_id"] == live_run
    metrics = {m.label: m.value for m in at.metric}
    assert int(metrics["Step"]) > 0 and float(metrics["Train loss"]) > 0
    assert metrics["Energy (estimate)"].endswith(" J")
    assert "refreshing every 2 s" in texts(at.caption)
    notes = texts(at.info)
    assert "**Staleness**" not in notes and "**Refresh queue depth**" not in notes
    tiered = http.get(f"/runs/{live_run}/steps").json()["steps"][-1]["tiers"] is not None
    assert ("**Tier occupancy**: not reported by this run" in notes) is not tiered
    # loss x2, phases, idle, power, joules, joules/token, staleness max and distribution,
    # queue depth, background load, and the tiers where the tier store reports
    assert len(charts(at)) == 11 + tiered


def test_live_page_of_a_finished_run(dashboard_env, http, finished_run):
    at = app(finished_run)
    assert not at.exception, at.exception
    notes = texts(at.info)
    done = texts(at.success)
    assert f"**Run {finished_run} has finished**: all 120 steps done." in done
    kept = http.get(f"/runs/{finished_run}").json()["checkpoint_step"]
    assert (f"Its checkpoint is at step {kept}." in done) is (kept is not None)
    assert "**Staleness**: not reported by this run" in notes  # AdamW has no refresh engine
    assert "**v2** from step" in texts(at.caption)  # the marker of the audited change
    step = http.get(f"/runs/{finished_run}/policy/history").json()[0]["effective_step"]
    marked = [c for c in charts(at) if f"v2 from step {step}" in c.proto.alt]
    assert len(marked) == 7  # every chart over steps or wall-clock of an AdamW run
    assert at.button(key=f"pf_submit_{finished_run}").disabled


def test_policy_form_sends_a_patch_and_shows_the_answer(dashboard_env, http, live_run):
    at = app(live_run, "views/policy.py")
    version = http.get(f"/runs/{live_run}/policy").json()["version"]
    at.number_input(key=f"pf_staleness_bound_{live_run}_{version}").set_value(7)
    at.button(key=f"pf_submit_{live_run}").click().run()
    assert not at.exception, at.exception
    assert f"policy **version {version + 1}**" in texts(at.success)
    policy = wait_until(lambda: (p := http.get(f"/runs/{live_run}/policy").json())["version"]
                        == version + 1 and p, what="policy applied")
    assert policy["policy"]["staleness_bound"] == 7
    # Apply again with nothing changed: that outcome alone, not beside the earlier "Accepted".
    at.button(key=f"pf_submit_{live_run}").click().run()
    assert not at.exception, at.exception
    assert "nothing was sent" in texts(at.info) and len(at.success) == 0
    [form] = [f for f in forms(at._tree) if f.form_id.startswith("policy_form_")]
    assert not form.enter_to_submit  # Enter in a field sends nothing; Apply does


def forms(node) -> list:
    """The form blocks (their protos) under an AppTest node."""
    proto = getattr(node, "proto", None)
    found = [proto.form] if getattr(node, "type", None) == "form" and proto is not None \
        else []
    for child in getattr(node, "children", {}).values():
        found += forms(child)
    return found


def test_policy_form_shows_the_validation_error_verbatim(dashboard_env, http, live_run):
    at = app(live_run, "views/policy.py")
    before = http.get(f"/runs/{live_run}/policy").json()
    expected = http.patch(f"/runs/{live_run}/policy",
                          json={"swap_delay": 5000}).json()["detail"][0]["msg"]
    at.text_input(key=f"pf_swap_delay_{live_run}_{before['version']}").set_value("5000")
    at.button(key=f"pf_submit_{live_run}").click().run()
    assert not at.exception, at.exception
    error = texts(at.error)
    # the server's words, once: the message's own "swap_delay: " is not repeated after the field
    assert expected.startswith("swap_delay: got 5000")
    assert "rejected the change (422)" in error
    assert f"`swap_delay`: {expected.removeprefix('swap_delay: ')}" in error
    assert "swap_delay: swap_delay" not in error
    assert http.get(f"/runs/{live_run}/policy").json()["policy"] == before["policy"]


def test_policy_form_has_every_policy_field_by_type(dashboard_env, http, live_run):
    at = app(live_run, "views/policy.py")
    assert not at.exception, at.exception
    version = http.get(f"/runs/{live_run}/policy").json()["version"]
    key = lambda name: f"pf_{name}_{live_run}_{version}"
    bound = at.number_input(key=key("staleness_bound"))
    assert (bound.label, bound.min, bound.max) == ("Staleness bound S (steps)", 0, 1_000_000)
    assert any("lag the statistics" in c.help for c in at.caption if c.help)
    assert at.number_input(key=key("device_budget_bytes")).max == 2**53 - 1
    assert at.selectbox(key=key("swap_mode")).options == ["deterministic", "opportunistic"]
    assert at.checkbox(key=key("pace")).value is True
    assert at.text_input(key=key("swap_delay")).placeholder == "auto or an integer"
    assert at.text_input(key=key("disk_dir")).max_chars == 4096
    assert [e.label for e in at.expander] == ["Advanced (9 more fields)"]
    widgets = [*at.number_input, *at.selectbox, *at.checkbox, *at.text_input]
    shown = {w.key.removeprefix("pf_").removesuffix(f"_{live_run}_{version}") for w in widgets
             if w.key and w.key.startswith("pf_")}
    assert shown == set(http.get(f"/runs/{live_run}/policy").json()["policy"])


def test_policy_form_sends_an_advanced_field(dashboard_env, http, live_run):
    at = app(live_run, "views/policy.py")
    before = http.get(f"/runs/{live_run}/policy").json()
    at.checkbox(key=f"pf_pace_{live_run}_{before['version']}").uncheck()
    at.button(key=f"pf_submit_{live_run}").click().run()
    assert not at.exception, at.exception
    assert f"version {before['version'] + 1}" in texts(at.success)
    assert "pace True -> False" in texts(at.success)
    http.patch(f"/runs/{live_run}/policy", json={"pace": True})  # as the other tests expect


def test_wrong_token_gives_a_banner(dashboard_env, monkeypatch, http, live_run):
    monkeypatch.setenv("ASTERIA_TOKEN", "wrong-token")
    at = app(live_run, "views/policy.py")
    version = http.get(f"/runs/{live_run}/policy").json()["version"]
    at.number_input(key=f"pf_workers_{live_run}_{version}").set_value(2)
    at.button(key=f"pf_submit_{live_run}").click().run()
    assert not at.exception, at.exception
    assert "**Token refused.**" in texts(at.error)
    assert http.get(f"/runs/{live_run}/policy").json()["version"] == version


def test_unreachable_control_plane_gives_a_banner(dashboard_env, monkeypatch):
    monkeypatch.setenv("ASTERIA_URL", f"http://127.0.0.1:{free_port()}")
    for page in (None, "views/runs.py", "views/compare.py"):
        at = AppTest.from_file(str(APP), default_timeout=60).run()
        if page:
            at.switch_page(page).run()
        assert not at.exception, at.exception
        assert "**Control plane unreachable.**" in texts(at.error)


def test_runs_page_lists_runs_and_sends_commands(dashboard_env, http, live_run, finished_run):
    at = app(live_run, "views/runs.py")
    assert not at.exception, at.exception
    table = at.dataframe[0].value
    assert {live_run, finished_run} <= set(table["run"])
    at.button(key="cmd_pause").click().run()
    assert "pause: the run pauses" in texts(at.success)
    wait_status(http, live_run, "paused")  # at the next step boundary
    st.cache_data.clear()
    at.run()  # the page now shows the run paused: resume is enabled
    at.button(key="cmd_resume").click().run()
    assert "resume: the run continues" in texts(at.success)
    wait_status(http, live_run, "running")
    at.button(key="new_submit").click().run()  # a second active run: 409, as a banner
    assert not at.exception, at.exception
    assert "is active; one active run per trainer (409)" in texts(at.error)


def test_start_a_run_from_the_form(monkeypatch, fresh_api):
    monkeypatch.setenv("ASTERIA_URL", fresh_api.url)
    monkeypatch.setenv("ASTERIA_TOKEN", fresh_api.settings.token)
    at = app(page="views/runs.py")
    assert not at.exception, at.exception
    at.selectbox(key="new_model").set_value("tiny (~30K params)")
    at.number_input(key="new_steps").set_value(30)
    at.number_input(key="new_watts").set_value(10.0)
    at.button(key="new_submit").click().run()
    assert not at.exception, at.exception
    [run] = httpx.get(f"{fresh_api.url}/runs").json()
    assert run["total_steps"] == 30 and run["config"]["model"]["n_embd"] == 32
    assert at.session_state["run_id"] == run["id"]  # the new run is selected


def test_compare_page_puts_runs_side_by_side(dashboard_env, live_run, finished_run):
    at = app(live_run, "views/compare.py")
    assert not at.exception, at.exception
    assert set(at.multiselect(key="compare_runs").value) == {live_run, finished_run}
    assert len(charts(at)) == 2  # loss vs wall-clock, loss vs energy
    table = at.dataframe[0].value
    assert list(table["energy source"]) == ["model (estimate)"] * 2


def _tier_panel() -> None:
    # Runs inside AppTest: step records as the tier store will report them.
    from dashboard import panels, series

    buf = series.StepBuffer()
    buf.extend([{"step": s, "time": 100.0 + s, "loss": 3.0, "eval_loss": None, "lr": 1e-3,
                 "tokens": 64, "step_seconds": 1.0, "phase_seconds": {},
                 "tiers": {"bytes": {"device": 1000, "host": 50 * s},
                           "capacity_bytes": {"device": 2048}, "prefetch_hit_ratio": None}}
                for s in range(1, 50)])
    df = series.frame(buf)
    marks = series.markers([], df)
    panels.tiers(df, marks, {"device_budget_bytes": 0, "host_budget_bytes": 4096})


def test_tier_panel_draws_occupancy_with_capacities():
    at = AppTest.from_function(_tier_panel, default_timeout=30).run()
    assert not at.exception, at.exception
    [chart] = charts(at)
    assert not at.info  # no "not reported" note
    used, caps = chart_data(chart)
    assert set(used["series"]) == {"device", "host"}
    # capacity: the records' for device, the policy budget for host (none in the records)
    assert dict(zip(caps["series"], caps["value"], strict=True)) == {"device": 2048.0,
                                                                      "host": 4096.0}


def test_the_live_page_follows_a_script_attached_with_backend_serve(monkeypatch, tmp_path):
    """The dashboard works unchanged against a user's own loop served by `backend.serve`."""
    import torch

    import asteria_core as asteria
    import backend
    from asteria_core.train.config import ModelConfig
    from asteria_core.train.model import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))
    opt = asteria.optimizer(model, "soap", policy=asteria.Policy(refresh_interval=2,
                                                                  staleness_bound=2))
    plane = backend.serve(opt.runtime, port=free_port(), data_dir=tmp_path / "data")
    try:
        for _ in range(8):
            x = torch.randint(0, 256, (2, 16))
            model(x, x)[1].backward()
            opt.step()
            opt.zero_grad()
        opt.runtime.end_step()
        monkeypatch.setenv("ASTERIA_URL", plane.url)
        monkeypatch.setenv("ASTERIA_TOKEN", plane.token)
        st.cache_data.clear()
        run_id = opt.runtime.run_id
        wait_until(lambda: httpx.get(f"{plane.url}/runs/{run_id}").json()["step"] == 8, 30,
                   what="the attached run's eighth step")
        at = app(run_id)
        assert not at.exception, at.exception
        metrics = {m.label: m.value for m in at.metric}
        assert int(metrics["Step"]) == 8 and float(metrics["Train loss"]) > 0
        assert "soap" in texts(at.markdown) + texts(at.caption) + texts(at.title)
        notes = texts(at.info)
        assert "**Staleness**" not in notes  # the attached run reports its staleness
    finally:
        opt.runtime.close()
        plane.close()
        st.cache_data.clear()
