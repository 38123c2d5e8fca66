"""Dependencies point one way (DESIGN.md), checked on the real import graph of each package."""

import subprocess
import sys
from pathlib import Path

import pytest

import asteria_core

FORBIDDEN_LOADED = {
    "asteria_core": ("fastapi", "uvicorn", "streamlit", "backend", "dashboard"),
    "dashboard": ("torch", "asteria_core"),
}
# torch itself loads torch.distributed and threading, so for the optimizer math we check the
# import statements of its own sources instead of the loaded-module set.
OPTIM_FORBIDDEN = ("torch.distributed", "threading", "multiprocessing", "asteria_core.refresh",
                   "asteria_core.tiers", "asteria_core.distributed", "asteria_core.telemetry",
                   "asteria_core.train")

PROBE = """
import importlib, pkgutil, sys
root = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
    importlib.import_module(info.name)
print("\\n".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize("package", sorted(FORBIDDEN_LOADED))
def test_package_does_not_import_forbidden_modules(package):
    proc = subprocess.run([sys.executable, "-c", PROBE, package], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert package in loaded
    for forbidden in FORBIDDEN_LOADED[package]:
        assert forbidden not in loaded, f"{package} imports {forbidden}"


def test_optim_sources_do_not_import_runtime_modules():
    root = Path(asteria_core.__file__).parent / "optim"
    for path in root.rglob("*.py"):
        text = path.read_text()
        for forbidden in OPTIM_FORBIDDEN:
            assert f"import {forbidden}" not in text and f"from {forbidden}" not in text, \
                f"{path.name} imports {forbidden}"
