"""The integrations are optional: importing asteria_core loads no framework, an integration
without its framework says which extra to install, and they use only the public API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import asteria_core

FRAMEWORKS = ("transformers", "accelerate", "lightning", "pytorch_lightning")


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_importing_asteria_core_loads_no_framework():
    proc = run("import sys, asteria_core, asteria_core.integrations\n"
               "print(' '.join(sorted(sys.modules)))")
    assert proc.returncode == 0, proc.stderr
    loaded = {name.split(".")[0] for name in proc.stdout.split()}
    assert not loaded & set(FRAMEWORKS)


@pytest.mark.parametrize(("module", "blocked", "extra"), [
    ("asteria_core.integrations.hf", "transformers", "hf"),
    ("asteria_core.integrations.lightning", "lightning", "lightning"),
])
def test_integration_without_its_framework_names_the_extra(module, blocked, extra):
    # None in sys.modules makes `import <blocked>` fail as if it were not installed
    proc = run(f"import sys; sys.modules[{blocked!r}] = None\n"
               f"try:\n    import {module}\nexcept ImportError as exc:\n    print(exc)\n")
    assert proc.returncode == 0, proc.stderr
    assert f'pip install "asteria[{extra}]"' in proc.stdout


def test_integrations_use_only_the_public_api():
    root = Path(asteria_core.__file__).parent / "integrations"
    for path in root.glob("*.py"):
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and words[1].startswith("asteria_core"):
                assert words[1] in ("asteria_core", "asteria_core.runtime",
                                    "asteria_core.integrations", "asteria_core.extras"), \
                f"{path.name}: {line}"
