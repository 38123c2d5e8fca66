"""House style for the dashboard, checked on its sources: page scripts name no runtime import
(tests/test_layering.py checks the same on the loaded modules), pages stay short, and every
widget has a key."""

from __future__ import annotations

import ast

import pytest

from tests.dashboard.stack import ROOT

DASHBOARD = ROOT / "dashboard"
PAGES = sorted((DASHBOARD / "views").glob("*.py")) + [DASHBOARD / "app.py"]
FORBIDDEN = ("torch", "asteria_core", "backend")
WIDGETS = {"text_input", "number_input", "selectbox", "multiselect", "button", "toggle",
           "form_submit_button", "checkbox", "radio", "slider", "text_area", "form",
           "data_editor", "segmented_control", "pills"}


def imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_page_scripts_import_no_runtime_and_stay_short(page):
    text = page.read_text()
    for name in imported(ast.parse(text)):
        assert name.split(".")[0] not in FORBIDDEN, f"{page.name} imports {name}"
    assert len(text.splitlines()) < 150, f"{page.name} has grown past 150 lines"


def test_every_widget_has_a_key():
    missing = []
    for path in sorted(DASHBOARD.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in WIDGETS):
                has_key = any(k.arg == "key" for k in node.keywords) or (
                    node.func.attr == "form" and node.args)
                if not has_key:
                    missing.append(f"{path.name}:{node.lineno} {node.func.attr}")
    assert not missing, f"widgets without a key: {missing}"
