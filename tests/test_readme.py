"""README.md says what the code does. Every Python snippet runs as written: its own imports, its
own model and data, no name left for the reader to guess (a snippet is copied into a file and
run, as a user would; the control plane one serves on the test's own port and data folder,
ASTERIA_PORT and ASTERIA_DATA_DIR, which `backend.serve` reads). The compose settings table
gives the defaults docker-compose.yml has, which are `asteria start`'s default run."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from backend.commands import SERVED_RUN
from tests.backend.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", README, re.S)


def test_the_readme_has_its_three_snippets():
    """Own loop, Hugging Face, Lightning: none of them silently dropped from the test below."""
    assert len(SNIPPETS) == 3
    assert [("backend.serve" in s, "integrations import hf" in s, "lightning" in s)
            for s in SNIPPETS] == [(True, False, False), (False, True, False),
                                   (False, False, True)]


@pytest.mark.parametrize("snippet", SNIPPETS, ids=["own-loop", "hugging-face", "lightning"])
def test_a_readme_snippet_runs_as_written(tmp_path, snippet):
    script = tmp_path / "snippet.py"
    script.write_text(snippet)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASTERIA_")}
    env.update(ASTERIA_PORT=str(free_port()), ASTERIA_DATA_DIR=str(tmp_path / "data"),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "loss_type" not in done.stdout + done.stderr
    if "backend.serve" in snippet:  # it did serve the run, in the test's data folder
        assert (tmp_path / "data" / "asteria.db").is_file()


@pytest.mark.parametrize(("variable", "value"), [
    ("ASTERIA_TRAIN_STEPS", SERVED_RUN["train"]["steps"]),
    ("ASTERIA_MODEL_CPU_WATTS", SERVED_RUN["telemetry"]["model_cpu_watts"]),
    ("ASTERIA_OPTIMIZER", SERVED_RUN["optim"]["name"])])
def test_the_compose_settings_table_gives_the_default_runs_values(variable, value):
    row = re.search(rf"^\| `{variable}` \| ([^|]+) \|", README, re.M)
    assert row, f"no row for {variable}"
    assert type(value)(row.group(1).strip()) == value
