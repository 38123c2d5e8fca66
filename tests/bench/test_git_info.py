"""A suite's `git` block: the commit, and whether the code on top of it had changes. The pages
`--publish` writes (docs/, README.md) are not code: a run of several suites writes the first
one's results before the second starts, and the second must still read as a clean tree."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from asteria_bench.results import git_info
from tests.components import missing


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if shutil.which("git") is None:
        missing("git is not installed (apt-get install git)")
    for path in ("asteria_core/code.py", "docs/benchmarks/runtime.json", "README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("1\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-qm", "first")
    return tmp_path


def test_a_clean_tree_names_its_commit(repo):
    assert git_info(repo) == {"commit": git(repo, "rev-parse", "HEAD"), "dirty": False}


def test_published_results_and_pages_leave_the_tree_clean(repo):
    (repo / "docs/benchmarks/runtime.json").write_text("2\n")
    (repo / "README.md").write_text("2\n")
    assert git_info(repo)["dirty"] is False


def test_a_change_to_code_makes_it_dirty(repo):
    (repo / "asteria_core/code.py").write_text("2\n")
    assert git_info(repo)["dirty"] is True
