"""The runs page's start form starts from the default run's settings where they are the
product's (the energy estimate of `asteria start`'s run), so a run started from the form is
measured like the default one."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from backend.commands import SERVED_RUN
from tests.dashboard.stack import APP


def test_the_start_form_defaults_the_energy_estimate_to_the_default_runs(monkeypatch, fresh_api):
    monkeypatch.setenv("ASTERIA_URL", fresh_api.url)
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.switch_page("views/runs.py").run()
    assert at.number_input(key="new_watts").value == SERVED_RUN["telemetry"]["model_cpu_watts"]
