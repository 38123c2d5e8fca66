"""Disk-tier files: round trip, write new then rename, faults caught before any value is used."""

from __future__ import annotations

import os
import threading
import zlib

import numpy as np
import pytest
import torch

from asteria_core.policy import Policy
from asteria_core.tiers import DiskTier, TierFileError
from asteria_core.tiers import disk as disk_module
from asteria_core.tiers.disk import aligned_buffer
from tests.asteria_core.tiers.conftest import Run, state_bytes

PARTS = [("p0.exp_avg", 0, 5000), ("p0.factors.0.0", 8192, 64)]


def filled() -> np.ndarray:
    buf = aligned_buffer(8192 + 4096)
    buf[:] = np.random.default_rng(0).integers(0, 255, buf.size, dtype=np.uint8)
    return buf


def test_round_trip_and_no_file_left_half_written(tmp_path):
    disk = DiskTier(tmp_path)
    data = filled()
    disk.write("p0.written", data, PARTS)
    out = aligned_buffer(data.size)
    disk.read("p0.written", out, PARTS)
    for _, off, n in PARTS:
        assert np.array_equal(out[off:off + n], data[off:off + n])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p0.written.bin"]


def test_reads_in_chunks_verify_parts_that_span_chunks(tmp_path, monkeypatch):
    """A read goes in READ_CHUNK pieces with running checksums; with one-page chunks each part
    spans several, and a flipped byte in any chunk is still caught."""
    monkeypatch.setattr(disk_module, "READ_CHUNK", 4096)
    disk = DiskTier(tmp_path)
    data = filled()
    disk.write("p0.written", data, PARTS)
    out = aligned_buffer(data.size)
    disk.read("p0.written", out, PARTS)
    assert all(np.array_equal(out[o:o + n], data[o:o + n]) for _, o, n in PARTS)
    path = disk.path("p0.written")
    raw = bytearray(path.read_bytes())
    raw[4096 + 4096 + 10] ^= 0xFF  # second chunk of p0.exp_avg
    path.write_bytes(bytes(raw))
    with pytest.raises(TierFileError, match="p0.exp_avg.*fails its checksum"):
        disk.read("p0.written", out, PARTS)
    disk.close()


def test_checksums_computed_beside_the_write_match_and_the_helper_stops(tmp_path):
    """The header (written last, sized for the widest checksums) holds each tensor's CRC-32;
    close() stops the checksum thread."""
    before = set(threading.enumerate())
    disk = DiskTier(tmp_path)
    data = filled()
    disk.write("p0.written", data, PARTS)
    raw = disk.path("p0.written").read_bytes()
    header = DiskTier._header("p0", disk.path("p0.written"), raw[:4096])
    assert [part[3] for part in header["parts"]] == \
        [zlib.crc32(data[off:off + n]) for _, off, n in PARTS]
    disk.close()
    assert not set(threading.enumerate()) - before


@pytest.mark.parametrize("fault", ["missing", "truncated", "corrupt", "header"])
def test_bad_files_are_caught_naming_the_tensor_and_the_file(tmp_path, fault):
    disk = DiskTier(tmp_path)
    disk.write("p0.written", filled(), PARTS)
    path = disk.path("p0.written")
    if fault == "missing":
        path.unlink()
    elif fault == "truncated":
        os.truncate(path, path.stat().st_size - 100)
    else:
        raw = bytearray(path.read_bytes())
        raw[4096 + 8192 + 3 if fault == "corrupt" else 2] ^= 0xFF
        path.write_bytes(bytes(raw))
    with pytest.raises(TierFileError) as info:
        disk.read("p0.written", aligned_buffer(8192 + 4096), PARTS)
    assert str(path) in str(info.value)
    expected = "p0.factors.0.0" if fault == "corrupt" else "p0.exp_avg"
    assert expected in str(info.value)


def test_a_corrupt_file_mid_run_stops_it_with_the_tensor_and_the_file(tmp_path):
    total, w = state_bytes(tmp_path / "probe")
    run = Run(Policy(offload_mode="disk", device_budget_bytes=w), tmp_path / "run")
    run.train(3)
    run.store._drain()  # every write done: the files on disk are the state
    victim = sorted((tmp_path / "run" / "tiers").glob("p6.*written*.bin"))[0]
    raw = bytearray(victim.read_bytes())
    raw[-1] ^= 0x01
    victim.write_bytes(bytes(raw))
    before = run.params()
    with pytest.raises(TierFileError) as info:
        run.train(1)
    assert str(victim) in str(info.value) and "p6." in str(info.value)
    assert "checksum" in str(info.value)
    # parameters before p6 were updated; nothing at or after it read a corrupt value
    after = torch.cat([p.detach().flatten() for p in list(run.model.parameters())[6:]])
    assert torch.equal(after, before[-after.numel():])
    run.store.close()
