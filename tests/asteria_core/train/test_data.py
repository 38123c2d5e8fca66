from pathlib import Path

import pytest
import torch

from asteria_core.train.data import (
    BatchLoader,
    decode,
    embedded_corpus,
    encode,
    fixed_eval_batches,
    load_corpus,
    split_tokens,
)


def test_embedded_corpus_is_cpython_docs():
    text = embedded_corpus()
    assert 300_000 < len(text.encode()) < 1_000_000
    assert "The import system" in text or "import" in text
    assert embedded_corpus() == text  # same bytes on every call


def test_byte_tokenizer_round_trips_unicode():
    text = "naive cafe, na\u00efve caf\u00e9 \u2192 \u03bb"
    tokens = encode(text)
    assert tokens.dtype == torch.long and int(tokens.max()) < 256
    assert decode(tokens) == text


def test_corpus_from_file_and_folder(tmp_path):
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "image.png").write_bytes(b"\x89PNG")
    assert load_corpus(str(tmp_path / "a.txt")) == "first"
    assert load_corpus(str(tmp_path)) == "first\n\nsecond"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="data.corpus"):
        load_corpus(str(empty))


def test_split_is_deterministic_tail():
    tokens = torch.arange(1000)
    train, val = split_tokens(tokens, 0.1, block_size=16)
    assert len(val) == 100 and int(val[0]) == 900 and len(train) == 900
    with pytest.raises(ValueError, match="block_size"):
        split_tokens(torch.arange(50), 0.1, block_size=16)


def test_loader_resumes_exactly_across_epochs():
    tokens = torch.arange(2000) % 256
    a = BatchLoader(tokens, block_size=15, batch_size=8, seed=3)
    batches = [a.next_batch() for _ in range(40)]  # 2000 // 16 = 125 windows: several epochs
    assert a.state.epoch >= 2
    b = BatchLoader(tokens, block_size=15, batch_size=8, seed=3)
    for _ in range(17):
        b.next_batch()
    c = BatchLoader(tokens, block_size=15, batch_size=8, seed=3)
    c.load_state_dict(b.state_dict())
    for x, y in batches[17:]:
        cx, cy = c.next_batch()
        assert torch.equal(cx, x) and torch.equal(cy, y)
    x, y = batches[0]
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one


def test_eval_batches_are_fixed():
    tokens = torch.arange(5000) % 256
    first = fixed_eval_batches(tokens, 31, 4, 3)
    assert len(first) == 3
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, fixed_eval_batches(tokens, 31, 4, 3),
                                                        strict=True))


def test_a_corpus_beyond_the_limit_is_refused_even_when_its_size_says_nothing(tmp_path):
    """Only what fits the machine's memory is read, counted as read: /proc's files report a
    size of 0, and a file may grow while it is read."""
    text = tmp_path / "corpus.txt"
    text.write_text("x" * 101)
    with pytest.raises(ValueError, match="holds more than 100 bytes"):
        load_corpus(str(text), limit=100)
    assert load_corpus(str(text), limit=101) == "x" * 101
    assert Path("/proc/self/status").stat().st_size == 0
    with pytest.raises(ValueError, match="holds more than 10 bytes"):
        load_corpus("/proc/self/status", limit=10)
