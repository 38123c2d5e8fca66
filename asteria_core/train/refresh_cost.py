"""What one block's refresh costs on this host: measured, cached, and extrapolated (labelled).

`asteria plan` needs the seconds one refresh of a (b, b) block takes on a host worker. They are
measured the way the runtime runs them: a real thread worker (`refresh.workers.make_pool`,
`worker_threads` intra-op threads, as a worker sets them) runs `checked_refresh(refresh_fn)`, the
very callable the refresh engine hands its workers, on a warm-started snapshot (the steady-state
refresh, not the first eigh), with the optimizer's own `RefreshConfig` for that block. Dims up to
`MEASURE_CAP` are measured (a second or two in all); wider ones are extrapolated as b^3 from the
widest measured dim and marked as estimates. Measurements are kept in a JSON file (by default
under the user's cache folder), keyed by everything that changes them: the refresh config, the
threads per worker, torch's version and the CPU.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
import os
import platform
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from asteria_core.optim.seam import (
    BlockKey,
    FactorSnapshot,
    RefreshConfig,
    checked_refresh,
    refresh_fn,
)
from asteria_core.refresh.workers import Job, make_pool
from asteria_core.validation import ConfigError

MEASURE_CAP = 1024
"""Widest block measured; wider ones are extrapolated (a 4096 refresh takes seconds on a core)."""
MIN_RUNS, MAX_RUNS, RUN_BUDGET_S, WIDE_BUDGET_S = 3, 9, 0.3, 2.0
"""Per dim: timed refreshes until MAX_RUNS or RUN_BUDGET_S seconds, and at least MIN_RUNS
unless they took WIDE_BUDGET_S already (a 3072-wide refresh takes seconds: one or two runs);
the median is kept."""
WARM_UP_SIDE = 64
"""One refresh of this side first warms the worker's BLAS and allocator up."""
CUBIC = 3.0
"""Exponent of the extrapolation above the widest measured dim (eigh, QR and products are b^3)."""


