"""A component a test needs that this machine lacks (a browser, Prometheus, root, an extra):
skipped loudly here, with what is missing and how to get it; under CI=true, where every
component must be present, a failure instead, never a silent skip."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(what: str) -> NoReturn:
    """`what` is missing: fail under CI=true, else skip the test (or the module, when called
    at import) saying it was not tested."""
    if in_ci():
        pytest.fail(f"CI=true and {what}", pytrace=False)
    pytest.skip(f"SKIPPED, NOT TESTED: {what}", allow_module_level=True)
