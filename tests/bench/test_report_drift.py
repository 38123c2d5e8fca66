"""The README's performance section and docs/benchmarks.md say what the suites' JSON says.

Both are rendered by asteria_bench/report.py from docs/benchmarks/*.json; a hand edit of either,
or a JSON file rerun without rendering again, fails here (`asteria bench --publish --report-only`
renders them again). The pages also say which suites are stale (read from git when rendered), so
a change to measured code flags them here until they are rendered again.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from asteria_bench import report
from asteria_bench.results import SuiteResult

ROOT = Path(__file__).resolve().parents[2]
OUT = Path("docs/benchmarks")
REPORT = Path("docs/benchmarks.md")


@pytest.fixture(scope="module")
def committed() -> dict:
    found = report.load(ROOT / OUT)
    assert found, f"no suite results in {OUT}: run `asteria bench all`"
    return found


def test_the_readme_section_and_tables_are_rendered_from_the_json(committed):
    readme = (ROOT / "README.md").read_text()
    assert report.current_section(readme) is not None, \
        f"README.md has no section between {report.BEGIN!r} and its end marker"
    expected = report.render_readme(readme, committed, OUT, REPORT)
    assert readme == expected, "README's performance section or a quoted table differs from " \
                               "the JSON: run `asteria bench --publish --report-only`"


def test_the_report_is_rendered_from_the_json(committed):
    expected = report.render_report(committed, ROOT / OUT, ROOT / REPORT)
    assert (ROOT / REPORT).read_text() == expected, \
        f"{REPORT} differs from the JSON: run `asteria bench --publish --report-only`"


def test_the_generator_holds_no_figure_of_its_own(tmp_path):
    """Every digit of the README's section comes from a named JSON field: rendered from a suite
    whose fields hold no digit, the section has none either (no figure, date or count the
    generator writes itself)."""
    suite = SuiteResult("staleness", "Staleness", quick=True, command="asteria bench staleness")
    suite.quote("best", "S=x", "fastest {value}")
    suite.runs.append({"label": "native"})
    suite.save(tmp_path)
    found = report.load(tmp_path)
    for data in found.values():
        data["machine"] = {"device": "cpu", "cpu": "some cpu", "cores": "n", "torch": "t"}
        data["git"] = {"commit": "abc", "dirty": False}
    section = report.render_readme_section(found, Path("out"), Path("report.md"))
    assert not re.findall(r"\d", section), section


def test_the_suites_state_their_machine_commit_and_raw_step_times(committed):
    for name, data in committed.items():
        assert data["machine"]["cores"] >= 1 and data["machine"]["torch"], name
        assert data["git"]["commit"], name
        assert data["runs"], f"{name} has no raw runs"


def test_a_figure_changed_in_the_json_is_caught(tmp_path, committed):
    out = tmp_path / "benchmarks"
    shutil.copytree(ROOT / OUT, out, ignore=shutil.ignore_patterns("*.png"))
    name, data = next((n, d) for n, d in committed.items() if d["headline"])
    key = next(iter(data["headline"]))
    value = data["headline"][key]["value"]
    changed = [v * 3 + 1 if isinstance(v, (int, float)) else v
               for v in value] if isinstance(value, list) else value * 3 + 1
    raw = json.loads((out / f"{name}.json").read_text())
    if raw["headline"]:  # saved with its words: the figure is the saved one
        raw["headline"][key]["value"] = changed
    else:  # worded by the report: change the figures it is worded from
        raw["runs"] = _scaled(raw["runs"])
    (out / f"{name}.json").write_text(json.dumps(raw))
    section = report.render_readme_section(report.load(out), OUT, REPORT)
    assert section != report.current_section((ROOT / "README.md").read_text())


def _scaled(value):
    """Every float in `value` times 3 plus 1 (labels, counts and keys as they were)."""
    if isinstance(value, float):
        return value * 3 + 1
    if isinstance(value, list):
        return [_scaled(v) for v in value]
    if isinstance(value, dict):
        return {k: _scaled(v) for k, v in value.items()}
    return value


def test_a_file_of_figures_is_worded_by_its_suites_module(tmp_path):
    """A suite saves its figures; the report words them (tables, headline, findings) with the
    suite's module in asteria_bench/reports, so the same figures read the same way whenever
    the report is rendered."""
    suite = SuiteResult("staleness", "Staleness", quick=True, command="asteria bench staleness",
                        config={"steps": 30})
    for label, train_s, wait, staleness in (("native SOAP (S = 0)", 10.0, 0.0, 0),
                                            ("Asteria-SOAP S=1", 12.0, 3.0, 2),
                                            ("Asteria-SOAP S=5", 8.0, 0.0, 5)):
        suite.runs.append({"label": label, "params": 2e6, "final_val_loss": 2.0 + wait / 100,
                           "train_s": train_s, "idle_s": {"refresh_wait": wait}, "spike": 1.5,
                           "p99_ms": 90.0, "staleness_max": staleness})
    suite.save(tmp_path)
    assert json.loads((tmp_path / "staleness.json").read_text())["findings"] == []
    data = report.load(tmp_path)["staleness"]
    (table,) = data["tables"]
    assert [row[0] for row in table["rows"]] == [r["label"] for r in suite.runs]
    assert [row[3] for row in table["rows"]] == ["1.00", "1.20", "0.80"]
    assert data["headline"]["staleness_best_wallclock"]["value"] == ["S=5", 0.8, 0.0]
    assert data["findings"] == [
        "Asteria-SOAP S=1: staleness reached 2, over its bound.",
        "Bounds where the step waited for the refresh more than 5% of the run: S=1 (3.0 s): "
        "the bound is shorter than a round takes on the worker, so training waits at it."]
    assert "the fastest bound (S=5) trains in 0.80x native SOAP's wall-clock" in \
        report.render_readme_section(report.load(tmp_path), Path("out"), Path("report.md"))


def test_write_renders_tables_plots_findings_and_the_readme_section(tmp_path):
    out = tmp_path / "benchmarks"
    suite = SuiteResult("critical-path", "Critical path", quick=True, command="asteria bench x")
    table = suite.table("Step time", ["configuration", "p50 ms"], note="a note")
    table.add("AdamW", "12")
    suite.plots.append({"file": "steps.png", "caption": "step time per step"})
    suite.quote("spike", [1.2, 2.8], "spikes {value[0]:.2f}x against {value[1]:.2f}x")
    suite.findings.append("Asteria is smoother.")
    suite.runs.append({"label": "AdamW", "step_ms": [12.0]})
    suite.save(out)
    readme = tmp_path / "README.md"
    block = "<!-- asteria bench: table critical-path 0 -->\nold table\n" \
            "<!-- asteria bench: end table -->"
    readme.write_text(f"# x\n\nbefore\n\n{report.BEGIN}\nold\n{report.END}\n\n{block}\nafter\n")
    written = report.write(out, tmp_path / "docs" / "benchmarks.md", readme)
    assert written == [tmp_path / "docs" / "benchmarks.md", readme]
    text = readme.read_text()
    assert text.startswith("# x\n\nbefore\n\n") and text.endswith("end table -->\nafter\n")
    assert "old" not in text and "spikes 1.20x against 2.80x" in text
    assert "<!-- asteria bench: table critical-path 0 -->\n**Step time**" in text
    assert "| AdamW | 12 |" in text and "Measured by `asteria bench x`" in text
    page = (tmp_path / "docs" / "benchmarks.md").read_text()
    for expected in ("| AdamW | 12 |", "a note", "![step time per step](../benchmarks/steps.png)",
                     "- Asteria is smoother.", "[critical-path.json](../benchmarks/"
                     "critical-path.json)"):
        assert expected in page


def test_a_headline_whose_format_does_not_fit_its_value_fails_when_quoted():
    suite = SuiteResult("x", "x", quick=True, command="x")
    with pytest.raises((ValueError, IndexError, TypeError)):
        suite.quote("k", "text", "{value:.2f}")
