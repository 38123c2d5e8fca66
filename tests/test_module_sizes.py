"""Small modules with one job, checked on the source: no file of the product (the packages the
wheel ships) over MAX_LINES lines, and no class in asteria_core with more than MAX_METHODS
methods. A class past the bound does more than one job; split it by job, not by cutting names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("asteria", "asteria_core", "backend", "dashboard")
"""What the wheel ships (pyproject.toml's packages.find); the benchmarks stay in the checkout."""
MAX_LINES = 500
MAX_METHODS = 25


def product_files() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def methods(cls: ast.ClassDef) -> int:
    return sum(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) for node in cls.body)


def large_classes(source: str) -> list[tuple[str, int]]:
    return [(node.name, methods(node)) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.ClassDef) and methods(node) > MAX_METHODS]


def test_no_product_file_is_longer_than_the_bound():
    long = {str(p.relative_to(ROOT)): n for p in product_files()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"files over {MAX_LINES} lines: {long}"


def test_no_core_class_has_more_methods_than_the_bound():
    large = {f"{p.relative_to(ROOT)}::{name}": n for p in (ROOT / "asteria_core").rglob("*.py")
             for name, n in large_classes(p.read_text())}
    assert not large, f"classes with more than {MAX_METHODS} methods: {large}"


@pytest.mark.parametrize("count", [MAX_METHODS, MAX_METHODS + 1])
def test_the_method_count_reads_every_def_of_a_class_body(count):
    body = "".join(f"    def m{i}(self): ...\n" for i in range(count - 1))
    source = f"class C:\n{body}    async def last(self): ...\n    x = 1\n"
    assert large_classes(source) == ([] if count <= MAX_METHODS else [("C", count)])
