"""The documents speak of the product as it is today, and only of that.

- No words of the process that made it (a session, "issue N") in README.md, docs/ or the code's
  comments and docstrings; the browser's or a process's session is the product's own word.
- No machine narrative, dates or commit hashes outside the generated blocks in README.md and
  docs/*.md (docs/benchmark-history.md is history, and docs/benchmarks.md is generated whole).
- Every backticked `module.name` or `Class.attr` of the project's packages in the docs exists.
- A measured-looking number in the README's prose is in a generated block or is a constant read
  here from the code (ports, defaults, bounds, versions).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from asteria_bench import report
from backend.commands import SERVED_RUN

ROOT = Path(__file__).resolve().parents[1]
HISTORY = ROOT / "docs" / "benchmark-history.md"
GENERATED_WHOLE = ROOT / "docs" / "benchmarks.md"
CODE = ("asteria", "asteria_core", "asteria_bench", "backend", "dashboard", "examples")
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PROCESS = re.compile(r"\bsessions? \d+|\b(?:next|previous|earlier|later|another) session\b|"
                     r"\bsession that wrote\b|\blent to the session\b|\bissues? #?\d+|"
                     r"\bthe issue's\b|\b(?:this|next|previous) turn of (?:work|the)\b", re.I)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
HASH = re.compile(r"(?<![\w/.-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
MACHINE = re.compile(r"\b(?:this|that|another|the next|a new|this repository's)\s+(?:\d+-core\s+)?"
                     r"machine\b|\bAMD EPYC\b|\bXeon\b|\bload \d|\bon \d+ cores? here\b", re.I)


def without_generated(text: str) -> str:
    """`text` less its generated blocks (the performance section and quoted tables)."""
    start, end = text.find(report.BEGIN), text.find(report.END)
    if start >= 0 and end > start:
        text = text[:start] + text[end + len(report.END):]
    return report.TABLE_BLOCK.sub("", text)


def comments_and_docstrings(path: Path) -> str:
    source = path.read_text()
    parts = [m.group(0) for m in re.finditer(r"#.*$", source, re.M)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node) or "")
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            parts.append(node.value.value)  # attribute docstrings
    return "\n".join(parts)


def code_files() -> list[Path]:
    return sorted(p for d in CODE for p in (ROOT / d).rglob("*.py"))


def process_words(text: str) -> list[str]:
    return [m.group(0) for m in PROCESS.finditer(text)]


def narrative(text: str) -> list[str]:
    return [m.group(0) for rx in (DATE, HASH, MACHINE) for m in rx.finditer(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_process_words_in_the_pages(page):
    assert not process_words(page.read_text()), f"{page.name}: {process_words(page.read_text())}"


def test_no_process_words_in_comments_docstrings_or_generated_text():
    found = {str(p.relative_to(ROOT)): process_words(comments_and_docstrings(p))
             for p in code_files()}
    for path in sorted((ROOT / "docs" / "benchmarks").glob("*.json")):
        found[str(path.relative_to(ROOT))] = process_words(path.read_text())
    assert not {k: v for k, v in found.items() if v}


@pytest.mark.parametrize("page", [p for p in PAGES if p not in (HISTORY, GENERATED_WHOLE)],
                         ids=lambda p: p.name)
def test_no_dates_hashes_or_machine_narrative_outside_generated_blocks(page):
    assert not narrative(without_generated(page.read_text())), page.name


CODE_MACHINE = re.compile(r"\bAMD EPYC\b|\bXeon\b|\bload \d|\banother machine\b|"
                          r"\bon \d+ cores? here\b", re.I)


def test_no_dates_or_machine_narrative_in_code_comments():
    """(The code may speak of "this machine": the one it runs on.)"""
    found = {str(p.relative_to(ROOT)): [m.group(0) for rx in (DATE, CODE_MACHINE)
                                        for m in rx.finditer(comments_and_docstrings(p))]
             for p in code_files()}
    assert not {k: v for k, v in found.items() if v}


# -- backticked names -------------------------------------------------------------------------
NAME = re.compile(r"`((?:asteria_core|asteria_bench|backend|dashboard|asteria)"
                  r"(?:\.[A-Za-z_]\w*)+)`")


def resolves(dotted: str) -> bool:
    """`dotted` names a module, or an attribute of one, that exists; `asteria.X` is also read as
    the pages' `import asteria_core as asteria`."""
    if dotted.startswith("asteria.") and not _resolves(dotted):
        return _resolves("asteria_core" + dotted[len("asteria"):])
    return _resolves(dotted)


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def named_in_docs() -> list[tuple[str, str]]:
    return [(page.name, m.group(1)) for page in PAGES if page != HISTORY
            for m in NAME.finditer(page.read_text())]


