"""The optional parts of an install and the modules each needs: `pip install asteria` is the
runtime only, and a command or an import point that needs more says which extra to install, in
one line (pyproject.toml's [project.optional-dependencies] names the same extras)."""

from __future__ import annotations

import importlib.util

SERVER = ("fastapi", "uvicorn", "httpx", "pydantic", "pydantic_settings", "swagger_ui_bundle")
DASHBOARD = ("streamlit", "httpx")
EXTRAS: dict[str, tuple[str, ...]] = {
    "server": SERVER,
    "dashboard": DASHBOARD,
    "app": tuple(dict.fromkeys(SERVER + DASHBOARD)),
    "bench": ("matplotlib",),
    "hf": ("transformers", "accelerate"),
    "lightning": ("lightning",),
}


class MissingExtra(ImportError):
    """An optional part is not installed; the message is the one line that says what to do."""


def missing(extra: str) -> list[str]:
    """The modules of `extra` this environment cannot import (checked without importing them)."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def install_hint(extra: str) -> str:
    return f'pip install "asteria[{extra}]"'


def message(what: str, extra: str, absent: list[str]) -> str:
    return (f"{what} needs the {extra} extra ({', '.join(absent)} not installed): "
            f"{install_hint(extra)}")


def require(extra: str, what: str) -> None:
    """Raise MissingExtra, naming `extra`, when any of its modules is absent."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(message(what, extra, absent))


def extra_of(module: str) -> str | None:
    """The narrowest extra that provides `module` (a top-level name), if any."""
    top = module.split(".")[0]
    for extra in ("server", "dashboard", "bench", "hf", "lightning"):
        if top in EXTRAS[extra]:
            return extra
    return None
