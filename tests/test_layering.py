"""Dependencies point one way, checked on the import graph read from the source.

Every .py file under asteria/, asteria_core/, asteria_bench/, backend/ and dashboard/ is parsed
and every import in it is an edge, wherever it is written: at module level, inside a function,
under `if TYPE_CHECKING:`, relative (resolved), or `importlib.import_module("a.literal")`.
The rules:

- asteria_core never imports the control plane or the dashboard, nor their web stack.
- dashboard never imports torch or asteria_core: it talks HTTP.
- asteria_bench (`asteria bench`, which the command table in asteria/cli.py loads) never imports
  the control plane, the dashboard or the web stack: it measures a served run over HTTP, as a
  client.
- no product package (asteria_core, backend, dashboard) imports the benchmarks or the command
  table (the `asteria` package, which sits above them all and dispatches to each).
- inside asteria_core each subpackage (or top module) has a rank in `RANKS`; a module imports its
  own subpackage and lower ranks only (so two of one rank never import each other). The package
  root (asteria_core/__init__.py, the public API) re-exports runtime and what is below it, and
  nothing inside asteria_core below the adapters of rank 5 (integrations, cli) imports the root
  back (`import asteria_core`, `from asteria_core import X` where X is not a submodule).
- the optimizer math (asteria_core.optim) imports no threading, multiprocessing or
  torch.distributed.
- no import cycle between the top-level packages, none between asteria_core's subpackages, and
  none between modules inside any package.

A failure lists each offending edge as `path:line importer -> imported`. A cheap runtime probe
checks the same direction on what importing each package really loads.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("asteria", "asteria_core", "asteria_bench", "backend", "dashboard")
PRODUCT = ("asteria_core", "backend", "dashboard")
CORE = "asteria_core"

CORE_FORBIDDEN = ("backend", "dashboard", "asteria_bench", "fastapi", "uvicorn", "starlette",
                  "streamlit", "pydantic", "pydantic_settings")
DASHBOARD_FORBIDDEN = ("torch", "asteria_core")
BENCH_FORBIDDEN = ("backend", "dashboard", "fastapi", "uvicorn", "starlette", "streamlit")
OPTIM_FORBIDDEN = ("threading", "multiprocessing", "torch.distributed")

# asteria_core's layers, lowest first. Two units of one rank may not import each other.
RANKS = {
    "asteria_core.machine": -1,  # the machine's cores and memory: the bounds everything obeys
    "asteria_core.compat": -2,  # what Python 3.10 lacks (StrEnum, tomllib), from the backports
    "asteria_core.torchrun": -2,  # torchrun's environment, read once (no torch)
    "asteria_core.extras": -2,  # the optional parts of an install and the modules each needs
    "asteria_core.fields": -1,  # each setting described once: kind, bounds, help (no imports)
    "asteria_core.policy": 0,
    "asteria_core.optim": 0,
    "asteria_core.validation": 0,  # config checks shared by train's and telemetry's configs
    "asteria_core.telemetry": 1,
    "asteria_core.refresh": 2,
    "asteria_core.tiers": 2,
    "asteria_core.distributed": 2,
    "asteria_core.autopilot": 2,  # reads records, proposes policy changes
    "asteria_core.runtime": 3,
    "asteria_core.train": 4,
    "asteria_core.cli": 5,
    "asteria_core.integrations": 5,
}
# The package root re-exports the public API: runtime and what is below it. The adapters of rank
# 5 (integrations, cli) use that public API like any user's script; no lower rank imports it.
ROOT_MAX_RANK = RANKS["asteria_core.runtime"]
ROOT_USERS_MIN_RANK = 5


@dataclass(frozen=True, order=True)
class Import:
    path: str      # the importing file, relative to the scanned tree
    line: int
    importer: str  # the importing module
    imported: str  # the imported module, absolute
    where: str     # "module", "function" or "TYPE_CHECKING"

    def __str__(self) -> str:
        where = "" if self.where == "module" else f" ({self.where})"
        return f"{self.path}:{self.line} {self.importer} -> {self.imported}{where}"


def top(module: str) -> str:
    return module.split(".", 1)[0]


def within(module: str, prefixes: Iterable[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """{module name: (file, is a package)} of every .py file under the packages in `root`."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str], path: str) -> None:
        self.module, self.known, self.path = module, known, path
        self.package = module if is_package else module.rpartition(".")[0]
        self.scopes: list[str] = []
        self.found: list[Import] = []

    def _add(self, node: ast.AST, imported: str) -> None:
        where = "TYPE_CHECKING" if "TYPE_CHECKING" in self.scopes else \
            "function" if self.scopes else "module"
        self.found.append(Import(self.path, node.lineno, self.module, imported, where))

    def _absolute(self, name: str | None, level: int, package: str | None = None) -> str:
        if not level:
            return name or ""
        parts = (package or self.package).split(".")
        if level - 1 >= len(parts):
            raise ValueError(f"{self.path}: relative import beyond the top-level package")
        base = ".".join(parts[:len(parts) - (level - 1)])
        return f"{base}.{name}" if name else base

    def _scoped(self, scope: str, nodes: Iterable[ast.AST]) -> None:
        self.scopes.append(scope)
        for node in nodes:
            self.visit(node)
        self.scopes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for deco in node.decorator_list:
            self.visit(deco)
        self._scoped("function", node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._scoped("function", [node.body])

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self._scoped("TYPE_CHECKING", node.body)
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._absolute(node.module, node.level)
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            if alias.name == "*":
                self._add(node, base)
            elif top(base) not in PACKAGES:
                # Outside the scanned tree a name may be a module (`from torch import
                # distributed`): count it as one, which only ever adds a dotted tail.
                self._add(node, candidate)
            else:
                self._add(node, candidate if candidate in self.known else base)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else \
            func.id if isinstance(func, ast.Name) else None
        if name in ("import_module", "__import__") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            target = node.args[0].value
            if target.startswith("."):
                package = next((kw.value for kw in node.keywords if kw.arg == "package"),
                               node.args[1] if len(node.args) > 1 else None)
                if isinstance(package, ast.Constant) and isinstance(package.value, str):
                    level = len(target) - len(target.lstrip("."))
                    self._add(node, self._absolute(target[level:] or None, level,
                                                   package.value))
            else:
                self._add(node, target)
        self.generic_visit(node)


def collect_imports(root: Path) -> list[Import]:
    """Every import of every module of the packages under `root`, sorted."""
    modules = _modules(root)
    known = set(modules)
    found: list[Import] = []
    for module, (path, is_package) in modules.items():
        rel = path.relative_to(root).as_posix()
        collector = _Collector(module, is_package, known, rel)
        collector.visit(ast.parse(path.read_text(), filename=rel))
        found.extend(collector.found)
    return sorted(set(found))  # `from m import a, b` is one edge


# ----------------------------------------------------------------------------- the rules


def unit(module: str) -> str:
    """asteria_core's layer unit of a module: its subpackage or top module, or the root."""
    return ".".join(module.split(".")[:2])


def core_no_web(imports: list[Import]) -> Iterator[str]:
    for i in imports:
        if top(i.importer) == CORE and within(i.imported, CORE_FORBIDDEN):
            yield f"{i}: asteria_core imports the control plane, dashboard or web stack"


def dashboard_over_http(imports: list[Import]) -> Iterator[str]:
    for i in imports:
        if top(i.importer) == "dashboard" and within(i.imported, DASHBOARD_FORBIDDEN):
            yield f"{i}: the dashboard talks HTTP, it imports no torch or asteria_core"


def bench_over_http(imports: list[Import]) -> Iterator[str]:
    for i in imports:
        if top(i.importer) == "asteria_bench" and within(i.imported, BENCH_FORBIDDEN):
            yield f"{i}: asteria_bench measures the control plane over HTTP, it imports none of it"


def product_below_bench(imports: list[Import]) -> Iterator[str]:
    for i in imports:
        if top(i.importer) in PRODUCT and top(i.imported) in ("asteria", "asteria_bench"):
            yield (f"{i}: a product package imports neither the benchmarks nor the command "
                   "table above it")


def core_layers(imports: list[Import]) -> Iterator[str]:
    for i in imports:
        if top(i.importer) != CORE or top(i.imported) != CORE:
            continue
        src, dst = unit(i.importer), unit(i.imported)
        for u in (src, dst):
            if u != CORE and u not in RANKS:
                yield f"{i}: {u} has no layer; give it a rank in RANKS"
        if src == dst or CORE not in (src, dst) and (src not in RANKS or dst not in RANKS):
            continue
        if dst == CORE:
            if RANKS.get(src, 0) < ROOT_USERS_MIN_RANK:
                yield f"{i}: nothing inside asteria_core imports the package root"
        elif src == CORE:
            if RANKS[dst] > ROOT_MAX_RANK:
                yield f"{i}: the package root re-exports runtime and below, not {dst}"
        elif RANKS[dst] >= RANKS[src]:
            yield f"{i}: {src} (rank {RANKS[src]}) imports {dst} (rank {RANKS[dst]})"


def optim_math(imports: list[Import]) -> Iterator[str]:
    for i in imports:
        if unit(i.importer) == "asteria_core.optim" and within(i.imported, OPTIM_FORBIDDEN):
            yield f"{i}: the optimizer math runs no threads, processes or collectives"


def _cycle_edges(imports: list[Import], node) -> Iterator[str]:
    """The imports whose `node` edge (node(importer) -> node(imported)) lies on a cycle."""
    graph: dict[str, set[str]] = {}
    edges = []
    for i in imports:
        a, b = node(i.importer), node(i.imported)
        if a and b and a != b:
            graph.setdefault(a, set()).add(b)
            edges.append((a, b, i))

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    for a, b, i in edges:
        if reaches(b, a):
            yield f"{i}: {a} -> {b} closes a cycle"


def package_cycles(imports: list[Import]) -> Iterator[str]:
    yield from _cycle_edges(imports, lambda m: top(m) if top(m) in PACKAGES else None)


def core_cycles(imports: list[Import]) -> Iterator[str]:
    yield from _cycle_edges(imports, lambda m: unit(m) if top(m) == CORE else None)


def module_cycles(imports: list[Import]) -> Iterator[str]:
    """Inside every package, module by module (a package's __init__ is a module too)."""
    yield from _cycle_edges(imports, lambda m: m if top(m) in PACKAGES else None)


RULES = {rule.__name__: rule for rule in (core_no_web, dashboard_over_http, bench_over_http,
                                          product_below_bench, core_layers, optim_math,
                                          package_cycles, core_cycles, module_cycles)}


def violations(imports: list[Import]) -> list[str]:
    return [f"[{name}] {v}" for name, rule in RULES.items() for v in rule(imports)]


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return collect_imports(ROOT)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_import_graph_holds(imports, rule):
    found = sorted(set(RULES[rule](imports)))
    if found:
        pytest.fail(f"{rule}: {len(found)} offending import(s):\n  " + "\n  ".join(found),
                    pytrace=False)


def test_the_graph_is_read_from_every_module_function_level_imports_included(imports):
    importers = {i.importer for i in imports}
    assert {"asteria_core", "asteria_core.cli", "backend.app", "dashboard.app"} <= importers
    assert Import("backend/commands.py", 0, "backend.commands", "backend.launch", "function") in \
        {dataclasses.replace(i, line=0) for i in imports}, "the import inside cmd_start"


# ----------------------------------------------------------------------------- the checker


def tree(root: Path, files: dict[str, str]) -> Path:
    for package in PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").touch()
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            if parent.parts:
                (root / parent / "__init__.py").touch()
        path.write_text(text)
    return root


def test_a_function_level_import_up_the_layers_is_reported(tmp_path):
    root = tree(tmp_path, {
        "asteria_core/telemetry/x.py": "def f():\n    from asteria_core.train import trainer\n",
        "asteria_core/train/trainer.py": "",
    })
    found = violations(collect_imports(root))
    assert found == ["[core_layers] asteria_core/telemetry/x.py:2 asteria_core.telemetry.x -> "
                     "asteria_core.train.trainer (function): asteria_core.telemetry (rank 1) "
                     "imports asteria_core.train (rank 4)"], found


@pytest.mark.parametrize(("files", "expected"), [
    ({"asteria_core/cli.py": "def serve():\n    import uvicorn\n"},
     "[core_no_web] asteria_core/cli.py:2 asteria_core.cli -> uvicorn (function)"),
    ({"asteria_core/telemetry/x.py": "import importlib\n"
                                     "m = importlib.import_module('backend.app')\n"},
     "[core_no_web] asteria_core/telemetry/x.py:2 asteria_core.telemetry.x -> backend.app"),
    ({"asteria_core/refresh/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from ..tiers import store\n",
      "asteria_core/tiers/store.py": ""},
     "[core_layers] asteria_core/refresh/a.py:3 asteria_core.refresh.a -> "
     "asteria_core.tiers.store (TYPE_CHECKING): asteria_core.refresh (rank 2) imports "
     "asteria_core.tiers (rank 2)"),
    ({"asteria_core/train/x.py": "from asteria_core import Runtime\n"},
     "[core_layers] asteria_core/train/x.py:1 asteria_core.train.x -> asteria_core: nothing "
     "inside asteria_core imports the package root"),
    ({"asteria_core/newpart/x.py": "from asteria_core.policy import Policy\n"},
     "asteria_core.newpart has no layer"),
    ({"asteria_core/optim/x.py": "from torch import distributed as dist\n"},
     "[optim_math] asteria_core/optim/x.py:1 asteria_core.optim.x -> torch.distributed"),
    ({"dashboard/x.py": "def f():\n    import torch\n"},
     "[dashboard_over_http] dashboard/x.py:2 dashboard.x -> torch (function)"),
    ({"backend/x.py": "import asteria_core.cli\n",
      "asteria_core/cli.py": "from backend import x\n"},
     "[package_cycles] backend/x.py:1 backend.x -> asteria_core.cli: backend -> asteria_core "
     "closes a cycle"),
    ({"asteria_bench/suites/x.py": "from backend.app import create_app\n"},
     "[bench_over_http] asteria_bench/suites/x.py:1 asteria_bench.suites.x -> backend.app"),
    ({"backend/x.py": "def f():\n    from asteria_bench import cli\n"},
     "[product_below_bench] backend/x.py:2 backend.x -> asteria_bench (function)"),
    ({"dashboard/x.py": "import asteria.cli\n"},
     "[product_below_bench] dashboard/x.py:1 dashboard.x -> asteria.cli"),
    ({"backend/a.py": "import backend.b\n",
      "backend/b.py": "def f():\n    from backend.a import x\n"},
     "[module_cycles] backend/a.py:1 backend.a -> backend.b: backend.a -> backend.b closes a "
     "cycle"),
], ids=["function-web", "import_module", "relative-TYPE_CHECKING", "root", "unranked",
        "from-torch-import-distributed", "dashboard-torch", "package-cycle", "bench-backend",
        "backend-bench", "dashboard-command", "module-cycle"])
def test_each_rule_reports_its_edges(tmp_path, files, expected):
    found = violations(collect_imports(tree(tmp_path, files)))
    assert any(expected in v for v in found), found


def test_a_tree_that_keeps_the_rules_reports_nothing(tmp_path):
    root = tree(tmp_path, {
        "asteria_core/__init__.py": "from asteria_core.runtime import Runtime\n",
        "asteria_core/runtime/__init__.py": "from .core import Runtime\n",
        "asteria_core/runtime/core.py": "from asteria_core.telemetry import records\n"
                                        "from asteria_core.optim import base\nimport torch\n",
        "asteria_core/telemetry/records.py": "from ..policy import Policy\n",
        "asteria_core/optim/base.py": "import torch\n",
        "asteria_core/policy.py": "import threading\n",
        "backend/app.py": "import fastapi\nfrom asteria_core.runtime import Runtime\n",
        "dashboard/app.py": "import httpx\nimport streamlit\n",
    })
    assert violations(collect_imports(root)) == []


# ----------------------------------------------------------------------------- at runtime

FORBIDDEN_LOADED = {
    "asteria_core": ("fastapi", "uvicorn", "starlette", "streamlit", "pydantic", "backend",
                     "dashboard", "asteria_bench"),
    "backend": ("asteria_bench",),
    "dashboard": ("torch", "asteria_core"),
    "asteria_bench": ("fastapi", "uvicorn", "starlette", "streamlit", "backend", "dashboard"),
}
# Adapters whose framework is an optional extra fail to import without it (import-guarded);
# the probe skips those and nothing else.
OPTIONAL = ("transformers", "accelerate", "lightning", "pytorch_lightning", "lightning_fabric",
            "heavyball", "pytorch_optimizer")
OPTIONAL_ADAPTERS = ("asteria_core.integrations.", "asteria_bench.peers")

PROBE = """
import importlib, json, pkgutil, sys

def missing_optional(err):
    while err is not None:
        if isinstance(err, ImportError) and (err.name or "").split(".")[0] in OPTIONAL:
            return True
        err = err.__cause__ or err.__context__
    return False

OPTIONAL = set(json.loads(sys.argv[2]))
ADAPTERS = tuple(json.loads(sys.argv[3]))
root = importlib.import_module(sys.argv[1])
skipped = []
for info in pkgutil.walk_packages(root.__path__, root.__name__ + "."):
    try:
        importlib.import_module(info.name)
    except ImportError as err:
        if not (info.name.startswith(ADAPTERS) and missing_optional(err)):
            raise
        skipped.append(info.name)
print(json.dumps({"loaded": sorted(sys.modules), "skipped": skipped}))
"""


@pytest.mark.parametrize("package", sorted(FORBIDDEN_LOADED))
def test_importing_a_package_loads_no_forbidden_module(package):
    proc = subprocess.run([sys.executable, "-c", PROBE, package, json.dumps(OPTIONAL),
                           json.dumps(OPTIONAL_ADAPTERS)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.splitlines()[-1])["loaded"]
    assert package in loaded
    bad = sorted(m for m in loaded if within(m, FORBIDDEN_LOADED[package]))
    assert not bad, f"importing {package} and its submodules loads {bad}"
