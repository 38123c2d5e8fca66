"""Processes as Linux's /proc shows them: which are alive, and a process's descendants."""

from __future__ import annotations

from pathlib import Path


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # the name, in parentheses, may hold spaces
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    """Running or sleeping; a zombie (exited, not yet reaped) counts as gone."""
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children, ...), alive or zombie."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = stat[1]
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found
