"""No request can take the machine down, and none can make the server read, write or
run what it should not. A real control plane over HTTP, a real SQLite store."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import httpx
import jsonschema
import pytest
import torch

from asteria_core.machine import MACHINE
from asteria_core.train import checkpoint as ckpt
from asteria_core.train.checkpoint import FORMAT_VERSION
from backend.store import RunStore, StoreError
from tests.backend.conftest import TINY, TOKEN, wait_for


def _config(**sections) -> dict:
    config = copy.deepcopy(TINY)
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def _start(client, **sections) -> str:
    r = client.post("/runs", json={"config": _config(**sections)})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _refused(r, *loc: str) -> str:
    """The 422's message for the field at `loc` (the request names it)."""
    assert r.status_code == 422, r.text
    [detail] = [d for d in r.json()["detail"] if d["loc"][:len(loc) + 1] == ["body", *loc]]
    return detail["msg"]


@pytest.fixture
def run_id(client):
    run_id = _start(client)
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["step"] >= 2)
    yield run_id
    client.post(f"/runs/{run_id}/stop")
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["status"] == "stopped")


# ---------------------------------------------------------------------- 1. machine limits
def test_a_worker_count_beyond_the_machine_is_refused_naming_the_bound(client, run_id):
    before = client.get(f"/runs/{run_id}/policy").json()
    r = client.patch(f"/runs/{run_id}/policy", json={"worker_kind": "process", "workers": 256})
    assert str(MACHINE.max_workers) in _refused(r, "workers")
    r = client.patch(f"/runs/{run_id}/policy", json={"worker_threads": 10_000})
    assert str(MACHINE.max_threads) in _refused(r, "worker_threads")
    assert client.get(f"/runs/{run_id}/policy").json() == before
    # The bound is in the API's schema too, where the dashboard's form reads it.
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert schema["PolicyUpdate"]["properties"]["workers"]["maximum"] == MACHINE.max_workers


@pytest.mark.parametrize(("sections", "loc", "bound"), [
    ({"train": {"threads": 10_000}}, ("config", "train", "threads"), str(MACHINE.max_threads)),
    ({"data": {"batch_size": 10**7}}, ("config", "data", "batch_size"), "65536"),
    ({"model": {"n_layer": 10**6}}, ("config", "model", "n_layer"), "1024"),
    # each size allowed on its own, together far more than this machine's memory
    ({"model": {"n_layer": 512, "n_embd": 16384, "n_head": 16, "block_size": 4096}},
     ("config", "model"), f"{MACHINE.memory_bytes / 2**30:.1f} GiB"),
])
def test_sizes_beyond_the_machine_are_refused_naming_the_bound(client, sections, loc, bound):
    r = client.post("/runs", json={"config": _config(**sections)})
    assert bound in _refused(r, *loc)
    assert client.get("/healthz").json()["active_run"] is None


# ---------------------------------------------------------------------- 2. store writes
def test_steps_the_store_cannot_hold_are_refused_and_the_store_keeps_writing(client):
    r = client.post("/runs", json={"config": _config(train={"steps": 2**63})})
    assert "1000000000" in _refused(r, "config", "train", "steps")
    run_id = _start(client, train={"steps": 5})
    wait_for(lambda: client.get(f"/runs/{run_id}").json()["status"] == "finished")
    steps = wait_for(lambda: len(s := client.get(f"/runs/{run_id}/steps").json()["steps"]) == 5
                     and s)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5]
    assert [run["id"] for run in client.get("/runs").json()] == [run_id]


def test_a_row_the_store_cannot_hold_fails_alone_and_the_writer_goes_on(tmp_path):
    store = RunStore(tmp_path / "runs.db", flush_seconds=0.05)
    try:
        with pytest.raises(StoreError, match="OverflowError"):
            store.create_run("too-long", {}, "runs/too-long", 2**63)
        store.create_run("fine", {}, "runs/fine", 10)
        store.add_step("fine", 1, '{"step": 1}')
        store.flush()
        assert store.get_run("too-long") is None
        assert store.get_run("fine")["total_steps"] == 10
        assert store.steps("fine", 0, 10) == [{"step": 1}]
    finally:
        store.close()


