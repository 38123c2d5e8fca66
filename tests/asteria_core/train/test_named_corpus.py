"""The built-in "python-source" corpus: deterministic, not the default, loadable by name."""

from __future__ import annotations

import pytest

from asteria_core.train.data import (
    NAMED_CORPORA,
    PYTHON_SOURCE_MODULES,
    embedded_corpus,
    load_corpus,
    python_source_corpus,
)


def test_python_source_is_deterministic_and_not_the_default():
    first, second = python_source_corpus(), python_source_corpus()
    assert first == second
    assert first != embedded_corpus()
    assert first.startswith(f"# ---- {PYTHON_SOURCE_MODULES[0]}.py ----\n")
    assert [line[7:-5] for line in first.splitlines() if line.startswith("# ---- ")] == \
        [f"{name}.py" for name in PYTHON_SOURCE_MODULES]
    assert 300_000 < len(first.encode()) < 1_000_000  # a corpus the size of the default one
    assert "\r" not in first


def test_loaded_by_name_unless_a_path_has_that_name(tmp_path, monkeypatch):
    assert "python-source" in NAMED_CORPORA
    assert load_corpus("python-source") == python_source_corpus()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "python-source").write_text("a file of that name wins")
    assert load_corpus("python-source") == "a file of that name wins"


def test_the_config_takes_every_built_in_name_and_only_those():
    from asteria_core.train.config import BUILTIN_CORPORA, DataConfig
    from asteria_core.validation import ConfigError

    assert set(BUILTIN_CORPORA) == set(NAMED_CORPORA)
    assert DataConfig(corpus="python-source").corpus == "python-source"
    with pytest.raises(ConfigError, match="data.corpus: path 'python-sauce' does not exist"):
        DataConfig(corpus="python-sauce")
