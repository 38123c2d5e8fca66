"""schemathesis (v4) against the live control plane's OpenAPI, with and without the token: no
5xx, no schema violations, and no 2xx to a mutating request without the token.

The schema is the app's own OpenAPI document; every generated case (positive and negative) is
sent over real HTTP to a live server with an active run. Every check runs, with one exclusion
in the run with the token, for a stated reason:
- positive_data_acceptance: rules JSON Schema cannot state rightly reject some schema-valid
  bodies with a 422 naming the field: a path must lie inside the folders the operator allows
  (settings), swap_delay <= staleness_bound compares two values, a PATCH is validated merged into
  the run's current policy, a config key must exist in its section, a model and batch must fit
  the machine's memory together. (The rule it can state, no opportunistic mode without workers,
  is in the schema as `not`; PolicyUpdate has minProperties 1.)
Without the token nothing is excluded: every mutating route answers 401 (documented) before it
reads the body, whatever the body. The routes that need the token declare the bearer scheme, so
schemathesis also sends made-up tokens: after a burst of them the client is throttled, and a
request carrying any token then gets 429 with Retry-After (documented) instead, still before
the body is read.

Non-finite numbers, huge exponents, lone surrogates and NUL bytes, which JSON Schema cannot
describe and schemathesis does not generate, are fuzzed over every route by
tests/backend/test_hostile_input.py.
"""

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from backend.app import create_app
from backend.settings import Settings
from tests.backend.conftest import TINY, TOKEN, LiveServer, free_port

schema = schemathesis.openapi.from_dict(create_app(Settings(start_default_run=False)).openapi())
MUTATING = ("POST", "PATCH", "PUT", "DELETE")


@pytest.fixture(scope="module")
def live_url(tmp_path_factory):
    settings_ = Settings(port=free_port(), data_dir=tmp_path_factory.mktemp("st"), token=TOKEN,
                         start_default_run=False, store_flush_seconds=0.1)
    with LiveServer(settings_) as live:
        r = httpx.post(f"{live.url}/runs", json={"config": TINY},
                       headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 201
        yield live.url


# One pytest item per operation, each a hypothesis test of its own, rather than
# `schema.parametrize()`: that reports operations as subtests, and under pytest-xdist (the suite
# runs in two workers) a failing subtest was lost, so the run passed whatever the API answered.
OPERATIONS = [result.ok() for result in schema.get_all_operations()]
EXAMPLES = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def cases(operation):
    """Valid and invalid requests to `operation`, as schemathesis generates them."""
    return st.one_of(operation.as_strategy(GenerationMode.POSITIVE),
                     operation.as_strategy(GenerationMode.NEGATIVE))


def by_name(operation) -> str:
    return f"{operation.method.upper()} {operation.path}"


@pytest.mark.parametrize("operation", OPERATIONS, ids=by_name)
def test_api_conforms_to_its_schema(operation, live_url):
    @EXAMPLES
    @given(case=cases(operation))
    def check(case):
        case.call_and_validate(base_url=live_url, headers={"Authorization": f"Bearer {TOKEN}"},
                               excluded_checks=[positive_data_acceptance])

    check()


@pytest.mark.parametrize("operation", OPERATIONS, ids=by_name)
def test_without_the_token_nothing_changes_and_the_schema_holds(operation, live_url):
    @EXAMPLES
    @given(case=cases(operation))
    def check(case):
        response = case.call(base_url=live_url)
        case.validate_response(response)
        method = case.method.upper()
        if method in MUTATING:
            assert not 200 <= response.status_code < 300, (method, case.path,
                                                          response.status_code)
            assert response.status_code in (401, 429), (method, case.path, response.status_code)
            if response.status_code == 429:  # throttled after made-up tokens: only then
                assert "authorization" in {h.lower() for h in response.request.headers}
                assert int(response.headers["retry-after"][0]) >= 1

    check()
