"""Training never waits on the control plane's disk, and a policy change answered 200 is on disk.

A real server process trains; this test holds the run store's SQLite write lock from a
connection of its own (`BEGIN IMMEDIATE` on the same file, as another program would) while a
PATCH arrives. The steps go on at their pace (checkpoints included: the store learns of them
late), the PATCH is answered 503 or after the lock is gone, reads are answered meanwhile; then
`kill -9` and a restart: every change answered 200 is in the history, and no version was
given to two different changes.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.backend.conftest import TOKEN, free_port, wait_for

HANG = 300
"""Seconds: a hang guard for a loaded machine, never a target."""
HOLD = 10.0
"""Seconds the test holds the store's write lock."""
STEP_RATIO_GUARD = 10.0
"""Median step time while the lock is held over the one before: a generous guard for a loaded
machine (tiny steps feel every other thread); a boundary that waited on the lock makes it
about HOLD / step time, hundreds to thousands, and its step takes most of HOLD."""
READ_GUARD = 5.0
"""Seconds a read may take while a PATCH waits on the lock (it waited for the whole hold)."""
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ARGS = ["--model.n_layer", "2", "--model.n_head", "2", "--model.n_embd", "32",
        "--model.block_size", "32", "--data.batch_size", "4", "--train.steps", "100000",
        "--train.eval_interval", "1000", "--train.eval_batches", "2",
        "--train.checkpoint_interval", "10", "--train.threads", "1"]


def _serve(data_dir, port):
    env = {**os.environ, "ASTERIA_TOKEN": TOKEN, "ASTERIA_STORE_FLUSH_SECONDS": "0.1"}
    return subprocess.Popen(
        [sys.executable, "-m", "asteria", "serve", "--port", str(port), "--data-dir",
         str(data_dir), *ARGS], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _get(url):
    try:
        return httpx.get(url, timeout=30).json()
    except httpx.HTTPError:
        return None


def _timed_get(url) -> float:
    start = time.monotonic()
    assert httpx.get(url, timeout=HANG).status_code == 200
    return time.monotonic() - start


def _gaps(records, since: float, until: float) -> list[float]:
    """Seconds between consecutive records ending in (since, until]: each step's whole time,
    its boundary and any checkpoint included."""
    return [b["time"] - a["time"] for a, b in zip(records, records[1:], strict=False)
            if since < b["time"] <= until]


def test_a_held_store_lock_stalls_no_step_and_loses_no_acknowledged_change(server_factory,
                                                                           tmp_path):
    data_dir, port = tmp_path / "data", free_port()
    database = data_dir / "asteria.db"
    base = f"http://127.0.0.1:{port}"
    proc = _serve(data_dir, port)
    acknowledged: dict[int, dict] = {}
    try:
        run_id = wait_for(lambda: (h := _get(f"{base}/healthz")) and h["active_run"], HANG)
        wait_for(lambda: ((_get(f"{base}/runs/{run_id}") or {}).get("step") or 0) >= 40, HANG)
        held_from = time.time()

        lock = sqlite3.connect(database, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")  # the write lock, held as another program would
        answer: dict = {}

        def patch():
            r = httpx.patch(f"{base}/runs/{run_id}/policy", json={"staleness_bound": 3},
                            headers=AUTH, timeout=HANG)
            answer.update(code=r.status_code, body=r.json(), at=time.time())

        patcher = threading.Thread(target=patch)
        patcher.start()
        time.sleep(1.0)  # the PATCH is waiting on the lock now
        second = httpx.patch(f"{base}/runs/{run_id}/policy", json={"refresh_interval": 8},
                             headers=AUTH, timeout=HANG)  # refused, not queued behind it
        assert second.status_code == 503 and "being stored" in second.text, second.text
        assert second.headers["Retry-After"].isdigit()
        with ThreadPoolExecutor(20) as pool:  # anonymous reads and health checks meanwhile
            reads = list(pool.map(_timed_get, [f"{base}/runs/{run_id}/policy"] * 20 +
                                  [f"{base}/healthz"] * 5))
        while time.time() < held_from + HOLD:
            reads.append(_timed_get(f"{base}/healthz"))
            time.sleep(0.5)
        released_at = time.time()
        lock.execute("ROLLBACK")
        lock.close()
        patcher.join(HANG)

        assert answer["code"] in (200, 503), answer
        if answer["code"] == 200:  # only once on disk, so only after the lock went
            assert answer["at"] >= released_at, answer
            acknowledged[answer["body"]["version"]] = answer["body"]["diff"]
        else:
            assert "locked" in answer["body"]["detail"], answer
        assert max(reads) < READ_GUARD, sorted(reads)[-5:]

        for change in ({"refresh_interval": 7}, {"staleness_bound": 4}):
            r = httpx.patch(f"{base}/runs/{run_id}/policy", json=change, headers=AUTH,
                            timeout=HANG)
            assert r.status_code == 200, r.text
            acknowledged[r.json()["version"]] = r.json()["diff"]
        at_release = _get(f"{base}/runs/{run_id}")["step"]
        wait_for(lambda: _get(f"{base}/runs/{run_id}")["step"] >= at_release + 3, HANG)
        records = httpx.get(f"{base}/runs/{run_id}/steps", params={"limit": 10000},
                            timeout=HANG).json()["steps"]
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

    before = _gaps(records, 0, held_from)[-30:]
    during = _gaps(records, held_from, released_at)
    ratio = statistics.median(during) / statistics.median(before)
    print(f"step time while the store's lock was held: {ratio:.2f}x the steps before "
          f"({len(during)} steps in {HOLD:g} s; reads: max {max(reads):.3f} s, median "
          f"{statistics.median(reads):.3f} s; PATCH: {answer['code']})")
    assert len(during) >= 3 and ratio < STEP_RATIO_GUARD, (ratio, during)
    assert max(during) < HOLD / 2, max(during)  # no step waited for the lock

    with server_factory(data_dir=data_dir) as live, httpx.Client(
            base_url=live.url, headers=AUTH, timeout=HANG) as c:
        history = c.get(f"/runs/{run_id}/policy/history").json()
        stored = {h["version"]: h["diff"] for h in history}
        for version, diff in acknowledged.items():
            assert stored.get(version) == diff, (version, diff, history)
        if answer["code"] != 200:  # refused: nothing of it was written
            assert all(d != {"staleness_bound": [10, 3]} for d in stored.values()), history
        assert c.post(f"/runs/{run_id}/resume").status_code == 202
        r = c.patch(f"/runs/{run_id}/policy", json={"refresh_interval": 9})
        assert r.status_code == 200, r.text
        assert r.json()["version"] > max(acknowledged)  # above every version given out
        c.post(f"/runs/{run_id}/stop")
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "stopped", HANG)
        versions = [h["version"] for h in c.get(f"/runs/{run_id}/policy/history").json()]
        assert len(versions) == len(set(versions))
