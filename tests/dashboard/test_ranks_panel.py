"""The live page's Ranks panel under AppTest, against a real data-parallel run:
examples/ddp_loop.py on 2 ranks under torchrun, rank 0's control plane read over HTTP (as the
dashboard always reads it). A single-process run shows no such panel (test_pages.py counts its
charts)."""

from __future__ import annotations

import time

import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from backend.ranks import CACHE_SECONDS
from tests.backend.conftest import TOKEN, free_port
from tests.backend.ddp_example import ddp_example
from tests.dashboard.stack import APP

pytestmark = pytest.mark.multiproc
IDLE = "device idle by cause per rank"
STALENESS = "staleness per rank (dashed: bound)"
BYTES = "bytes of new bases per rank"


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    with ddp_example(tmp_path_factory.mktemp("ddp")) as running:
        yield running


@pytest.fixture
def env(job, monkeypatch):
    monkeypatch.setenv("ASTERIA_URL", job.url)
    monkeypatch.setenv("ASTERIA_TOKEN", TOKEN)
    st.cache_data.clear()
    yield job
    st.cache_data.clear()


def live_page(run_id: str) -> AppTest:
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.session_state["select_run"] = run_id
    return at.run()


def chart(at: AppTest, title: str):
    [found] = [c for c in at.get("vega_lite_chart") if c.proto.alt.startswith(title + ";")]
    return found


def chart_data(element) -> pd.DataFrame:
    return pd.concat([pa.ipc.open_stream(d.data.data).read_all().to_pandas()
                      for d in element.proto.datasets], ignore_index=True)


def ranks_table(at: AppTest) -> pd.DataFrame:
    [table] = [d.value for d in at.dataframe if "sync_wait (s)" in d.value.columns]
    return table


def test_the_ranks_panel_shows_every_rank(env):
    job = env
    at = live_page(job.run_id)
    assert not at.exception, at.exception
    assert "Ranks" in [h.value for h in at.subheader]
    table = ranks_table(at)
    assert list(table["rank"]) == [0, 1] and list(table["node"]) == [0, 0]
    assert list(table["status"]) == ["answering", "answering"]
    assert (table["step"] > 0).all() and table["sync_wait (s)"].notna().all()
    assert table["staleness"].str.endswith(" / 5").all()  # the example's bound
    idle = chart_data(chart(at, IDLE))
    assert set(idle["rank"]) == {"rank 0", "rank 1"} and "sync_wait" in set(idle["series"])
    assert '"#d62728"' in chart(at, IDLE).proto.spec  # sync_wait in the marker red
    assert set(chart_data(chart(at, STALENESS))["series"]) == {"staleness max", "bound"}
    moved = chart_data(chart(at, BYTES))
    assert set(moved["series"]) <= {"sent", "received"} and set(moved["rank"]) <= \
        {"rank 0", "rank 1"}
    assert "2 ranks on 1 node" in "\n".join(c.value for c in at.caption)
    assert not at.warning


def test_an_unreachable_rank_is_marked(env):
    job = env
    written = job.target(1).read_bytes()
    job.write_target(1, f'- targets: ["127.0.0.1:{free_port()}"]\n  labels: {{rank: "1"}}\n')
    try:
        time.sleep(CACHE_SECONDS)
        at = live_page(job.run_id)
        assert not at.exception, at.exception
        [warning] = at.warning
        assert "**Rank 1** has no figures: unreachable" in warning.value
        table = ranks_table(at)
        assert list(table["status"]) == ["answering", "unreachable"]
        assert pd.isna(table["step"].iloc[1]) and table["step"].iloc[0] > 0
        idle = chart(at, IDLE)
        assert set(chart_data(idle)["rank"]) == {"rank 0"}  # no bars for rank 1 ...
        assert "rank 1 (unreachable)" in idle.proto.spec  # ... but its place on the axis
    finally:
        job.write_target(1, written)
