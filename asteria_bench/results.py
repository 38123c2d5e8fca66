"""One output format for every suite: a JSON file per suite, written as the suite goes.

A suite's file holds what it measured and how:
    suite, title, description, schema, command, quick, complete (ran to its end), started,
    seconds,
    machine (cpu, cores, memory, python, torch and its threads, device), git (commit, dirty),
    config (what was run: model, steps, corpus, ...),
    runs (one dict per configuration, raw step times included), plots [{file, caption}].
A suite measures; its words (tables, the headline figures the README quotes, findings) are
rendered from these figures by its module in asteria_bench/reports when the report is written
(`Words`: tables [{title, columns, rows, note}], headline {key: {value, text}}, findings
[sentence]). A file saved before its suite left the words to the report holds them itself.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SCHEMA = 1


def machine_info() -> dict[str, Any]:
    """The machine a suite ran on, as the report states it."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        memory_gib = round(pages / 2**30, 1)
    except (ValueError, OSError):
        memory_gib = None
    info = {
        "cpu": cpu, "cores": len(os.sched_getaffinity(0)), "memory_gib": memory_gib,
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "device": "cpu",
    }
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


DOCUMENTS = ("docs", "README.md")
"""What `--publish` writes: changes there are results and prose, not code that is measured (a
run of several suites makes them dirty after its first suite)."""


def git_info(root: Path | None = None) -> dict[str, Any]:
    """The commit the numbers come from, and whether the tree had changes to its code on top of
    it (the documents aside)."""
    cwd = root or Path(__file__).resolve().parents[1]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                                 timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                 *(f":(exclude){path}" for path in DOCUMENTS))
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.title!r}: {len(cells)} cells for "
                             f"{len(self.columns)} columns")
        self.rows.append(list(cells))


class Wording:
    """Tables, headline figures and findings, as a report words a suite's figures."""

    tables: list[Table]
    headline: dict[str, dict[str, Any]]
    findings: list[str]

    def table(self, title: str, columns: list[str], note: str = "") -> Table:
        t = Table(title, columns, note=note)
        self.tables.append(t)
        return t

    def quote(self, key: str, value: Any, text: str) -> None:
        """A headline figure: `text` formats `value` (e.g. "SOAP needs {value:.2f}x ...")."""
        text.format(value=value)  # fails here, not in the README, if the format is wrong
        self.headline[key] = {"value": value, "text": text}

    def worded(self) -> dict[str, Any]:
        return {"tables": [vars(t) for t in self.tables], "headline": self.headline,
                "findings": self.findings}


@dataclass
class Words(Wording):
    """A suite's words, rendered from its file's figures (asteria_bench/reports)."""

    tables: list[Table] = field(default_factory=list)
    headline: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)


@dataclass
class SuiteResult(Wording):
    """What one suite measured; `save` writes it (call it as the suite goes, so a run cut short
    keeps what it had)."""

    suite: str
    title: str
    quick: bool
    command: str
    config: dict[str, Any] = field(default_factory=dict)
    description: str = ""  # what the suite runs and how (its module's docstring by default)
    runs: list[dict[str, Any]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    plots: list[dict[str, str]] = field(default_factory=list)
    headline: dict[str, dict[str, Any]] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    started: str = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc)
                         .isoformat(timespec="seconds"))
    git: dict[str, Any] = field(default_factory=git_info)
    """The commit measured: taken when the suite starts, since the tree may move on meanwhile."""
    machine: dict[str, Any] = field(default_factory=machine_info)
    """Read when the suite starts: a trainer sets torch's thread count for its own runs."""
    carried: list[dict[str, Any]] = field(default_factory=list)
    """Runs of a cut-short file not yet reached again by a resumed run (`--resume`): saved with
    the runs, so a resume cut short in its turn loses none of them."""
    complete: bool = False
    """Whether the suite ran to its end (`asteria bench` sets it); a file saved on the way, or
    left by a run cut short, says false."""
    _t0: float = field(default_factory=time.perf_counter, repr=False)

    def shift_start(self, seconds: float) -> None:
        """Count `seconds` already spent (by the run this one continues) in `seconds`."""
        self._t0 -= seconds

    def as_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite, "title": self.title, "description": self.description,
            "schema": SCHEMA,
            "command": self.command, "quick": self.quick, "complete": self.complete,
            "started": self.started,
            "seconds": round(time.perf_counter() - self._t0, 1),
            "machine": self.machine, "git": self.git,
            "config": self.config, "runs": self.runs + self.carried, "plots": self.plots,
            **self.worded(),
        }

    def save(self, out_dir: Path) -> Path:
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / f"{self.suite}.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.as_dict(), indent=1, default=_plain) + "\n")
        tmp.replace(path)
        return path


def _plain(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def load(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Every suite file in `out_dir`, by suite name."""
    found = {}
    for path in sorted(out_dir.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("schema") == SCHEMA and "suite" in data:
            found[data["suite"]] = data
    return found


def percentile(sorted_values: list[float], q: float) -> float:
    """The q-quantile (0..1) of an already sorted list, nearest rank."""
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]
