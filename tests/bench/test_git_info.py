"""A suite's `git` block: the commit, and whether the code on top of it had changes. The pages
`--publish` writes (docs/, README.md) are not code: a run of several suites writes the first
one's results before the second starts, and the second must still read as a clean tree. And the
state the report gives a suite from it: fresh, stale or partial."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from asteria_bench import report
from asteria_bench.report import freshness
from asteria_bench.results import git_info, machine_info
from asteria_bench.suites import measured_paths
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


def suite_file(repo: Path, **fields) -> dict:
    return {"suite": "optimizers", "command": "asteria bench optimizers --publish", "runs": [{}],
            "git": git_info(repo), **fields}


def test_a_suite_is_stale_once_the_code_it_measures_changes(repo):
    data = suite_file(repo)
    assert freshness(data, repo) == "fresh"
    (repo / "README.md").write_text("2\n")
    git(repo, "commit", "-qam", "docs")
    assert freshness(data, repo) == "fresh"  # not code it measures
    (repo / "asteria_core/code.py").write_text("2\n")
    git(repo, "commit", "-qam", "code")
    assert freshness(data, repo) == "stale: the code it measures changed since"


def test_a_served_suite_measures_the_control_plane_but_not_the_launcher(repo):
    """`asteria start`'s launcher (backend/launch.py) is a client no suite runs."""
    for path in ("backend/app.py", "backend/launch.py"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "backend")
    data = {**suite_file(repo), "suite": "serving", "command": "asteria bench serving"}
    (repo / "backend/launch.py").write_text("2\n")
    git(repo, "commit", "-qam", "launcher")
    assert freshness(data, repo) == "fresh"
    (repo / "backend/app.py").write_text("2\n")
    git(repo, "commit", "-qam", "control plane")
    assert freshness(data, repo) == "stale: the code it measures changed since"


def test_a_suite_cut_short_is_partial_and_names_the_command_that_completes_it(repo):
    data = suite_file(repo, complete=False)
    assert freshness(data, repo) == ("partial: cut short before its end; `asteria bench "
                                     "optimizers --resume`, with the options it ran with, "
                                     "continues it")
    large = suite_file(repo, complete=False, suite="optimizers-large",
                       config={"rung": "large"})
    assert "`asteria bench optimizers --rung large --resume`" in freshness(large, repo)
    scale = suite_file(repo, complete=False, suite="scale")  # it can not continue: run again
    assert freshness(scale, repo) == ("partial: cut short before its end; `asteria bench "
                                      "scale` runs it again")
    assert freshness(suite_file(repo, complete=True), repo) == "fresh"


def test_the_readme_lists_a_partial_suite_with_its_flag(repo, tmp_path):
    partial = {**suite_file(repo, complete=False), "title": "Optimizers", "quick": False,
               "headline": {}, "plots": [], "machine": machine_info()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(report, "CHECKOUT", repo)  # the commit's history is this repository's
        patch.setattr(report.freshness, "__defaults__", (repo,))
        section = report.render_readme_section({"optimizers": partial}, tmp_path,
                                               Path("docs/benchmarks.md"))
    line = next(x for x in section.splitlines() if x.startswith("- **optimizers**"))
    assert "(**partial: cut short before its end" in line
    assert line.endswith("no headline figures until it runs to its end.")


def test_a_rung_measures_its_suites_code():
    assert measured_paths("optimizers-large") == measured_paths("optimizers")
    assert "asteria_bench/suites/optimizers.py" in measured_paths("optimizers-large")
    assert "asteria_bench/suites/scale_memory.py" in measured_paths("scale-memory")
