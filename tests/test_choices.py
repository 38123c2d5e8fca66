"""Choices are types, not strings, checked on the source.

Every choice, command and status is a `StrEnum` (the policy's swap mode, worker kind, offload
mode and queue order; a data-parallel run's state and update dtype; tiers, phases, idle causes,
energy sources; refresh methods, moment swaps, optimizer names, devices; run statuses and
commands). Outside the module that defines an enum,
code compares with its members, never with the string: a renamed value then fails where it is
defined, not silently where it is compared. The check parses every .py file of the product
packages and reports each `==`, `!=`, `in`, `not in` or `case` against a string literal that is
some enum's value, as `path:line`.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path

from asteria_core.distributed.sharded import DistributedState
from asteria_core.optim.registry import OptimizerName
from asteria_core.optim.seam import RefreshMethod
from asteria_core.policy import SwapMode
from asteria_core.train.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("asteria", "asteria_core", "backend", "dashboard")
NOT_CHOICES = {
    ("asteria_core/machine.py", "memory"): "a cgroup controller's name in /proc/self/cgroup",
    ("asteria_core/train/checkpoint.py", "cuda"): "the key of CUDA's RNG state in a checkpoint",
    ("dashboard/charts.py", "step"): "a chart's x column (the step number)",
}
"""The same word in another vocabulary, with the reason."""


def _files() -> list[Path]:
    return sorted(p for package in PRODUCT for p in (ROOT / package).rglob("*.py"))


def _enums(files: list[Path]) -> dict[str, set[str]]:
    """Each StrEnum's values by the module (path) that defines it."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(b, ast.Name) and b.id == "StrEnum" for b in node.bases):
                values = {item.value.value for item in node.body
                          if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
                          and isinstance(item.value.value, str)}
                found.setdefault(str(path.relative_to(ROOT)), set()).update(values)
    return found


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _torch_device_type(node: ast.AST) -> bool:
    """`x.type`: a torch device's type ("cpu", "cuda"), torch's vocabulary."""
    return isinstance(node, ast.Attribute) and node.attr == "type"


def _compared(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, string) of every string literal a comparison or a case pattern tests against."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and all(
                isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            operands = [node.left, *node.comparators]
            if any(_torch_device_type(o) for o in operands):
                continue
            out += [(node.lineno, s) for o in operands for s in _strings(o)]
        elif isinstance(node, ast.MatchValue):
            out += [(node.lineno, s) for s in _strings(node.value)]
    return out


def violations(files: list[Path]) -> list[str]:
    enums = _enums(files)
    every = {v for values in enums.values() for v in values}
    found = []
    for path in files:
        rel = str(path.relative_to(ROOT))
        own = enums.get(rel, set())
        for line, value in _compared(ast.parse(path.read_text())):
            if value in every and value not in own and (rel, value) not in NOT_CHOICES:
                found.append(f"{rel}:{line} compares with {value!r}")
    return found


def test_no_choice_is_compared_as_a_string_outside_its_enum():
    found = violations(_files())
    assert not found, "compare with the enum's member instead:\n" + "\n".join(found)


def test_the_check_finds_a_choice_compared_as_a_string(tmp_path, monkeypatch):
    """The check itself: a string comparison against a choice is found, its enum's own module
    and a member comparison are not."""
    package = tmp_path / "asteria_core"
    package.mkdir()
    (package / "modes.py").write_text(
        "from enum import StrEnum\n\n\nclass Mode(StrEnum):\n    FAST = 'fast'\n\n\n"
        "def own(m):\n    return m == 'fast'\n")
    (package / "user.py").write_text(
        "from asteria_core.modes import Mode\n\n\ndef good(m):\n    return m == Mode.FAST\n\n\n"
        "def bad(m):\n    match m:\n        case 'fast':\n            return 1\n"
        "    return m in ('slow', 'fast') or device.type == 'fast'\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", tmp_path)
    assert violations(sorted(package.glob("*.py"))) == [
        "asteria_core/user.py:10 compares with 'fast'",
        "asteria_core/user.py:12 compares with 'fast'"]


def test_every_policy_choice_is_an_enums_values():
    """The policy's choice fields list exactly their enums' values (no second list to drift)."""
    from asteria_core.policy import OffloadMode, Priority, SwapMode, WorkerKind, policy_fields

    choices = {f.name: f.choices for f in policy_fields() if f.choices}
    assert choices == {"swap_mode": tuple(SwapMode), "worker_kind": tuple(WorkerKind),
                       "priority": tuple(Priority), "offload_mode": tuple(OffloadMode)}


def _sections():
    from asteria_core.policy import Policy

    config = RunConfig()
    return [Policy(), *(getattr(config, f.name) for f in dataclasses.fields(config))]


def test_every_choice_field_is_annotated_with_its_enum_and_holds_its_member():
    """A choice given as a plain string (a config file, the command line, a request) is held as
    its enum's member, the type its field is annotated with (so a type checker sees it)."""
    from asteria_core.fields import Kind, settings_of
    from asteria_core.train.config_io import build_config, parse_overrides

    found = 0
    for section in _sections():
        hints = typing.get_type_hints(type(section))
        for s in settings_of(type(section)):
            if s.kind != Kind.CHOICE or s.enum is None:
                continue
            found += 1
            assert hints[s.name] is s.enum, f"{type(section).__name__}.{s.name}"
            assert type(getattr(section, s.name)) is s.enum
    assert found >= 14  # the policy's four, the runtime's two, the autopilot's two, ...
    config = build_config(parse_overrides([("policy.swap_mode", "opportunistic"),
                                           ("runtime.distributed_state", "sharded")]))
    assert config.policy.swap_mode is SwapMode.OPPORTUNISTIC
    assert config.runtime.distributed_state is DistributedState.SHARDED


def test_a_config_of_members_checkpoints_as_plain_strings(tmp_path):
    """A checkpoint holds plain data only (it loads without building objects): members are
    written as their values, and read back into members."""
    from asteria_core.train import checkpoint
    from asteria_core.train.config_io import config_from_dict, config_to_dict

    config = RunConfig()
    state = {"format_version": checkpoint.FORMAT_VERSION, "config": config_to_dict(config),
             "groups": [{"refresh": RefreshMethod.EIGH}]}
    checkpoint.save_atomic(state, tmp_path / "c.pt")
    loaded = checkpoint.load(tmp_path / "c.pt")
    assert type(loaded["groups"][0]["refresh"]) is str
    assert loaded["groups"][0]["refresh"] == "eigh"
    assert config_from_dict(loaded["config"]) == config



def test_a_refusal_quotes_a_member_as_its_plain_string():
    """Members flow into error messages through `!r`: they read as the string the user gave."""
    import pytest

    from asteria_core.train.config import ConfigError
    from asteria_core.train.plan import run_shape

    config = RunConfig()
    assert config.optim.name is OptimizerName.ADAMW
    with pytest.raises(ConfigError, match="optim.name: got 'adamw'; allowed: soap"):
        run_shape(config)
    assert repr(SwapMode.OPPORTUNISTIC) == "'opportunistic'"
    assert [RefreshMethod.EIGH] == ["eigh"]
