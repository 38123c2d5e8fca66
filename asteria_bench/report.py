"""docs/benchmarks.md and the README's performance section, rendered from the suites' JSON only.

Nothing here measures: every number comes out of a suite's file, worded by its module in
asteria_bench/reports (its tables, its headline figures, its findings), so the README and the
report say what the JSON says, and the drift test (tests/bench/test_report_drift.py) fails where
they do not.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

from asteria_bench import reports, results
from asteria_bench import suites as suite_modules
from asteria_bench.suites import SUITES, measured_pathspecs, suite_of

CHECKOUT = Path(__file__).resolve().parents[1]

BEGIN = "<!-- asteria bench: begin (generated from docs/benchmarks/*.json; do not edit) -->"
END = "<!-- asteria bench: end -->"
# A suite's table quoted elsewhere in the README (e.g. the distributed section's): the block
# between these names the suite and the table's index, and is rendered like the section.
TABLE_BLOCK = re.compile(r"(<!-- asteria bench: table (?P<suite>[\w-]+) (?P<index>\d+) -->\n)"
                         r"(?P<body>.*?)(\n<!-- asteria bench: end table -->)", re.S)


def load(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Every suite's file in `out_dir`, by suite name, worded."""
    return {name: reports.worded(data) for name, data in results.load(out_dir).items()}


def _ordered(found: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    known = [found[name] for name in SUITES if name in found]
    return known + [found[name] for name in sorted(found) if name not in SUITES]


def _cell(value: Any) -> str:
    """A table cell; a figure a row does not have (None) shows as "-"."""
    return "-" if value is None else str(value).replace("|", "\\|").replace("\n", " ")


def _table(table: dict[str, Any]) -> list[str]:
    lines = [f"**{table['title']}**", "",
             "| " + " | ".join(map(_cell, table["columns"])) + " |",
             "|" + "---|" * len(table["columns"])]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in table["rows"]]
    if table.get("note"):
        lines += ["", table["note"]]
    return lines + [""]


def headline_sentence(figure: dict[str, Any]) -> str:
    return figure["text"].format(value=figure["value"])


def _run_line(data: dict[str, Any]) -> str:
    m, git = data["machine"], data["git"]
    commit = (git.get("commit") or "unknown")[:10] + (" + changes" if git.get("dirty") else "")
    threads = f"{m['torch_threads']} torch threads"
    return (f"`{data['command']}` ({'quick' if data['quick'] else 'full'} sizes), "
            f"{data['started'][:10]}, {data['seconds']:.0f} s; {m['device']} on {m['cpu']} "
            f"({m['cores']} cores, {m['memory_gib']} GiB), {threads}, torch {m['torch']}, "
            f"Python {m['python']}; commit {commit}")


