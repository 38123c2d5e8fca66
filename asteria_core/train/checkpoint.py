"""Checkpoints that resume exactly, written atomically.

A checkpoint is one self-describing dict (model, optimizer, scheduler, data position, RNG states,
step, config) of tensors and plain values, so it loads with torch's weights-only unpickler and a
crafted file cannot run code. It is written to a temporary file in the same folder, fsynced, then
renamed over the old one, so a crash mid-write never leaves a broken latest checkpoint, and a
write that fails (a full disk) leaves the previous checkpoint as it was.

The file carries the SHA-256 of its bytes (in the zip's own comment field, so torch and any zip
reader still read it), checked before anything in it is used: a file damaged on disk is refused,
never trained from. The checkpoint before the newest is kept beside it (`previous_path`), so a
damaged newest one, or one of a step the other ranks of a data-parallel run never reached, still
leaves a good one to resume.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import random
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor

from asteria_core.compat import StrEnum
from asteria_core.tiers.disk import LOADED, release_loaded, release_pages

log = logging.getLogger(__name__)

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1
_CHECKSUM_TAG = b"asteria-sha256:"
_TRAILER_BYTES = len(_CHECKSUM_TAG) + 64  # the tag and the digest in hex: the zip's comment
_EOCD = b"PK\x05\x06"  # the zip's end record: 22 bytes, its last 2 the comment's length
_READ_CHUNK = 1 << 20


class DamagedCheckpoint(ValueError):
    """A checkpoint whose bytes are not the ones written (its checksum does not match)."""


class NonFiniteState(RuntimeError):
    """The state to checkpoint holds NaN or infinite values: saving it would replace the last
    good checkpoint with one nothing can train from."""


def previous_path(path: Path) -> Path:
    """Where the checkpoint before the newest one at `path` is kept (checkpoint.prev.pt)."""
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def rng_state() -> dict[str, Any]:
    """Every generator's state, as tensors and plain Python values only (see `load`)."""
    legacy = np.random.get_state()
    assert isinstance(legacy, tuple)  # the global generator is MT19937: its legacy tuple
    name, keys, pos, has_gauss, gauss = legacy
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), pos, has_gauss, gauss),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> str | None:
    """Restore every generator; the CUDA ones device by device for the devices visible now.
    Returns what could not be restored (states of devices this process does not see, or
    devices the checkpoint has no state for), None when everything was."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "cuda" not in state:
        return None
    saved = list(state["cuda"])
    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for index, device_state in enumerate(saved[:present]):
        torch.cuda.set_rng_state(device_state, index)
    if len(saved) == present:
        return None
    if len(saved) > present:
        return (f"the checkpoint holds the CUDA generator states of {len(saved)} devices and "
                f"{present} are visible: devices {present}..{len(saved) - 1} not restored")
    return (f"the checkpoint holds the CUDA generator states of {len(saved)} devices and "
            f"{present} are visible: devices {len(saved)}..{present - 1} keep their seeds")


class _Streamed:
    """The checkpoint file as torch.save writes it, one tensor per write: once a tensor that
    views a disk-tier file is written its pages leave memory again (tiers.disk.release_pages),
    so the disk tier goes from file to file about one tensor at a time."""

    def __init__(self, f) -> None:
        self._f = f
        self.error: OSError | None = None  # a write that failed (a full disk, say)
        self.digest = hashlib.sha256()  # of every byte written, in order: the file's checksum

    def write(self, data) -> int:
        try:
            n = self._f.write(data)
        except OSError as err:
            self.error = err
            raise
        self.digest.update(data)
        release_pages(data)
        return n

    def flush(self) -> None:
        self._f.flush()


def save_atomic(obj: dict[str, Any], path: Path, *, keep_previous: bool = False) -> None:
    """Write `obj` to `path` so that readers see either the old file or the new one, whole,
    with its checksum. Nothing is copied first: torch.save writes each tensor from its own
    memory, and the disk tier's from its mapped files (see `_Streamed`); the written file
    leaves the page cache. `keep_previous`: the file `path` held until now stays, as
    `previous_path(path)` (a hard link made before the rename: at every instant both names
    hold a whole checkpoint)."""
    obj = plain(obj)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            streamed = _Streamed(f)
            try:
                # torch.save writes to any object with write and flush; its annotation names
                # only str, PathLike and IO[bytes].
                torch.save(obj, streamed)  # type: ignore[arg-type]
            except RuntimeError as err:
                # torch's zip writer answers a failed write with an error of its own ("unexpected
                # pos") as it closes: the write's OSError is the one that says what happened.
                if streamed.error is None:
                    raise
                raise streamed.error from err
            _append_checksum(f, streamed.digest.hexdigest())
            f.flush()
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        if keep_previous and path.is_file():
            _link_over(path, previous_path(path))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def _append_checksum(f, hexdigest: str) -> None:
    """The checksum of the bytes torch wrote, as the zip's comment: its length goes into the
    end record's last two bytes (written as 0), the comment after it."""
    f.flush()
    f.seek(-2, os.SEEK_END)
    f.write(struct.pack("<H", _TRAILER_BYTES))
    f.write(_CHECKSUM_TAG + hexdigest.encode("ascii"))


