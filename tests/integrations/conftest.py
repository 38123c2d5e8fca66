"""Helpers for the framework integrations: the examples, loaded from examples/, and the rule
that a missing framework is a failure under CI and a loud skip elsewhere."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

# Nothing may come from the hub: the examples build their models from configs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def require(module: str, extra: str) -> ModuleType:
    """Import `module`; without it, fail under CI=true (the dev extra installs it), else skip
    the whole test module with a reason that says what is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        error = exc
    message = f"{module} is not installed ({error}); install it: pip install -e \".[{extra}]\""
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI=true and {message}", pytrace=False)
    pytest.skip(f"NOT TESTED: {message}", allow_module_level=True)


def load_example(name: str) -> ModuleType:
    """examples/<name>.py as a module (examples/ is no package)."""
    module_name = f"asteria_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
