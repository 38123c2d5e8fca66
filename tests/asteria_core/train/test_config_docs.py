"""Every config key described (`asteria keys`): its type, what it allows in the words its own
check uses, its default and its help, all from the field's one `Setting`."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

from asteria_core.fields import settings_of
from asteria_core.policy import Policy
from asteria_core.train.config_docs import describe_keys
from asteria_core.train.config_io import sections
from asteria_core.validation import ConfigError

RANGE = re.compile(r"an? (integer|number) in ([\[(])(-?[\d.e+]+), (-?[\d.e+]+)([\])])$")


def test_every_key_of_every_section_is_described_once_in_file_order():
    expected = [f"{name}.{f.name}" for name, cls in sections().items()
                for f in dataclasses.fields(cls)]
    docs = describe_keys()
    assert [d.key for d in docs] == expected
    for doc in docs:
        section, name = doc.key.split(".")
        cls = sections()[section]
        (setting,) = (s for s in settings_of(cls) if s.name == name)
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        assert doc.default == field.default == setting.default
        assert doc.help == setting.help and len(doc.help) > 10, doc.key


@pytest.mark.parametrize(("key", "allowed"), [
    ("optim.lr", "a number in (0.0, 10.0]"),
    ("model.dropout", "a number in [0.0, 1.0)"),
    ("model.vocab_size", "an integer in [256, 1048576]"),
    ("optim.betas", "two numbers in [0.0, 1.0)"),
    ("optim.shampoo_beta", "-1 (use betas[1]) or a number in [0, 1)"),
    ("optim.name", "adamw | soap | shampoo | kl_shampoo | muon"),
    ("train.cpus", "a CPU list such as '0' or '0-3,6' of CPUs this machine has, or empty"),
    ("telemetry.metrics_port", "an integer in [0, 65535]"),
    ("policy.swap_delay", '"auto" or an integer in [0, 1000000]'),
    ("train.out_dir", "a string of at most 4096 characters"),
    ("telemetry.metrics_host", "a non-empty string of at most 255 characters"),
])
def test_allowed_values_are_what_the_check_says(key, allowed):
    assert {d.key: d.allowed for d in describe_keys()}[key] == allowed


def test_every_stated_range_is_the_one_the_section_enforces():
    """Just outside each range a key states, its section refuses the value, naming the key."""
    checked = 0
    for doc in describe_keys():
        section, name = doc.key.split(".")
        cls, match = sections()[section], RANGE.fullmatch(doc.allowed)
        if cls is Policy or match is None:
            continue
        kind, left, lo, hi, right = match.groups()
        if kind == "integer":
            below, above = int(lo) - 1, int(hi) + 1
        else:
            below, above = math.nextafter(float(lo), -math.inf), math.nextafter(float(hi), math.inf)
        outside = [float(lo) if left == "(" else below, float(hi) if right == ")" else above]
        for value in outside:
            with pytest.raises(ConfigError, match=re.escape(doc.key)):
                cls(**{name: value})
        checked += 1
    assert checked >= 25
