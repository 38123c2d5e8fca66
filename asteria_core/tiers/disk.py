"""The disk tier: checksummed files of state entries, explicit reads and writes.

A file holds the entries of one parameter with one lifecycle class (so clean bases are never
rewritten with the moments). Layout: a header padded to 4096 bytes (magic, its padded size, then
JSON listing each tensor's name, offset, byte count and CRC-32), then the tensors at 4096-aligned
offsets. A write goes to `<name>.new` and is renamed over `<name>.bin`, so a file is never
overwritten in place. A read checks the size, the header and every CRC before the caller may use
a single value; any mismatch raises `TierFileError` naming the tensor(s) and the file.

Where the file system allows it the files are opened with O_DIRECT, so bytes go between the
staging buffer and the disk without the page cache; elsewhere (tmpfs, some network file
systems) writes are fsynced and the cache pages of both reads and writes are dropped with
posix_fadvise(DONTNEED), so the state really leaves RAM either way. The disk tier is scratch
space, not a checkpoint: durability comes from the run's checkpoints, which copy the state in.

A checkpoint reads the files through `DiskTier.map`: each tensor a view of its file, mapped
(file-backed, copy on write), checked, and not read into memory; the checkpoint writer drops
each tensor's pages once written (`release_pages`), so saving the disk tier holds about one
tensor of it in memory at a time, not a second copy of the state.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import json
import mmap
import os
import threading
import time
import weakref
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from asteria_core.tiers.lifecycle import ALIGN, padded

MAGIC = b"ASTERIA-TIER-1\n"
READ_CHUNK = 8 << 20  # bytes per read call; a multiple of ALIGN (O_DIRECT)


class TierFileError(RuntimeError):
    """A disk-tier file is missing, truncated or corrupt (raised before any value is used), or
    could not be written (a full disk: the previous file is kept, the state in memory is not
    on disk, so the run stops without checkpointing it)."""

    def __init__(self, tensor: str, path: Path, why: str) -> None:
        super().__init__(f"optimizer state {tensor}: disk-tier file {path} {why}")
        self.tensor, self.path = tensor, path


def aligned_buffer(nbytes: int) -> np.ndarray:
    """A zeroed, page-aligned uint8 array (anonymous mmap), usable for O_DIRECT."""
    if nbytes == 0:
        return np.zeros(0, np.uint8)
    return np.frombuffer(mmap.mmap(-1, padded(nbytes)), dtype=np.uint8)


def probe_direct(folder: Path) -> bool:
    """Whether files in `folder` can be opened with O_DIRECT."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    probe = folder / ".direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | flag, 0o600)
    except OSError as err:
        if err.errno == errno.EINVAL:
            return False
        raise
    try:
        # numpy's stubs give ndarray the buffer protocol on Python 3.12+ only
        os.pwrite(fd, aligned_buffer(ALIGN), 0)  # type: ignore[arg-type]
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)


