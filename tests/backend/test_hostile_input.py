"""Input JSON Schema cannot describe, over every route: no 5xx, and a 422 that names the field.

Python's json module reads NaN, Infinity, -Infinity and 1e400 (as inf) as numbers, and
"\\ud800" (a lone surrogate) and "\\u0000" into a str: none can be written back as JSON, UTF-8
cannot encode the surrogate and the OS refuses the NUL in a path. schemathesis generates from
the schema, which cannot state them, so it never sent them. Here: the cases found by hand, one
by one, then a hypothesis fuzz over every operation of the OpenAPI document. It takes
schemathesis' schema-valid cases and puts one hostile value into the body (as a value or a
key), a path parameter or a query parameter, written as raw bytes (json.dumps cannot write
1e400, and writes NaN only as NaN), sent with the token over real HTTP to a live server whose
run is active (paused, so it leaves the CPU to the test).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.app import create_app
from backend.settings import Settings
from tests.backend.conftest import TINY, TOKEN, LiveServer, free_port, wait_for

AUTH = {"Authorization": f"Bearer {TOKEN}"}
NUMBERS = ("NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1E999")
"""Raw JSON number tokens Python reads as nan or inf."""
STRINGS = ('"\\ud800"', '"\\udfff"', '"a\\udc80b"', '"\\u0000"', '"corpus\\u0000.txt"',
           '"\\ud800\\u0000"')
"""Raw JSON strings with a lone surrogate or a NUL byte."""
BAD_CHARS = ("\x00", "\ud800", "\udfff", "\udc80")
EXAMPLES = 40
"""Hypothesis examples per operation (15 operations)."""


class Raw(str):
    """A JSON token written as is."""


def dumps(value: Any) -> str:
    """JSON text of `value`, with Raw tokens (as values or keys) written verbatim."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{dumps(k)}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN and Infinity: what a browser's JSON.parse accepts."""
    def refuse(token: str) -> None:
        raise ValueError(f"not JSON: {token}")
    return json.loads(text, parse_constant=refuse)


