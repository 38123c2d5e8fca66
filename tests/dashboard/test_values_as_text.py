"""Values from the control plane are shown as text, never rendered as Markdown: a policy value
holding a link and an image (a `disk_dir` any token holder may set) shows as those characters on
the Live view, in headless Chromium, with no link, no image and no request to the other host;
and no page shows a bare string of its source (Streamlit's magic writes any expression
statement of a page script)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from dashboard.markdown import code, text
from tests.backend.conftest import TOKEN, free_port
from tests.dashboard.stack import APP, Dashboard, wait_until

BAIT = "[Session expired - sign in again](https:evil.example) ![pixel](https:evil.example)"


@pytest.fixture(scope="module")
def dashboard(api, tmp_path_factory):
    log = tmp_path_factory.mktemp("streamlit") / "streamlit.log"
    with Dashboard(free_port(), api.url, TOKEN, log) as dash:
        yield dash


def test_a_policy_value_holding_markdown_is_shown_as_text(browser, dashboard, api, http,
                                                          live_run):
    bait = f"{api.settings.data_dir}/{BAIT}"
    r = http.patch(f"/runs/{live_run}/policy", json={"disk_dir": bait})
    assert r.status_code == 200, r.text
    version = r.json()["version"]
    wait_until(lambda: http.get(f"/runs/{live_run}/policy").json()["version"] == version,
               what="the change to be applied")
    page = browser.new_page(viewport={"width": 1600, "height": 2600})
    elsewhere: list[str] = []
    page.on("request", lambda req: "evil.example" in req.url and elsewhere.append(req.url))
    page.goto(dashboard.url)
    # the change's marker (caption) and the form's current value both carry the bait
    shown = page.get_by_text(BAIT, exact=False)
    wait_until(lambda: shown.count() >= 2, interval=0.2, what="the value shown as text")
    assert page.locator('a[href*="evil"]').count() == 0
    assert page.locator('img[src*="evil"]').count() == 0
    assert elsewhere == []


def test_escaped_values_read_back_as_themselves():
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark")
    for value in (BAIT, "a `b` c", "``", "*x* _y_ <b>z</b> $1+1$ :red[w] # h", "line\n# two"):
        for rendered in (md.renderInline(text(value)), md.renderInline(code(value))):
            assert "<a" not in rendered and "<img" not in rendered and "<em" not in rendered
            assert "<b>" not in rendered


def page_scripts() -> list[Path]:
    return [APP, *sorted((APP.parent / "views").glob("*.py"))]


@pytest.mark.parametrize("script", page_scripts(), ids=lambda p: p.name)
def test_no_page_script_has_a_bare_string_streamlit_would_show(script):
    """Docstrings of the module, a class or a function are not shown; any other expression
    statement that is a constant is."""
    tree = ast.parse(script.read_text())
    docstrings = {id(body[0]) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
                  and (body := node.body) and isinstance(body[0], ast.Expr)}
    bare = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Expr)
            and isinstance(n.value, ast.Constant | ast.JoinedStr) and id(n) not in docstrings]
    assert bare == [], f"{script.name}: bare strings at lines {bare}"


def test_markdown_escapes_leave_the_words():
    assert re.sub(r"\\(.)", r"\1", text(BAIT)) == BAIT