class DiskTier:
    """Files of one run's disk tier in `folder`. Methods are safe to call from I/O threads
    (each call uses its own file descriptor and header buffer)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        for left in self.folder.glob("*.new"):  # a write cut short by a crash
            left.unlink(missing_ok=True)
        self.direct = probe_direct(self.folder)
        self.bytes_written = 0
        self.bytes_read = 0
        self.write_seconds = 0.0
        """Time inside write() (checksum, write, rename): bytes_written / it = write bandwidth."""
        self.read_seconds = 0.0
        self._crc = ThreadPoolExecutor(1, thread_name_prefix="tier-crc")

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.bin"

    def write(self, name: str, data: np.ndarray, parts: list[tuple[str, int, int]]) -> None:
        """Write file `name` from data, an aligned buffer holding the tensors `parts` as
        (tensor name, offset, nbytes) at aligned offsets, in order."""
        t0 = time.perf_counter()
        size = parts[-1][1] + padded(parts[-1][2])
        # The checksums are computed on a helper thread while the data is written (both release
        # the GIL), so a write costs max(checksum, I/O) rather than their sum. The header, which
        # holds them, is written last; its size is fixed up front with the widest checksums.
        crcs = self._crc.submit(lambda: [
            # numpy's stubs give ndarray the buffer protocol on Python 3.12+ only
            zlib.crc32(data[off:off + n])  # type: ignore[arg-type]
            for _, off, n in parts])
        head_size = padded(len(self._head(name, size, parts, [0xFFFFFFFF] * len(parts), 0)))
        final, tmp = self.path(name), self.folder / f"{name}.new"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | self._flag(), 0o600)
            try:
                # numpy's stubs give ndarray the buffer protocol on Python 3.12+ only
                total = os.pwritev(fd, [data[:size]], head_size)  # type: ignore[list-item]
                head = self._head(name, size, parts, crcs.result(), head_size)
                header = aligned_buffer(head_size)
                header[:len(head)] = np.frombuffer(head, np.uint8)
                # numpy's stubs give ndarray the buffer protocol on Python 3.12+ only
                total += os.pwritev(fd, [header], 0)  # type: ignore[list-item]
                if total != head_size + size:
                    raise OSError(errno.ENOSPC if total < head_size + size else errno.EIO,
                                  f"short write of {tmp}: {total} bytes")
                if not self.direct:
                    os.fdatasync(fd)  # dirty pages cannot be dropped before they are written
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                crcs.result()  # the helper is done with `data` before the caller reuses it
                os.close(fd)
            os.replace(tmp, final)
        except OSError as err:
            tmp.unlink(missing_ok=True)  # the previous file, if any, stays as it was
            tensors = ", ".join(t for t, _, _ in parts)
            raise TierFileError(tensors, final, f"could not be written ({err.strerror or err})"
                                ) from err
        self.bytes_written += sum(n for _, _, n in parts)
        self.write_seconds += time.perf_counter() - t0

    @staticmethod
    def _head(name: str, size: int, parts: list[tuple[str, int, int]], crcs: list[int],
              head_size: int) -> bytes:
        info = {"file": name, "size": size,
                "parts": [[t, off, n, crc] for (t, off, n), crc in zip(parts, crcs, strict=True)]}
        return MAGIC + f"{head_size:010d}\n".encode() + json.dumps(info).encode()

    def close(self) -> None:
        """Stop the checksum helper thread (idempotent)."""
        self._crc.shutdown(wait=True)

    def read(self, name: str, out: np.ndarray, parts: list[tuple[str, int, int]]) -> None:
        """Read file `name` into out (laid out like `write`'s data) and verify every tensor
        in it before returning; raises TierFileError naming the tensor(s) and the file."""
        t0 = time.perf_counter()
        path = self.path(name)
        size = parts[-1][1] + padded(parts[-1][2])
        tensors = ", ".join(t for t, _, _ in parts)
        try:
            fd = os.open(path, os.O_RDONLY | self._flag())
        except FileNotFoundError:
            raise TierFileError(tensors, path, "is missing") from None
        try:
            got_size = os.fstat(fd).st_size
            first = aligned_buffer(ALIGN)
            # numpy's stubs give ndarray the buffer protocol on Python 3.12+ only
            got = os.preadv(fd, [first], 0)  # type: ignore[list-item]
            head_size = self._head_size(tensors, path, bytes(first[:got]))
            if got_size != head_size + size:
                raise TierFileError(tensors, path, f"has {got_size} bytes; expected "
                                    f"{head_size + size} (truncated or not this state)")
            header = first if head_size == ALIGN else aligned_buffer(head_size)
            if head_size > ALIGN:
                # numpy's stubs give ndarray the buffer protocol on Python 3.12+ only
                os.preadv(fd, [header], 0)  # type: ignore[list-item]
            # In chunks, each checksummed on the helper thread while the next is read.
            crcs, checks, got = [0] * len(parts), [], 0
            for lo in range(0, size, READ_CHUNK):
                hi = min(size, lo + READ_CHUNK)
                # numpy's stubs give ndarray the buffer protocol on Python 3.12+ only
                n = os.preadv(fd, [out[lo:hi]], head_size + lo)  # type: ignore[list-item]
                got += n
                if n != hi - lo:
                    break
                checks.append(self._crc.submit(_crc_update, crcs, parts, out, lo, hi))
            if not self.direct:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        for check in checks:
            check.result()
        if got != size:
            raise TierFileError(tensors, path, f"read {got} of {size} data bytes (truncated)")
        info = self._header(tensors, path, bytes(header))
        stored = {tuple(p[:3]): p[3] for p in info.get("parts", [])}
        for (t, off, n), crc in zip(parts, crcs, strict=True):
            if (t, off, n) not in stored:
                raise TierFileError(t, path, "does not hold this tensor (stale or foreign)")
            if crc != stored[(t, off, n)]:
                raise TierFileError(t, path, "fails its checksum (corrupt)")
        self.bytes_read += sum(n for _, _, n in parts)
        self.read_seconds += time.perf_counter() - t0

    def map(self, name: str, parts: list[tuple[str, int, int]]) -> dict[str, torch.Tensor]:
        """The tensors `parts` of file `name` (as `write` laid them out) as uint8 tensors that
        view the file: mapped copy-on-write, so they cost no memory until read and writing them
        never touches the file, which a later write replaces rather than rewrites, so the views
        keep the values of now. Every tensor's checksum is verified first (a page at a time
        leaves memory again), as `read` does; raises TierFileError naming the tensor and the
        file."""
        path = self.path(name)
        size = parts[-1][1] + padded(parts[-1][2])
        tensors = ", ".join(t for t, _, _ in parts)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise TierFileError(tensors, path, "is missing") from None
        try:
            head_size = self._head_size(tensors, path, os.pread(fd, ALIGN, 0))
            got_size = os.fstat(fd).st_size
            if got_size != head_size + size:
                raise TierFileError(tensors, path, f"has {got_size} bytes; expected "
                                    f"{head_size + size} (truncated or not this state)")
            info = self._header(tensors, path, os.pread(fd, head_size, 0))
            buf = _map_file(fd, head_size + size)
        finally:
            os.close(fd)
        stored = {tuple(p[:3]): p[3] for p in info.get("parts", [])}
        view = memoryview(buf).cast("B")
        out = {}
        for t, off, n in parts:
            if (t, off, n) not in stored:
                raise TierFileError(t, path, "does not hold this tensor (stale or foreign)")
            start = head_size + off
            if zlib.crc32(view[start:start + n]) != stored[(t, off, n)]:
                raise TierFileError(t, path, "fails its checksum (corrupt)")
            _advise(ctypes.addressof(buf) + start, n, _MADV_DONTNEED)  # clean: the file has it
            out[t] = torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=start) if n \
                else torch.empty(0, dtype=torch.uint8)
        self.bytes_read += sum(n for _, _, n in parts)
        return out

    def remove(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def _flag(self) -> int:
        return getattr(os, "O_DIRECT", 0) if self.direct else 0

    @staticmethod
    def _head_size(name: str, path: Path, raw: bytes) -> int:
        if not raw.startswith(MAGIC) or not raw[len(MAGIC):len(MAGIC) + 10].isdigit():
            raise TierFileError(name, path, "has no tier header (corrupt)")
        return int(raw[len(MAGIC):len(MAGIC) + 10])

    @staticmethod
    def _header(name: str, path: Path, raw: bytes) -> dict:
        try:
            return json.loads(raw[len(MAGIC) + 11:].rstrip(b"\0"))
        except ValueError:
            raise TierFileError(name, path, "has an unreadable header (corrupt)") from None


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MADV_DONTNEED = 4  # drop the pages (a private mapping's own changes too: only for clean ones)
_MADV_PAGEOUT = 21  # reclaim the pages, never losing a change (Linux 5.4)


class _Mappings:
    """The address ranges of live `DiskTier.map` mappings, so the checkpoint writer can tell
    which bytes it wrote came from a tier file. A mapping's finalizer only notes it gone (a list
    append, no lock: it may run inside any allocation, even one under this lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._ends: dict[int, int] = {}
        self._gone: list[int] = []

    def add(self, start: int, length: int) -> None:
        with self._lock:
            self._forget_gone()
            bisect.insort(self._starts, start)
            self._ends[start] = start + length

    def gone(self, start: int) -> None:
        self._gone.append(start)

    def holds(self, address: int, nbytes: int) -> bool:
        with self._lock:
            self._forget_gone()
            i = bisect.bisect_right(self._starts, address) - 1
            return i >= 0 and address + nbytes <= self._ends[self._starts[i]]

    def _forget_gone(self) -> None:
        while self._gone:
            start = self._gone.pop()
            if self._ends.pop(start, None) is not None:
                self._starts.pop(bisect.bisect_left(self._starts, start))