def _link_over(source: Path, target: Path) -> None:
    """`target` becomes another name of `source`'s file, replacing what it was at once."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # a file system without hard links: a copy, written whole before the rename
        shutil.copyfile(source, tmp)
    os.replace(tmp, target)


def verify(path: str | Path) -> bool:
    """Check the file's checksum against its bytes: True when it matches, False for a file
    written without one (by an earlier version: nothing to check); DamagedCheckpoint when the
    bytes are not those written."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as f:
        if size < 22 + _TRAILER_BYTES:
            return _unsigned(f, path, size)
        f.seek(size - _TRAILER_BYTES - 22)
        end = f.read(22 + _TRAILER_BYTES)
        record, trailer = end[:22], end[22:]
        if record[:4] != _EOCD or record[20:] != struct.pack("<H", _TRAILER_BYTES) or \
                not trailer.startswith(_CHECKSUM_TAG):
            return _unsigned(f, path, size)
        digest, left = hashlib.sha256(), size - _TRAILER_BYTES - 2
        f.seek(0)
        while left:
            chunk = f.read(min(_READ_CHUNK, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
        digest.update(b"\0\0")  # the comment's length as torch wrote it
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if digest.hexdigest().encode("ascii") != trailer[len(_CHECKSUM_TAG):]:
        raise DamagedCheckpoint(f"{path} is damaged: its bytes do not match the SHA-256 "
                                "checksum written with it (the file changed on disk after it "
                                "was saved)")
    return True


def _unsigned(f, path: Path, size: int) -> bool:
    """A file with no checksum: an earlier version's checkpoint (a zip ending in its end record
    with no comment) is read unchecked; anything else is a checkpoint whose end is damaged."""
    if size >= 22:
        f.seek(size - 22)
        record = f.read(22)
        if record[:4] == _EOCD and record[20:] == b"\0\0":
            log.warning("%s carries no checksum (written by an earlier version): not verified",
                        path)
            return False
    raise DamagedCheckpoint(f"{path} is damaged: its end (where its SHA-256 checksum is kept) "
                            "is not one a checkpoint is written with")


def _numpy_rng_types() -> list:
    """What rebuilds a uint32 numpy array: checkpoints written before the generator state was
    stored as plain values hold numpy's that way. Nothing else outside torch's own tensors and
    containers is allowed."""
    from numpy._core.multiarray import _reconstruct

    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def remove_leftovers(folder: Path) -> None:
    """Temporary files of checkpoint writes a crash cut short (`save_atomic` removes its own
    when a write fails)."""
    previous = previous_path(Path(CHECKPOINT_NAME)).name
    for pattern in (f".{CHECKPOINT_NAME}.*.tmp", f".{previous}.*.link"):
        for left in folder.glob(pattern):
            left.unlink(missing_ok=True)


def load(path: str | Path, *, verified: bool = False) -> dict[str, Any]:
    """Read a checkpoint without running any code it may hold: weights_only unpickling, which
    takes tensors and plain containers only, and refuses any other object (a crafted file
    naming os.system, say) before it is built. Its checksum is checked first (`verify`;
    `verified`: the caller just did). The file is mapped, not read (mmap=True): its tensors
    are views of it until whoever restores them copies them out one at a time (the tier
    store's placement, `tiers.disk.copy_out`), so the state is never in memory twice."""
    if not verified:
        verify(path)
    ckpt = _read(path)
    LOADED.note(t for t in tensors(ckpt))
    return ckpt


def _read(path: str | Path) -> dict[str, Any]:
    try:
        with torch.serialization.safe_globals(_numpy_rng_types()):
            ckpt = torch.load(Path(path), map_location="cpu", weights_only=True, mmap=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "Weights only load failed" in why:
            why = "it holds objects no checkpoint holds; refused without building them"
        raise ValueError(f"train.resume: {path} is not an Asteria checkpoint ({why})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"train.resume: {path} is not an Asteria checkpoint "
                         f"(format_version {FORMAT_VERSION} expected)")
    return ckpt


def good_checkpoints(path: Path) -> tuple[dict[int, Path], list[str]]:
    """This rank's checkpoints that pass their checksum, by step: the newest at `path` and the
    one kept before it. Also why each other one there can not be used."""
    good: dict[int, Path] = {}
    why: list[str] = []
    for candidate in (Path(path), previous_path(path)):
        if not candidate.is_file():
            continue
        try:
            verify(candidate)
            step = int(_read(candidate)["step"])
        except (ValueError, KeyError, TypeError) as err:
            why.append(str(err).removeprefix("train.resume: "))
            continue
        good.setdefault(step, candidate)
    return good, why


def settle_on(path: Path, chosen: Path) -> None:
    """Resuming from `chosen` (`path` itself, or the checkpoint kept before it): the newest
    becomes `chosen`, so the next save keeps `chosen` as the previous one. A newest file that
    fails its checksum is set aside (`.damaged`) for a look, not deleted; a good newest one of
    a step the other ranks never reached is of no use to any resume and goes."""
    path, chosen = Path(path), Path(chosen)
    if chosen == path:
        return
    if path.is_file():
        try:
            verify(path)
            path.unlink()
        except DamagedCheckpoint:
            os.replace(path, path.with_name(f"{path.name}.damaged"))
    os.replace(chosen, path)


def restore_module(module: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """module.load_state_dict(state) from a loaded checkpoint, one tensor at a time: each is
    copied into the module, then its pages of the mapped file leave memory again (loading all
    at once would hold the whole model's share of the file in memory at the peak)."""
    expected = set(module.state_dict(keep_vars=True))
    if set(state) != expected:  # what strict loading would refuse, before copying anything
        module.load_state_dict(state)
    for name, t in state.items():
        module.load_state_dict({name: t}, strict=False)
        release_loaded(t.to_local() if isinstance(t, DTensor) else t)  # an FSDP2 shard


def plain(obj):
    """`obj` with every enum member (a choice an optimizer's param groups or a config hold) as
    its plain string: a checkpoint loads without building objects (`load`)."""
    if isinstance(obj, StrEnum):
        return obj.value
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(plain(v) for v in obj)
    return obj


def tensors(obj):
    """Every tensor `obj` holds; of an FSDP2 shard (a DTensor) this rank's part only."""
    if isinstance(obj, DTensor):
        yield obj.to_local()
    elif isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors(v)
