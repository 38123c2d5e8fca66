"""What the run store must be before a server uses it, and where its run folders are.

A store that SQLite finds damaged, or one that is empty or gone while the data folder holds run
folders (a store truncated, deleted or replaced), is refused at start with what to do: serving
it would answer 500 on reads, or orphan the runs whose checkpoints are still there.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path, PurePath

RUNS = "runs"
"""The data folder's sub-folder of run folders."""


class StoreDamaged(RuntimeError):
    """The run store cannot be served as it is; the message says what to do."""


def check_store(path: Path, data_dir: Path) -> None:
    """Raise StoreDamaged if the store at `path` fails `PRAGMA quick_check`, or holds no runs
    while `data_dir`'s run folders do."""
    problem = _damage(path)
    if problem is not None:
        raise StoreDamaged(
            f"the run store {path} is damaged ({problem}). Stop every server using it, then "
            f"restore it from a backup, or recover what SQLite can read: "
            f"`sqlite3 {path} .recover | sqlite3 {path}.recovered` and move "
            f"{path.name}.recovered over it (keep the damaged file aside). To start with an "
            "empty store instead, move the data folder's runs/ aside first.")
    folders = _run_folders(data_dir)
    if folders and _runs_stored(path) == 0:
        raise StoreDamaged(
            f"the run store {path} holds no runs (it is missing, empty or new) but "
            f"{data_dir / RUNS} holds {len(folders)} run folder(s), e.g. {folders[0].name}: "
            "the store was lost or replaced. Restore it from a backup, or to start with an "
            f"empty store move {data_dir / RUNS} aside (or use another data folder).")


def _damage(path: Path) -> str | None:
    if not path.exists() or path.stat().st_size == 0:
        return None  # no store yet (or none any more): see the run folders
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
        try:
            rows = [r[0] for r in db.execute("PRAGMA quick_check(5)").fetchall()]
        finally:
            db.close()
    except sqlite3.DatabaseError as err:
        return f"{type(err).__name__}: {err}"
    return None if rows == ["ok"] else "quick_check: " + "; ".join(rows)


def _runs_stored(path: Path) -> int:
    if not path.exists() or path.stat().st_size == 0:
        return 0
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        if not db.execute("SELECT name FROM sqlite_master WHERE name='runs'").fetchone():
            return 0
        return db.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    finally:
        db.close()


def _run_folders(data_dir: Path) -> list[Path]:
    """Run folders with something to lose in them: a checkpoint or step records."""
    runs = data_dir / RUNS
    if not runs.is_dir():
        return []
    return sorted(d for d in runs.iterdir() if d.is_dir() and (
        (d / "checkpoint.pt").exists() or (d / "steps.jsonl").exists()))


def relative_run_dir(run_dir: str, run_id: str, data_dir: Path) -> str:
    """How the store names a run folder: relative to the data folder when the folder is (or,
    for a copied data folder, would be) inside it; else as given. "" stays "" (no folder)."""
    if not run_dir or not PurePath(run_dir).is_absolute():
        return run_dir
    path = Path(run_dir)
    try:
        return str(path.relative_to(data_dir))
    except ValueError:
        pass
    own = data_dir / RUNS / path.name  # a copy's rows still name the original's folder
    if path.name == run_id and own.is_dir():
        return str(own.relative_to(data_dir))
    return run_dir


def resolve_run_dir(run_dir: str, data_dir: Path) -> str | None:
    """The run folder's absolute path (None: the run has no folder here)."""
    if not run_dir:
        return None
    return str(data_dir / run_dir)  # an absolute run_dir stays itself
