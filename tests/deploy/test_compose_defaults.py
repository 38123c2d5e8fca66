"""docker-compose.yml's trainer trains `asteria start`'s default run unless told otherwise: the
defaults of its ${ASTERIA_...:-default} settings are SERVED_RUN's (backend/commands.py), so the
stack and the README's quick start run the same steps and the same energy estimate."""

from __future__ import annotations

import re

import pytest
import yaml

from backend.commands import SERVED_RUN
from tests.deploy.conftest import COMPOSE_FILE

# The file as written (load_compose interpolates the variables, as Compose would).
COMMAND = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["trainer"]["command"]


def compose_default(key: str) -> str:
    """The default of the ${VAR:-default} value the trainer's command gives --KEY."""
    value = COMMAND[COMMAND.index(f"--{key}") + 1]
    found = re.fullmatch(r"\$\{ASTERIA_\w+:-(.+)\}", value)
    assert found, f"--{key} {value}: expected ${{ASTERIA_...:-default}}"
    return found.group(1)


@pytest.mark.parametrize("key", ["train.steps", "telemetry.model_cpu_watts", "optim.name"])
def test_the_stacks_default_run_is_asteria_starts(key):
    section, name = key.split(".")
    assert type(SERVED_RUN[section][name])(compose_default(key)) == SERVED_RUN[section][name]