def default_cache_path() -> Path:
    """$XDG_CACHE_HOME/asteria/refresh-cost.json (~/.cache/asteria/... without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "asteria" / "refresh-cost.json"


def host_key(config: RefreshConfig, threads: int) -> str:
    """What a measurement depends on besides the dim, as one string."""
    return json.dumps({"config": dataclasses.asdict(config), "threads": threads,
                       "torch": torch.__version__, "cpu": _cpu_name(),
                       "machine": platform.machine()}, sort_keys=True)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass
class RefreshCost:
    """Seconds of one refresh per block side b: measured where it can, else an estimate."""

    measured: dict[int, float] = field(default_factory=dict)
    """b -> median seconds of one refresh on one worker, measured on this host."""
    estimates: dict[int, float] = field(default_factory=dict)
    """b -> seconds worked out elsewhere (another cost's extrapolation): estimates."""

    def __post_init__(self) -> None:
        self.measured = {int(b): float(s) for b, s in self.measured.items()}
        self.estimates = {int(b): float(s) for b, s in self.estimates.items()}
        for b, s in (self.measured | self.estimates).items():
            if b < 1 or not math.isfinite(s) or s <= 0:
                raise ConfigError(f"refresh cost: got {s!r} s for b = {b}; allowed: a "
                                  "positive number of seconds for a block side >= 1")

    def is_estimate(self, b: int) -> bool:
        return b not in self.measured

    def seconds(self, b: int) -> float:
        """Measured, else interpolated in log-log between the measured dims around b, else
        extrapolated (b^3 above the widest, the first segment's slope below the narrowest)."""
        if b in self.measured:
            return self.measured[b]
        if b in self.estimates:
            return self.estimates[b]
        if not self.measured:
            raise ValueError("refresh cost: nothing measured")
        dims = sorted(self.measured)
        if len(dims) == 1 or b > dims[-1]:
            top = dims[-1]
            return self.measured[top] * (b / top) ** CUBIC
        i = bisect.bisect_left(dims, b)
        lo, hi = (dims[0], dims[1]) if i == 0 else (dims[i - 1], dims[i])
        slope = math.log(self.measured[hi] / self.measured[lo]) / math.log(hi / lo)
        return self.measured[lo] * (b / lo) ** slope

    @classmethod
    def of(cls, cost: RefreshCost | Mapping[int, float]) -> RefreshCost:
        return cost if isinstance(cost, RefreshCost) else cls(dict(cost))


# ------------------------------------------------------------------------------ measuring
def warm_snapshot(b: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> FactorSnapshot:
    """A (b, b) factor Q diag(lambda) Q^T with decaying eigenvalues and its eigenbasis as the
    basis in use (version 1): the refresh a worker runs at every round after the first."""
    gen = torch.Generator().manual_seed(seed)
    q_bb, _ = torch.linalg.qr(torch.randn(b, b, generator=gen, dtype=torch.float64))
    eigenvalues = torch.logspace(0, -4, b, dtype=torch.float64)
    factor_bb = (q_bb * eigenvalues) @ q_bb.T
    return FactorSnapshot(key=BlockKey(0, 0, 0), stats_step=1, base_version=1,
                          factor=factor_bb.to(dtype), basis=q_bb.to(dtype).contiguous())


def measure(dims: Iterable[int], config: RefreshConfig, threads: int = 1) -> dict[int, float]:
    """b -> median seconds of `checked_refresh(refresh_fn)` on one thread worker with `threads`
    intra-op threads, as the engine's workers run it."""
    dims = sorted(set(dims))
    if not dims:
        return {}
    pool = make_pool("thread", 1, partial(checked_refresh, refresh_fn), threads, 0)
    out: dict[int, float] = {}
    try:
        _run(pool, warm_snapshot(WARM_UP_SIDE), config)
        for b in dims:
            snapshot = warm_snapshot(b)
            runs = [_run(pool, snapshot, config)]
            while len(runs) < MAX_RUNS and (sum(runs) < RUN_BUDGET_S or (
                    len(runs) < MIN_RUNS and sum(runs) < WIDE_BUDGET_S)):
                runs.append(_run(pool, snapshot, config))
            out[b] = statistics.median(runs)
    finally:
        pool.close()
    return out


def _run(pool, snapshot: FactorSnapshot, config: RefreshConfig) -> float:
    job = Job(snapshot, config, priority=(0,))
    pool.submit(job)
    job.done.wait()
    if job.error is not None:
        raise RuntimeError(f"calibration refresh of a {snapshot.factor.shape[0]}-wide block "
                           f"failed: {job.error.strip().splitlines()[-1]}")
    return job.seconds


def dims_to_measure(sizes: Iterable[int], cap: int = MEASURE_CAP) -> list[int]:
    """The sizes a plan needs that are at most `cap`, and `cap` itself when a wider one is
    needed (the anchor of the extrapolation)."""
    sizes = set(sizes)
    wanted = {b for b in sizes if b <= cap}
    if any(b > cap for b in sizes):
        wanted.add(cap)
    return sorted(wanted)


# ------------------------------------------------------------------------------ the cache file
def read_cache(path: Path) -> dict[str, dict[str, float]]:
    """{host key: {b: seconds}}; {} when the file does not exist. ConfigError naming the file
    when it is not such a JSON object."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"calibration: cannot read {str(path)!r} ({err}); allowed: a JSON file "
                          "written by asteria plan, or a path that does not exist yet") from err
    ok = isinstance(data, dict) and all(
        isinstance(v, dict) and all(str(b).isdigit() and isinstance(s, int | float)
                                    for b, s in v.items()) for v in data.values())
    if not ok:
        raise ConfigError(f"calibration: {str(path)!r} is not a calibration file; allowed: a "
                          "JSON object {host key: {block side: seconds}} written by asteria plan")
    return data


def calibrate(sizes: Iterable[int], config: RefreshConfig, threads: int = 1, *,
              path: Path | None = None, recalibrate: bool = False,
              cap: int = MEASURE_CAP) -> tuple[RefreshCost, list[int]]:
    """The refresh cost of the block `sizes` on this host, and the dims measured just now (the
    rest came from the cache at `path`, which gets the new ones; None: no cache)."""
    key = host_key(config, threads)
    cache = read_cache(path) if path is not None else {}
    known = {} if recalibrate else {int(b): s for b, s in cache.get(key, {}).items()}
    missing = [b for b in dims_to_measure(sizes, cap) if b not in known]
    known.update(measure(missing, config, threads))
    if path is not None and missing:
        cache[key] = {str(b): s for b, s in sorted(known.items())}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        tmp.replace(path)
    return RefreshCost(known), missing
