"""The code parses and imports on the lowest Python pyproject.toml claims: vermin reads every
module's syntax and its uses of the standard library (a 3.11-only `enum.StrEnum`, `tomllib`,
`except*`, ...) and reports each one the lowest version lacks. The guarded imports in
asteria_core/compat.py and dashboard/client.py carry `# novermin`: they run on 3.11 only."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from asteria_core.compat import tomllib
from tests.components import missing

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("asteria", "asteria_core", "asteria_bench", "backend", "dashboard", "examples",
           "tests")


def lowest_claimed() -> str:
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    return re.search(r">=\s*(3\.\d+)", spec).group(1)


def vermin(*paths: Path) -> subprocess.CompletedProcess:
    command = Path(sys.executable).with_name("vermin")  # the console script of this venv
    if not command.is_file():
        missing('vermin is not installed (pip install -e ".[dev]")')
    return subprocess.run([str(command), f"-t={lowest_claimed()}-",
                           "--violations", "--no-tips", "--eval-annotations", "-q",
                           *map(str, paths)], capture_output=True, text=True, timeout=600)


def test_the_lowest_claimed_python_is_310():
    assert lowest_claimed() == "3.10"


def test_every_module_works_on_the_lowest_claimed_python():
    done = vermin(*(ROOT / p for p in CHECKED))
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


@pytest.mark.parametrize("line", ["from enum import StrEnum", "import tomllib",
                                  "try:\n    pass\nexcept* ValueError:\n    pass"])
def test_a_311_only_use_is_caught(tmp_path, line):
    (tmp_path / "planted.py").write_text(line + "\n")
    done = vermin(tmp_path)
    assert done.returncode != 0 and "planted.py" in done.stdout, done.stdout + done.stderr
