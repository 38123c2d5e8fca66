"""/docs works on a machine without internet: Swagger UI's page names no other host, the script,
styles and icon it names are served by the control plane itself (from the swagger-ui-bundle-v2
package), and in headless Chromium, with every request to another host refused, it renders the
API. ReDoc is off (it would load its script from a CDN)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import httpx

from tests.components import missing
from tests.dashboard.stack import chromium

ASSET_TYPES = {".js": "javascript", ".css": "text/css", ".png": "image/png",
               ".json": "application/json"}


def page_urls(html: str) -> list[str]:
    """Every address the page loads: src=, href= and the OpenAPI document's url."""
    return re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)


def test_docs_names_no_other_host_and_the_app_serves_what_it_names(server):
    with httpx.Client(base_url=server.url, timeout=30) as http:  # no token: docs are public
        page = http.get("/docs")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert not re.search(r"(?:https?:)?//", page.text), page.text
        urls = page_urls(page.text)
        assert {u.rsplit(".", 1)[-1] for u in urls} == {"css", "png", "js", "json"}, urls
        for url in urls:
            assert url.startswith("/") and not url.startswith("//"), url
            asset = http.get(url)
            assert asset.status_code == 200, url
            assert ASSET_TYPES[url[url.rindex("."):]] in asset.headers["content-type"], url
            assert len(asset.content) > 500, url
        assert http.get("/redoc").status_code == 404
        refused = http.post(urls[0])
        assert refused.status_code == 405 and refused.headers["allow"] == "GET, HEAD"


def test_docs_render_in_chromium_with_no_request_leaving_the_machine(server):
    path, reason = chromium()
    if path is None:
        missing(f"Chromium: {reason}")
    from playwright.sync_api import sync_playwright

    own = urlsplit(server.url).netloc
    elsewhere: list[str] = []

    def only_here(route) -> None:
        if urlsplit(route.request.url).netloc == own:
            route.continue_()
        else:  # as on a machine without internet
            elsewhere.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(path), headless=True)
        try:
            page = browser.new_page()
            page.route("**/*", only_here)
            page.goto(f"{server.url}/docs")
            title = page.locator(".swagger-ui .info .title")
            title.wait_for(timeout=30_000)
            assert title.inner_text().startswith("Asteria control plane")
            paths = page.locator(".opblock-summary-path")
            paths.first.wait_for(timeout=30_000)
            assert "/runs/{run_id}/policy" in paths.all_inner_texts()
        finally:
            browser.close()
    assert elsewhere == []
