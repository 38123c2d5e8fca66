"""Helpers for the framework integrations: the examples, loaded from examples/, and the rule
that a missing framework is a failure under CI and a loud skip elsewhere."""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path
from types import ModuleType

from asteria_core.telemetry.reporter import IDLE_CAUSES
from tests.components import missing

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
    missing(message)


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


def check_records(records: list, runtime, change, *, bound: int, steps: int = 12) -> None:
    """What both frameworks' runs must show: one record per optimizer step with finite losses,
    idle figures by every cause, staleness within the bound and above zero at least once (bases
    refreshed off the critical path), estimated energy, eval losses at steps 6 and 12, and the
    policy change proposed after step 4 in force from step 6, as it said."""
    assert [r.step for r in records] == list(range(1, steps + 1))  # one per optimizer step
    for r in records:
        assert math.isfinite(r.loss) and r.tokens == 4 * 64
        assert set(r.timing.idle_seconds) == set(IDLE_CAUSES)
        assert all(s >= 0 for s in r.timing.idle_seconds.values())
        assert 0 <= r.refresh.staleness_max <= r.refresh.staleness_bound <= bound + 1
        assert r.refresh.failures == 0 and r.refresh.inline_fallbacks == 0
        assert r.energy is not None and r.energy.joules["model"] >= 0
    assert max(r.refresh.staleness_max for r in records) > 0
    assert [r.step for r in records if r.eval_loss is not None] == [6, 12]
    assert all(math.isfinite(r.eval_loss) for r in records if r.eval_loss is not None)
    assert change.effective_step == 6
    assert [h.effective_step for h in runtime.policy.history()] == [6]
    assert [r.policy_version for r in records] == \
        [1] * (change.effective_step - 1) + [change.version] * (steps + 1 - change.effective_step)