def freshness(data: dict[str, Any], root: Path = CHECKOUT) -> str:
    """Whether a suite's figures are today's: "fresh" (a clean tree, no change since to the code
    it measures, and run to its end), or "stale: ..." or "partial: ..." saying why; read from git
    at render time."""
    git = data.get("git") or {}
    commit = git.get("commit")
    if not commit:
        return "stale: the commit it ran at is unknown"
    if git.get("dirty") is not False:
        return "stale: measured on a tree with uncommitted changes"
    try:
        done = subprocess.run(["git", "log", "--format=%H", f"{commit}..HEAD", "--",
                               *measured_pathspecs(data["suite"])], cwd=root,
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "stale: no git history to compare with"
    if done.returncode != 0:
        return "stale: the commit it ran at is not in this history"
    if done.stdout.strip():
        return "stale: the code it measures changed since"
    if not data.get("complete", True):  # files from before the flag was written are complete
        suite = suite_of(data["suite"])
        if not getattr(suite_modules.load(suite), "RESUMABLE", False):
            return f"partial: cut short before its end; `asteria bench {suite}` runs it again"
        rung = (data.get("config") or {}).get("rung", "default")
        command = f"asteria bench {suite}" + (f" --rung {rung}" if rung != "default" else "")
        return (f"partial: cut short before its end; `{command} --resume`, with the options it "
                "ran with, continues it")
    return "fresh"


def _state_cells(data: dict[str, Any], fresh: str) -> str:
    commit = (data["git"].get("commit") or "unknown")[:10]
    clean = {False: "yes", True: "no"}.get(data["git"].get("dirty"), "unknown")
    flag = fresh if fresh == "fresh" else f"**{fresh}**"
    return f"`{commit}` | {clean} | {flag}"


def render_report(found: dict[str, dict[str, Any]], out_dir: Path, report_path: Path) -> str:
    """The whole of docs/benchmarks.md."""
    rel = Path(os.path.relpath(out_dir, report_path.parent))
    lines = ["# Benchmarks", "",
             "Every figure Asteria publishes, as `asteria bench` measured it. This file and the "
             "README's performance section are rendered from the JSON files beside the plots "
             f"(`{rel.as_posix()}/<suite>.json`: machine, versions, threads, commit and every "
             "raw step time); `asteria bench --report-only` renders them again (with "
             "`--publish`, the project's published pages, which a test holds to their JSON).",
             ""]
    suites = _ordered(found)
    state = {d["suite"]: freshness(d) for d in suites}
    lines += ["A suite is fresh when it ran on a clean tree (`git.dirty` false) and the code it "
              "measures (asteria_core, its own module and the bench's shared drivers, and for "
              "the suites that serve a run the control plane, not `asteria start`'s launcher) "
              "has not changed since its commit; a stale suite's figures are flagged "
              "until `asteria bench SUITE --publish` runs it again, and a partial one's (a run "
              "cut short) until it runs again or, where the suite can, `--resume` completes "
              "it.", "",
              "| suite | what | run | commit | clean tree | state |", "|---|---|---|---|---|---|"]
    lines += [f"| [{d['suite']}](#{_anchor(d['title'])}) | {_cell(d['title'])} | "
              f"{'quick' if d['quick'] else 'full'}, {d['seconds']:.0f} s | "
              f"{_state_cells(d, state[d['suite']])} |" for d in suites]
    lines.append("")
    for d in suites:
        flag = [] if state[d["suite"]] == "fresh" else [f"**{state[d['suite']].capitalize()}.**",
                                                        ""]
        lines += [f"## {d['title']}", "", *flag, f"Run: {_run_line(d)}. Raw data: "
                  f"[{d['suite']}.json]({(rel / (d['suite'] + '.json')).as_posix()}).", ""]
        if d.get("description"):
            lines += [_dedent(d["description"]), ""]
        for table in d["tables"]:
            lines += _table(table)
        for plot in d["plots"]:
            lines += [f"![{plot['caption']}]({(rel / plot['file']).as_posix()})", "",
                      f"*{plot['caption']}*", ""]
        if d["findings"]:
            lines += ["What the numbers say:", ""] + [f"- {f}" for f in d["findings"]] + [""]
        notes = sorted(out_dir.glob(f"{d['suite']}-*.md"))
        if notes:  # a hand-written analysis beside the suite's JSON (a profile, a follow-up)
            lines += ["Further analysis: " + ", ".join(
                f"[{n.name}]({(rel / n.name).as_posix()})" for n in notes) + ".", ""]
    return "\n".join(lines).rstrip() + "\n"


def _dedent(text: str) -> str:
    return "\n".join(line.strip() for line in text.strip().splitlines())


def _anchor(title: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def render_readme_section(found: dict[str, dict[str, Any]], out_dir: Path,
                          report_path: Path) -> str:
    """The README's performance section, markers included: what ran on what, the headline
    figures (each linked to its JSON), links to the report and its plots."""
    suites = _ordered(found)
    lines = [BEGIN, "## Performance", ""]
    if not suites:
        return "\n".join([*lines, "No benchmark has been run yet: `asteria bench all`.", END])
    machines = {(d["machine"]["device"], d["machine"]["cpu"], d["machine"]["cores"],
                 d["machine"]["torch"]) for d in suites}
    on = "; ".join(f"{dev} on {cpu} ({cores} cores), torch {torch}"
                   for dev, cpu, cores, torch in sorted(machines))
    sizes = sorted({"quick" if d["quick"] else "full" for d in suites})
    lines += [f"Measured by `asteria bench` ({' and '.join(sizes)} sizes) on {on}. "
              f"Tables, plots, method and each suite's commit: "
              f"[{report_path.as_posix()}]({report_path.as_posix()}); measure your own machine "
              "with `asteria bench all --quick` from a source checkout "
              "(`pip install -e \".[bench]\"`).", ""]
    for d in suites:
        json_path = (out_dir / f"{d['suite']}.json").as_posix()
        figures = [headline_sentence(f) for f in d["headline"].values()]
        fresh = freshness(d)
        if not figures and fresh == "fresh":
            continue
        sizes = ", quick sizes" if d["quick"] else ""
        flag = "" if fresh == "fresh" else f" (**{fresh}**)"
        said = "; ".join(figures) if figures else "no headline figures until it runs to its end"
        lines.append(f"- **{d['suite']}** ([{d['suite']}.json]({json_path}){sizes}){flag}: " +
                     said + ".")
    plots = [(d, p) for d in suites for p in d["plots"]][:4]
    if plots:
        lines += ["", "Plots: " + ", ".join(f"[{p['caption']}]({(out_dir / p['file']).as_posix()})"
                                            for _, p in plots) + "."]
    return "\n".join([*lines, END])


def render_table_block(found: dict[str, dict[str, Any]], suite: str, index: int,
                       out_dir: Path) -> str:
    data = found.get(suite)
    if data is None or index >= len(data["tables"]):
        return f"(no table {index} in {suite}.json: run `asteria bench {suite}`)"
    json_path = (out_dir / f"{suite}.json").as_posix()
    return "\n".join(_table(data["tables"][index])).rstrip() + \
        f"\n\nMeasured by `{data['command']}` ({data['started'][:10]}; " \
        f"[{suite}.json]({json_path}))."


def render_readme(readme: str, found: dict[str, dict[str, Any]], out_dir: Path,
                  report_path: Path) -> str | None:
    """`readme` with its performance section and every table block rendered from `found`;
    None where it has no performance section."""
    text = replace_section(readme, render_readme_section(found, out_dir, report_path))
    if text is None:
        return None
    return TABLE_BLOCK.sub(lambda m: m.group(1) + render_table_block(
        found, m.group("suite"), int(m.group("index")), out_dir) + m.group(5), text)


def replace_section(readme: str, section: str) -> str | None:
    """`readme` with its marked section replaced; None where it has no markers."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        return None
    return readme[:start] + section + readme[end + len(END):]


def current_section(readme: str) -> str | None:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        return None
    return readme[start:end + len(END)]


def write(out_dir: Path, report_path: Path, readme_path: Path | None) -> list[Path]:
    """Render both from `out_dir`'s JSON; returns the files written."""
    found = load(out_dir)
    written = []
    if found:
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(render_report(found, out_dir, report_path))
        written.append(report_path)
    if readme_path is not None and readme_path.is_file():
        base = readme_path.resolve().parent  # links as the README's reader follows them
        text = render_readme(readme_path.read_text(), found,
                             Path(os.path.relpath(out_dir.resolve(), base)),
                             Path(os.path.relpath(report_path.resolve(), base)))
        if text is not None:
            readme_path.write_text(text)
            written.append(readme_path)
    return written
