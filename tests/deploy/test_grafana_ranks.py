"""The dashboard's per-rank row against a real 2-rank run: examples/ddp_loop.py under torchrun
(rank 0 serves the control plane, rank 1 its own /metrics and its file_sd target), scraped by a
real Prometheus built from deploy/prometheus (the target file read from its targets/ folder).
Every query of the row answers for both ranks, as Grafana would send it with `$rank` = All."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.deploy.conftest import (
    REPO,
    Prometheus,
    free_port,
    start_prometheus,
    tail,
    wait_for,
)
from tests.deploy.test_grafana import DASHBOARD, PANELS, fill, has_data

pytestmark = pytest.mark.multiproc
ROW = "Ranks (data-parallel runs)"


def rank_panels() -> list[dict]:
    """The panels under the row ROW (rows own the panels below them, up to the next row)."""
    panels, inside = [], False
    for p in sorted(DASHBOARD["panels"], key=lambda p: (p["gridPos"]["y"], p["gridPos"]["x"])):
        if p["type"] == "row":
            inside = p["title"] == ROW
        elif inside:
            panels.append(p)
    return panels


@pytest.fixture(scope="module")
def two_ranks(procs, prom_bins, tmp_path_factory) -> Iterator[Prometheus]:
    """A 2-rank run that keeps training, and a Prometheus scraping both of its ranks."""
    root = tmp_path_factory.mktemp("ranks")
    plane = free_port()
    prometheus = start_prometheus(procs, prom_bins, root, f"127.0.0.1:{plane}",
                                  name="prometheus-ranks")
    # The run writes rank 1's target into <data dir>/targets: the folder the config reads.
    run, run_log = procs.start("ddp-ranks", [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(free_port()), str(REPO / "examples" / "ddp_loop.py"),
        "--steps", "1000000", "--port", str(plane), "--metrics-port", "0",
        "--data-dir", str(root / "etc")])

    def both_scraped() -> bool:
        if run.poll() is not None:
            pytest.fail(f"the 2-rank run exited ({run.returncode}):\n{tail(run_log)}",
                        pytrace=False)
        return len(prometheus.query("asteria_distributed_owned_blocks")) == 2

    wait_for(both_scraped, 240, "both ranks scraped")
    yield prometheus
    procs.stop(run)


def test_the_rank_row_has_the_panels_and_a_rank_variable():
    titles = [p["title"] for p in rank_panels()]
    assert titles == ["sync_wait per rank", "Idle by cause per rank",
                      "Staleness vs bound per rank", "Exchange bytes per rank",
                      "Owned blocks per rank"]
    (rank,) = [v for v in DASHBOARD["templating"]["list"] if v["name"] == "rank"]
    assert rank["definition"] == "label_values(asteria_run_info, rank)"
    assert rank["includeAll"] and rank["allValue"] == ".+"
    for p in rank_panels():
        assert p in PANELS
        assert all('rank=~"$rank"' in t["expr"] and "rank" in t["legendFormat"]
                   for t in p["targets"]), p["title"]


def test_every_rank_query_answers_for_both_ranks(two_ranks):
    pending = {(p["title"], t["refId"]): fill(t["expr"]) for p in rank_panels()
               for t in p["targets"]}

    def answered() -> bool:
        for where, expr in list(pending.items()):
            result = two_ranks.query_range(expr, seconds=60)
            ranks = {s["metric"].get("rank") for s in result if has_data([s])}
            if ranks == {"0", "1"}:
                del pending[where]
        return not pending

    wait_for(answered, 120, f"data for both ranks in {sorted(pending)}", interval=2)
    values = httpx.get(f"{two_ranks.url}/api/v1/label/rank/values",
                       params={"match[]": "asteria_run_info"}, timeout=5).json()["data"]
    assert values == ["0", "1"]  # what the rank variable lists


def test_the_owners_split_the_blocks_and_bytes_flow_both_ways(two_ranks):
    owned = {s["metric"]["rank"]: int(float(s["value"][1]))
             for s in two_ranks.query("asteria_distributed_owned_blocks")}
    assert set(owned) == {"0", "1"} and all(n > 0 for n in owned.values())
    moved = wait_for(lambda: [s for s in two_ranks.query(
        "sum by (rank, direction) (asteria_distributed_exchange_bytes_total)")
        if float(s["value"][1]) > 0], 60, "exchange bytes")
    assert {(s["metric"]["rank"], s["metric"]["direction"]) for s in moved} >= \
        {("0", "sent"), ("1", "received")}