_MAPPINGS = _Mappings()


def _map_file(fd: int, length: int) -> ctypes.Array:
    """The first `length` bytes of file `fd`, mapped private and writable (copy on write), as a
    ctypes buffer; unmapped when the buffer and every tensor made from it are gone."""
    addr = _LIBC.mmap(None, length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE, fd, 0)
    if addr in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of a disk-tier file failed: {os.strerror(err)}")
    buf = (ctypes.c_char * length).from_address(addr)
    _MAPPINGS.add(addr, length)
    weakref.finalize(buf, _unmap, addr, length)
    return buf


def _unmap(addr: int, length: int) -> None:
    _MAPPINGS.gone(addr)  # first: a later `holds` no longer finds it
    _LIBC.munmap(addr, length)


def _advise(address: int, nbytes: int, advice: int) -> None:
    """madvise the pages that [address, address + nbytes) touches. Tensors in a tier file start
    and end on 4096-byte boundaries; a neighbour's page caught on a larger page size is clean
    (DONTNEED right after mapping) or kept intact (PAGEOUT), so it is only read again."""
    start = address // mmap.PAGESIZE * mmap.PAGESIZE
    end = -(-(address + nbytes) // mmap.PAGESIZE) * mmap.PAGESIZE
    _LIBC.madvise(start, end - start, advice)  # advice only: a refusal changes nothing


M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc malloc.h)
MMAP_THRESHOLD = 1 << 20


