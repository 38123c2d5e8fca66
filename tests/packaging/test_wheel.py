"""`pip install asteria` gives the runtime and nothing else: the wheel and the sdist built by the
standard frontend (`python -m build`), installed without extras into a clean venv (no system
site-packages), train a 20-step loop with its records and its own /metrics; the web stack, the
dashboard and the plots are absent, and the commands that need them say which extra to install.
One build and one install for the module (about a minute of pip here): marked slow, run in CI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.components import missing

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
ABSENT = ("fastapi", "uvicorn", "streamlit", "matplotlib", "pandas", "pydantic")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("ASTERIA_", "PYTHON", "VIRTUAL_ENV"))}


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    try:
        import build  # noqa: F401
    except ImportError:
        missing('the build frontend is not installed (pip install -e ".[dev]")')
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600, env=clean_env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def venv(dist, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(home / "v")], check=True, timeout=300)
    wheel = next(dist.glob("asteria-*.whl"))
    done = subprocess.run([str(home / "v/bin/pip"), "install", "-q", str(wheel)], cwd=home,
                          capture_output=True, text=True, timeout=900, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return home / "v"


def run(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=venv.parent,
                          capture_output=True, text=True, timeout=600, env=clean_env())


def test_the_wheel_holds_the_product_only(dist):
    names = zipfile.ZipFile(next(dist.glob("*.whl"))).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("asteria-")}
    assert tops == {"asteria", "asteria_core", "backend", "dashboard"}, tops
    assert "dashboard/.streamlit/config.toml" in names


def test_the_sdist_holds_the_sources_without_tests_or_local_files(dist):
    with tarfile.open(next(dist.glob("*.tar.gz"))) as sdist:
        names = [n.split("/", 1)[1] for n in sdist.getnames() if "/" in n]
    assert "dashboard/.streamlit/config.toml" in names and "README.md" in names
    for name in names:
        assert not name.startswith(("tests", ".venv", "asteria_bench", "benchmarks", "docs")), name
        assert "__pycache__" not in name, name


def test_the_runtime_trains_records_and_serves_metrics_without_extras(venv):
    done = run(venv, "python", str(Path(__file__).with_name("runtime_loop.py")))
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["records"] == 20 and seen["steps"] == 20
    assert seen["metrics"] and seen["metrics"][0].startswith("asteria_train_loss ")


def test_no_web_stack_dashboard_or_plots_is_installed(venv):
    packages = json.loads(run(venv, "pip", "list", "--format", "json").stdout)
    listed = {p["name"].lower().replace("_", "-") for p in packages}
    assert "torch" in listed and "prometheus-client" in listed
    assert not listed & set(ABSENT), listed & set(ABSENT)


@pytest.mark.parametrize(("command", "line"), [
    (("start",), 'asteria start needs the app extra (fastapi'),
    (("serve",), 'asteria serve needs the server extra (fastapi'),
    (("train", "--control-port", "0"), 'asteria train needs the server extra'),
    (("bench", "all", "--quick"), "asteria bench runs from Asteria's source checkout"),
])
def test_a_command_whose_extra_is_missing_says_which_in_one_line(venv, command, line):
    done = run(venv, "asteria", *command)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and line in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    hint = {"start": "app", "serve": "server", "train": "server"}.get(command[0])
    assert hint is None or f'pip install "asteria[{hint}]"' in done.stderr


def test_the_control_plane_import_point_names_its_extra(venv):
    done = run(venv, "python", "-c", "import backend\ntry:\n    backend.serve\n"
                                     "except ImportError as e:\n    print(e)")
    assert 'backend.serve needs the server extra' in done.stdout
    assert 'pip install "asteria[server]"' in done.stdout
