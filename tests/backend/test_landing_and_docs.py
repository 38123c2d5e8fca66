"""A new user's first URLs: the root answers with a page of links that
work, and the API document declares the bearer scheme on exactly the routes that need the
token, so /docs shows an Authorize button and "Try it out" can send the token."""

from __future__ import annotations

import re

import httpx

from backend.app import create_app
from backend.settings import Settings


def test_the_root_is_a_page_of_links_that_answer(server):
    r = httpx.get(f"{server.url}/")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    links = re.findall(r'href="([^"]+)"', r.text)
    assert {"/docs", "/metrics", "/healthz"} <= set(links)
    for link in links:
        assert httpx.get(f"{server.url}{link}").status_code == 200, link
    assert "<token>" not in r.text  # the description's text is escaped, not markup


def test_the_root_links_the_dashboard_when_its_address_is_known(server_factory):
    with server_factory(dashboard_url="http://127.0.0.1:8501") as live:
        page = httpx.get(f"{live.url}/").text
        assert 'href="http://127.0.0.1:8501"' in page


def test_the_routes_that_need_the_token_declare_the_bearer_scheme(server):
    doc = create_app(Settings(start_default_run=False)).openapi()
    schemes = doc["components"]["securitySchemes"]
    [(name, scheme)] = schemes.items()
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    declared, refused = set(), set()
    for path, operations in doc["paths"].items():
        if path.endswith("/events"):
            continue  # a stream; public (no token), like every GET
        for method, operation in operations.items():
            if operation.get("security"):
                assert operation["security"] == [{name: []}]
                declared.add((method, path))
            r = httpx.request(method, server.url + path.replace("{run_id}", "nope"), json={})
            if r.status_code == 401:
                refused.add((method, path))
    assert declared == refused  # exactly the routes that refuse a request without the token
    # POST /runs, the four commands, PATCH the policy, the autopilot's settings, accept, dismiss
    assert len(declared) == 9