def url_part(text: str) -> str:
    """A path or query value percent-encoded as bytes: a surrogate as the three bytes UTF-8
    would give it (invalid UTF-8 on the wire), a NUL as %00."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


def positions(value: Any, at: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """Every place in a JSON value: (path, "value") to replace, (path, "key") to add a key."""
    yield at, "value"
    if isinstance(value, dict):
        yield at, "key"
        for k, v in value.items():
            yield from positions(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from positions(v, (*at, i))


def put(value: Any, path: tuple, kind: str, token: Raw) -> Any:
    """A copy of `value` with `token` at `path` (as the value there, or as a new key)."""
    if not path:
        return {**value, token: 1} if kind == "key" else token
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: put(value[head], rest, kind, token)}
    return [put(v, rest, kind, token) if i == head else v for i, v in enumerate(value)]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """A live server whose one run is active and paused."""
    settings_ = Settings(port=free_port(), data_dir=tmp_path_factory.mktemp("hostile"),
                         token=TOKEN, start_default_run=False, store_flush_seconds=0.1)
    with LiveServer(settings_) as server, httpx.Client(base_url=server.url, headers=AUTH,
                                                       timeout=60) as http:
        r = http.post("/runs", json={"config": TINY})
        assert r.status_code == 201, r.text
        run_id = r.json()["id"]
        assert http.post(f"/runs/{run_id}/pause").status_code == 202
        wait_for(lambda: http.get(f"/runs/{run_id}").json()["status"] == "paused")
        yield server, http, run_id
        http.post(f"/runs/{run_id}/stop")


def errors(r: httpx.Response) -> list[list]:
    return [e["loc"] for e in strict_json(r.text)["detail"]]


# ------------------------------------------------------------------ the cases found by hand
@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_non_finite_number_in_a_policy_change_is_a_422_naming_the_field(live, token):
    _, http, run_id = live
    r = http.patch(f"/runs/{run_id}/policy", content=f'{{"refresh_interval": {token}}}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert errors(r) == [["body", "refresh_interval"]]


@pytest.mark.parametrize(("body", "loc"), [
    ('{"config": {"model": {"n_layer": 1e400}}}', ["body", "config", "model", "n_layer"]),
    ('{"config": {"optim": {"lr": NaN}}}', ["body", "config", "optim", "lr"]),
    ('{"config": {"policy": {"refresh_interval": NaN}}}',
     ["body", "config", "policy", "refresh_interval"]),
    ('{"policy": {"staleness_bound": -Infinity}}', ["body", "policy", "staleness_bound"]),
    ('{"config": {"data": {"corpus": "\\ud800"}}}', ["body", "config", "data", "corpus"]),
    ('{"config": {"data": {"corpus": "a\\u0000b"}}}', ["body", "config", "data", "corpus"]),
    ('{"config": {"train": {"resume": "ckpt\\u0000.pt"}}}', ["body", "config", "train", "resume"]),
    ('{"policy": {"disk_dir": "\\udfff"}}', ["body", "policy", "disk_dir"]),
])
def test_hostile_values_in_a_new_run_are_a_422_naming_the_field(live, body, loc):
    _, http, _ = live
    r = http.post("/runs", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert loc in errors(r)
    assert len(http.get("/runs").json()) == 1  # nothing was started


@pytest.mark.parametrize("value", ['"\\ud800"', '"tier\\u0000"'])
def test_a_hostile_disk_dir_in_a_policy_change_is_a_422_naming_the_field(live, value):
    _, http, run_id = live
    before = http.get(f"/runs/{run_id}/policy").json()["version"]
    r = http.patch(f"/runs/{run_id}/policy", content=f'{{"disk_dir": {value}}}',
                   headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert errors(r) == [["body", "disk_dir"]]
    assert http.get(f"/runs/{run_id}/policy").json()["version"] == before


@pytest.mark.parametrize("path", ["/runs/{}", "/runs/{}/policy", "/runs/{}/steps",
                                  "/runs/{}/ranks", "/runs/{}/policy/history"])
def test_a_nul_byte_in_a_run_id_is_a_422_naming_the_path_parameter(live, path):
    _, http, run_id = live
    r = http.get(path.format(run_id + "%00"))
    assert r.status_code == 422, r.text
    assert errors(r) == [["path", "run_id"]]


# ------------------------------------------------------------------ the fuzz, every route
schema = schemathesis.openapi.from_dict(create_app(Settings(start_default_run=False)).openapi())
OPERATIONS = [result.ok() for result in schema.get_all_operations()]
STATS: dict[str, int] = {"cases": 0, "5xx": 0}


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield
    print(f"\nhostile-input fuzz: {STATS['cases']} cases, {STATS['5xx']} 5xx")


def hostile_text() -> st.SearchStrategy[str]:
    plain = st.text(st.characters(codec="utf-8", exclude_characters="/?#%"), max_size=6)
    return st.builds(lambda a, bad, b: a + bad + b, plain, st.sampled_from(BAD_CHARS), plain)


def test_every_operation_is_fuzzed():
    assert {(op.method.upper(), op.path) for op in OPERATIONS} >= {
        ("POST", "/runs"), ("PATCH", "/runs/{run_id}/policy"), ("GET", "/runs/{run_id}/steps"),
        ("POST", "/runs/{run_id}/stop"), ("GET", "/runs/{run_id}/events")}
    assert len(OPERATIONS) >= 15


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: f"{op.method.upper()} {op.path}")
def test_no_5xx_from_hostile_values_anywhere(live, operation):
    server, _, run_id = live
    path_names = [p.name for p in operation.path_parameters]
    query_names = [p.name for p in operation.query]
    sites = [("path", n) for n in path_names] + [("query", n) for n in query_names]
    if operation.body:
        sites.append(("body", None))
    # No parameter and no body (GET /runs, /metrics, /healthz): an unknown query parameter.
    sites = sites or [("query", "x")]

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
              database=None)
    @given(case=operation.as_strategy(), data=st.data())
    def check(case, data):
        where, name = data.draw(st.sampled_from(sites), label="site")
        # Path parameters: the live run's id (another, such as a proposal's id: the generated
        # value) unless hostile here. A command's one site is its path, so no command ever
        # reaches the run.
        params = {n: url_part(run_id if n == "run_id" else str(case.path_parameters[n]))
                  for n in path_names}
        query = {k: url_part(str(v)) for k, v in (case.query or {}).items()}
        body = case.body if isinstance(case.body, dict | list) else {}
        want: list | None = None
        if where == "path":
            params[name] = url_part(data.draw(hostile_text(), label="path value"))
        elif where == "query":
            text = data.draw(st.sampled_from(NUMBERS) | hostile_text(), label="query value")
            query[name] = url_part(text)
            want = ["query", name] if name in query_names else None
        else:
            spot, kind = data.draw(st.sampled_from(list(positions(body))), label="body place")
            token = Raw(data.draw(st.sampled_from(STRINGS if kind == "key" else
                                                  NUMBERS + STRINGS), label="token"))
            body = put(body, spot, kind, token)
            # A key a config section does not have is refused after the checks of the values
            # (which may refuse another generated value first): only "somewhere in the body".
            want = ["body", *spot] if kind == "value" else ["body"]
        url = server.url + operation.path.format(**params)
        if query:
            url += "?" + "&".join(f"{k}={v}" for k, v in query.items())
        content = dumps(body).encode() if operation.body or where == "body" else None
        r = httpx.request(operation.method.upper(), url, content=content, timeout=60,
                          headers={**AUTH, "content-type": "application/json"})
        STATS["cases"] += 1
        STATS["5xx"] += r.status_code >= 500
        assert r.status_code < 500, (operation.method, url, content, r.status_code, r.text)
        if r.headers.get("content-type", "").startswith("application/json"):
            strict_json(r.text)  # the answer is JSON a browser can read
        # a NUL byte, or text where an integer id (a proposal's) goes: refused, named
        if where == "path" and ("%00" in url or name != "run_id"):
            assert r.status_code == 422, (url, r.status_code, r.text)
            assert ["path", name] in errors(r)
        elif where == "path":  # UTF-8 decoding made the surrogate U+FFFD: no such run
            # (or a 422 for the generated body: schemathesis writes 2.0 for an integer)
            assert r.status_code in ((404, 422) if operation.body else (404,)), r.text
        elif want is not None:
            assert r.status_code == 422, (url, content, r.status_code, r.text)
            assert any(loc[:len(want)] == want for loc in errors(r)), (want, r.text)

    check()
