"""Each setting described once (asteria_core/fields.py): a config section refuses exactly what
its settings say, in the words `asteria keys` and the OpenAPI document state."""

from __future__ import annotations

import dataclasses
import math

import pytest

from asteria_core.fields import Kind, Setting, problems, setting, settings_of
from asteria_core.train.config_io import sections
from asteria_core.validation import ConfigError


def _outside(s: Setting) -> list:
    """Values a setting must refuse: just past each bound, the wrong JSON type, bool for int."""
    match s.kind:
        case Kind.INT | Kind.AUTO_OR_INT:
            return [s.minimum - 1, s.maximum + 1, True, "5", 1.0]
        case Kind.FLOAT:
            low = s.minimum if s.lo_open else math.nextafter(s.minimum, -math.inf)
            high = s.maximum if s.hi_open else math.nextafter(s.maximum, math.inf)
            return [v for v in (low, high) if v not in s.also] + [math.nan, math.inf, True, "1"]
        case Kind.FLOAT_PAIR:
            return [(s.maximum + 1, 0.5), (0.5,), [0.5, 0.5], (0.5, math.nan)]
        case Kind.CHOICE:
            return ["nope", 1, None]
        case Kind.BOOL:
            return [1, "true", None]
    return [5, None, "x" * (s.max_length + 1)] + ([""] if s.min_length else [])


CONFIG_SETTINGS = [(section, s) for section, cls in sections().items()
                   if section != "policy" for s in settings_of(cls)]


@pytest.mark.parametrize(("section", "s"), CONFIG_SETTINGS,
                         ids=[f"{sec}.{s.name}" for sec, s in CONFIG_SETTINGS])
def test_each_config_key_is_validated_by_its_setting(section, s):
    cls = sections()[section]
    assert s.help and getattr(cls(), s.name) == s.default
    for value in _outside(s):
        with pytest.raises(ConfigError) as err:
            cls(**{s.name: value})
        assert str(err.value).startswith(f"{section}.{s.name}: got "), str(err.value)
        assert str(err.value).endswith(f"; allowed: {s.allowed()}")


def test_open_and_closed_bounds_and_extra_values():
    s = Setting(Kind.FLOAT, "help", minimum=0.0, maximum=1.0, hi_open=True, also=(-1.0,))
    assert s.accepts(0.0) and s.accepts(-1.0) and s.accepts(0.999)
    assert not s.accepts(1.0) and not s.accepts(-0.5) and not s.accepts(math.nan)
    assert s.allowed() == "a number in [0.0, 1.0)"
    opened = Setting(Kind.INT, "help", minimum=0, maximum=3, lo_open=True)
    assert not opened.accepts(0) and opened.accepts(3) and opened.allowed() == \
        "an integer in (0, 3]"


def test_a_refused_value_is_shown_shortened():
    s = Setting(Kind.STR, "help", max_length=8)
    said = s.problem("y" * 10_000)
    assert said.startswith("got 'yyy") and len(said) < 100 and said.endswith(
        "allowed: a string of at most 8 characters")


def test_a_field_without_a_setting_is_refused():
    @dataclasses.dataclass
    class Section:
        described: int = setting(1, Kind.INT, "An integer.", minimum=0, maximum=2)
        bare: int = 3

    with pytest.raises(TypeError, match="Section.bare has no setting"):
        settings_of(Section)


def test_problems_lists_every_refused_field():
    @dataclasses.dataclass
    class Section:
        a: int = setting(1, Kind.INT, "An integer.", minimum=0, maximum=2)
        b: str = setting("x", Kind.CHOICE, "A choice.", choices=("x", "y"))

    assert list(problems(Section())) == []
    assert [name for name, _ in problems(Section(a=9, b="z"))] == ["a", "b"]