# ---------------------------------------------------------------------- 3. paths, checkpoints
class _Payload:
    """Unpickled, it runs a shell command: what a crafted checkpoint carries."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _crafted_checkpoint(path: Path, marker: Path) -> Path:
    torch.save({"format_version": FORMAT_VERSION, "step": 1, "payload": _Payload(marker)}, path)
    return path


def test_a_crafted_checkpoint_is_refused_without_running_its_code(tmp_path):
    marker = tmp_path / "ran"
    path = _crafted_checkpoint(tmp_path / "checkpoint.pt", marker)
    with pytest.raises(ValueError, match="not an Asteria checkpoint"):
        ckpt.load(path)
    assert not marker.exists()


def test_a_crafted_checkpoint_named_by_a_request_fails_the_run_and_runs_nothing(server,
                                                                                  client):
    data_dir = server.settings.data_dir
    data_dir.mkdir(parents=True, exist_ok=True)
    marker = data_dir / "ran"
    path = _crafted_checkpoint(data_dir / "crafted.pt", marker)
    run_id = _start(client, train={"resume": str(path)})
    run = wait_for(lambda: (r := client.get(f"/runs/{run_id}").json())["status"] == "failed"
                   and r)
    assert "not an Asteria checkpoint" in run["error"]
    assert not marker.exists()


@pytest.mark.parametrize(("sections", "loc"), [
    ({"data": {"corpus": "/proc/self/environ"}}, ("config", "data", "corpus")),
    ({"data": {"corpus": "/etc/passwd"}}, ("config", "data", "corpus")),
    ({"train": {"resume": "/etc/hostname"}}, ("config", "train", "resume")),
    ({"policy": {"disk_dir": "../../somewhere"}}, ("config", "policy", "disk_dir")),
    ({"telemetry": {"rapl_root": "/proc/self"}}, ("config", "telemetry", "rapl_root")),
])
def test_paths_outside_the_allowed_folders_are_refused(server, client, sections, loc):
    r = client.post("/runs", json={"config": _config(**sections)})
    assert "allowed" in _refused(r, *loc)
    assert client.get("/healthz").json()["active_run"] is None


def test_a_disk_dir_outside_the_allowed_folders_is_refused_and_never_created(
        server, client, run_id, tmp_path, monkeypatch):
    monkeypatch.chdir(server.settings.data_dir)  # where a relative path would land
    outside = (server.settings.data_dir / "../../somewhere").resolve()
    r = client.patch(f"/runs/{run_id}/policy", json={"disk_dir": "../../somewhere"})
    assert "allowed" in _refused(r, "disk_dir")
    assert not outside.exists()
    inside = server.settings.data_dir / "tiers"
    r = client.patch(f"/runs/{run_id}/policy", json={"disk_dir": str(inside)})
    assert r.status_code == 200, r.text


def _post_run(live, body: dict) -> tuple[httpx.Response, httpx.Client]:
    c = httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {TOKEN}"})
    return c.post("/runs", json=body), c


def test_a_corpus_may_be_named_only_inside_a_folder_the_operator_lists(server_factory, tmp_path):
    corpus = tmp_path / "corpora" / "text.txt"
    corpus.parent.mkdir()
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    body = {"config": _config(data={"corpus": str(corpus)}, train={"steps": 3})}
    with server_factory() as live:
        r, c = _post_run(live, body)
        assert "allowed" in _refused(r, "config", "data", "corpus")
    with server_factory(allowed_paths=[corpus.parent]) as live:
        r, c = _post_run(live, body)
        assert r.status_code == 201, r.text
        run_id = r.json()["id"]
        wait_for(lambda: c.get(f"/runs/{run_id}").json()["status"] == "finished")


# ---------------------------------------------------------------------- 9. what the fuzzer found
@pytest.mark.parametrize(("method", "path", "allow"), [
    ("DELETE", "/runs", "GET, POST"),
    ("PUT", "/runs/some-run/policy", "GET, PATCH"),
    ("GET", "/runs/some-run/stop", "POST"),
    ("POST", "/healthz", "GET"),
])
def test_a_405_names_the_methods_the_path_serves(server, method, path, allow):
    r = httpx.request(method, server.url + path)
    assert r.status_code == 405 and r.headers["allow"] == allow


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/runs", b"{not json"),
    ("POST", "/runs", b"\xff\xfe{"),
    ("PATCH", "/runs/some-run/policy", b'{"workers": '),
])
def test_without_the_token_a_malformed_body_gets_401_before_it_is_read(server, method, path,
                                                                        body):
    r = httpx.request(method, server.url + path, content=body,
                      headers={"content-type": "application/json"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def test_the_schema_states_the_cross_field_rule_json_schema_can(client):
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    workerless = {"swap_mode": "opportunistic", "workers": 0}
    for name in ("PolicyUpdate", "RunPolicy"):
        validator = jsonschema.Draft202012Validator(schemas[name])
        assert not validator.is_valid(workerless), name
        assert validator.is_valid({"swap_mode": "opportunistic", "workers": 1}), name
    assert not jsonschema.Draft202012Validator(schemas["PolicyUpdate"]).is_valid({})


def test_an_anonymous_reader_sees_no_paths_and_no_operators(server, client, run_id):
    r = client.patch(f"/runs/{run_id}/policy", json={"staleness_bound": 4},
                     headers={"user-agent": "operator-laptop/1.0"})
    assert r.status_code == 200
    [change] = wait_for(lambda: [c for c in client.get(f"/runs/{run_id}/policy/history").json()
                                 if c["applied_at"]])
    assert change["client"].startswith("127.0.0.1") and "operator-laptop" in change["client"]
    data_dir = str(server.settings.data_dir.resolve())
    assert data_dir in client.get(f"/runs/{run_id}").json()["run_dir"]  # with the token
    reads = [f"/runs/{run_id}", "/runs", f"/runs/{run_id}/policy",
             f"/runs/{run_id}/policy/history", f"/runs/{run_id}/steps", "/metrics", "/healthz"]

    def anonymous() -> dict[str, str]:
        with httpx.Client(base_url=server.url) as anon:
            return {path: anon.get(path).text for path in reads}

    for stage in ("active", "stopped"):  # served from memory, then from the store
        bodies = anonymous()
        for path, body in bodies.items():
            assert data_dir not in body and "operator-laptop" not in body, (stage, path)
        run = json.loads(bodies[f"/runs/{run_id}"])
        assert run["run_dir"] == f"runs/{run_id}" and run["config"]["train"]["out_dir"] == "runs"
        [seen] = json.loads(bodies[f"/runs/{run_id}/policy/history"])
        assert seen["client"] == "operator" and seen["diff"] == {"staleness_bound": [10, 4]}
        client.post(f"/runs/{run_id}/stop")
        wait_for(lambda: client.get(f"/runs/{run_id}").json()["status"] == "stopped")
