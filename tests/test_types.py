"""The runtime and the control plane type-check: mypy, with pyproject.toml's [tool.mypy]
settings (the packages it reads, the Python it checks as, the pydantic plugin), reports nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.components import missing

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(900)  # a cold cache reads torch's stubs: a minute or two on 2 cores
def test_mypy_reports_no_errors():
    if importlib.util.find_spec("mypy") is None:
        missing('mypy is not installed (pip install -e ".[dev]")')
    done = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True,
                          text=True)
    assert done.returncode == 0, f"mypy exited {done.returncode}:\n{done.stdout}{done.stderr}"