def fix_mmap_threshold() -> None:
    """Allocations of 1 MiB and more get pages of their own, given back when freed (glibc's
    mallopt). By default glibc raises that threshold up to 32 MiB as large blocks are freed,
    after which freed tensors stay in the heap: a process whose state lives on disk, read into
    and written out of buffers step after step, then grows by every step's freed temporaries
    (measured: +100 to +300 MB a step at 28M parameters; flat with a fixed threshold)."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is not None:  # not glibc: nothing to do
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim). State that went to
    disk was freed, but glibc keeps freed blocks below its mmap threshold (which rises to 32 MiB
    as large blocks are freed) in the heap: without this, a process whose state moves to disk a
    parameter at a time keeps most of it resident anyway."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:  # not glibc: nothing to do
        trim(0)


def release_pages(data) -> None:
    """After a checkpoint writer wrote `data` (a buffer): when its bytes are a `DiskTier.map`
    view, take their pages out of this process's memory. MADV_PAGEOUT reclaims them and keeps
    any change a caller made to its copy-on-write view; the file still has the rest."""
    view = memoryview(data)
    if not view.nbytes:
        return
    address = np.frombuffer(view.cast("B"), np.uint8).ctypes.data
    if _MAPPINGS.holds(address, view.nbytes):
        _advise(address, view.nbytes, _MADV_PAGEOUT)


def _crc_update(crcs: list[int], parts: list[tuple[str, int, int]], data: np.ndarray,
                lo: int, hi: int) -> None:
    """Extend each part's running CRC-32 with its bytes in data[lo:hi] (chunks in order)."""
    for i, (_, off, n) in enumerate(parts):
        a, b = max(lo, off), min(hi, off + n)
        if a < b:
            # numpy's stubs give ndarray the buffer protocol on Python 3.12+ only
            crcs[i] = zlib.crc32(data[a:b], crcs[i])  # type: ignore[arg-type]


def check_writable(folder: Path, need_bytes: int, spare_bytes: int = 0) -> str | None:
    """Why the disk tier cannot live in `folder` with `need_bytes` of files, or None when it
    can. A file is rewritten as a new file before the old one goes, so `spare_bytes` (the
    largest file) must be free besides; tier files already there will be replaced, so their
    bytes count as free."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-probe"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        return f"{folder} is not writable ({err.strerror or err})"
    free = os.statvfs(folder)
    avail = free.f_bavail * free.f_frsize + sum(p.stat().st_size for p in folder.glob("*.bin"))
    if avail < need_bytes + spare_bytes:
        return (f"{folder} has {avail} bytes free; the disk tier needs {need_bytes + spare_bytes}"
                f" ({need_bytes} of state and a spare {spare_bytes} for rewriting a file)")
    return None


class _Loaded:
    """The address range of the checkpoint `train.checkpoint.load` mapped last (torch.load with
    mmap=True: one private file mapping whose tensors are views of it). Resuming copies each of
    those tensors out into its own tier, then pushes its pages out of this process again
    (`copy_out`), so the load holds about one tensor of the file in memory, and no state stays a
    view of a file the next save replaces."""

    def __init__(self) -> None:
        self.start = self.end = 0

    def note(self, tensors) -> None:
        spans = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
                 for t in tensors if t.device.type == "cpu" and t.untyped_storage().nbytes()]
        self.start = min((a for a, _ in spans), default=0)
        self.end = max((a + n for a, n in spans), default=0)

    def views(self, t: torch.Tensor) -> bool:
        if t.device.type != "cpu":
            return False
        address = t.untyped_storage().data_ptr()
        return self.start <= address < self.end


LOADED = _Loaded()


def copy_out(t: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """`t` on `device` in memory of its own. A view of the loaded checkpoint is copied and its
    pages leave this process (MADV_PAGEOUT: a clean file page is dropped, and should the range
    ever be ordinary memory, it keeps its bytes)."""
    out = t.to(device)
    if LOADED.views(t):
        if out is t:
            out = t.clone()
        storage = t.untyped_storage()
        _advise(storage.data_ptr(), storage.nbytes(), _MADV_PAGEOUT)
    return out


def release_loaded(t: torch.Tensor) -> None:
    """Once `t`, a view of the loaded checkpoint, was copied from: its pages out of memory."""
    if LOADED.views(t):
        storage = t.untyped_storage()
        _advise(storage.data_ptr(), storage.nbytes(), _MADV_PAGEOUT)