def test_every_backticked_module_or_attribute_in_the_docs_exists():
    gone = [(page, name) for page, name in named_in_docs() if not resolves(name)]
    assert not gone, gone


# -- numbers in the README's prose ------------------------------------------------------------
def constants() -> set[str]:
    """What the README may state without measuring it: read from the code."""
    from asteria_core.compat import tomllib
    from asteria_core.policy import Policy

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    values = {"8000", "8501", "9400", "127.0.0.1", "0600"}  # ports, bind address, token mode
    from backend import launch, settings

    values |= {str(settings.Settings().port), str(launch.DASHBOARD_PORT)}
    values |= {str(v) for section in SERVED_RUN.values() for v in section.values()}
    values |= {str(int(v)) for section in SERVED_RUN.values() for v in section.values()
               if isinstance(v, float) and v.is_integer()}
    values |= set(re.findall(r"\d+(?:\.\d+)*", project["requires-python"]))
    values |= {"3.13"}  # the newest Python claimed: below requires-python's bound
    values |= set(re.findall(r"\d+(?:\.\d+)*", next(d for d in project["dependencies"]
                                                     if d.startswith("torch"))))
    values |= {str(getattr(Policy(), f)) for f in ("staleness_bound", "refresh_interval")}
    return values


def prose(text: str) -> str:
    """The README less its generated blocks, code blocks, inline code, URLs and link targets."""
    text = without_generated(text)
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return re.sub(r"https?://\S+", "", text)


MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s?(?:x|%|ms|s|min|minutes|GiB|GB|MB|KB|"
                      r"KiB|W|steps?))?(?![\w.])")


def numbers_not_from_code(text: str) -> list[str]:
    allowed = constants()
    found = []
    for m in MEASURED.finditer(prose(text)):
        number = re.match(r"[\d,.]+", m.group(0)).group(0).rstrip(".,")
        if len(number) == 1 and number == m.group(0):
            continue  # a bare digit: a list item, "two commands", a count in words
        if number not in allowed:
            found.append(m.group(0))
    return found


def test_the_readme_states_no_measured_number_outside_generated_blocks():
    numbers = numbers_not_from_code((ROOT / "README.md").read_text())
    assert not numbers, f"numbers in README prose neither generated nor read from the code: " \
                        f"{numbers}"


def test_the_readme_is_a_product_page():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for heading in ("## Install", "## Quick start", "## Your first hour",
                    "## Use it in your own loop", "## Concepts", "## Configuration",
                    "## Operate it", "## Performance", "## Links"):
        assert heading in text, heading
    install = text.index("## Install")
    assert text.index("download.pytorch.org/whl/cpu") < text.index("pip install asteria", install)
    assert 'pip install -e ".[app]" && .venv/bin/asteria start' in text
    assert "has not run\non a GPU" in text or "has not run on a GPU" in text


# -- each check bites --------------------------------------------------------------------------
# The planted words of a process are put together when the test runs, so that this file, which
# the project's own checks read too, states none of them.
SESSION, ISSUE = "sess" + "ion", "iss" + "ue"


@pytest.mark.parametrize(("check", "planted"), [
    (process_words, f"As measured in {SESSION} 21, the bound holds."),
    (process_words, f"The autopilot meets {ISSUE} 28's goal."),
    (narrative, "On 2026-12-01 the suite took 544 s."),
    (narrative, "Measured at commit 40c61e0."),
    (narrative, "On this machine it took longer."),
    (numbers_not_from_code, "The default run takes 0.33 s a step."),
    (numbers_not_from_code, "It is 1.02x native's."),
])
def test_a_planted_violation_is_caught(check, planted):
    assert check(planted)


def test_a_name_that_no_longer_exists_is_caught():
    assert resolves("asteria_core.extras.require")
    assert not resolves("asteria_core.optim.LegacySOAP")
    assert not resolves("asteria_bench.profile_soap")
