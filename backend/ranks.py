"""Every rank of a data-parallel run, seen from rank 0's control plane (GET /runs/{id}/ranks).

Rank 0's figures come from its own telemetry; every other rank's from its own /metrics, the
address it wrote in its file_sd target `<data dir>/targets/asteria-rank<r>.yml`
(`asteria_core.distributed.serve_rank_metrics`, the file Prometheus reads too). The ranks keep
serving their own numbers (no collective per read); rank 0 only reads them when asked.

What a request can steer: nothing but the run id. The folder is the data dir's `targets/`, the
file names are `asteria-rank<r>.yml` for r < the run's world size, the URL is built here as
`http://<host>:<port>/metrics` from a target that must be exactly `host:port` (no scheme, path,
query or user), redirects are not followed and proxies from the environment are not used. The
address may be any host: in a run over several nodes a rank advertises its own node's address,
and the file is the operator's (the same trust as the run store and the token file beside it).
Bounded: at most MAX_RANKS ranks, a target file read up to MAX_TARGET_BYTES as plain YAML
(no anchors or aliases, MAX_TARGET_NODES values at most) and parsed again only when it
changes, each scrape
SCRAPE_SECONDS and MAX_METRICS_BYTES at most, SCRAPE_WORKERS at a time, and a rank scraped at
most once per CACHE_SECONDS however many clients ask. A rank that does not answer, answers
something that is not a Prometheus exposition, or serves another run is shown as such; it is
never an error of the endpoint.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, Field

from asteria_core.distributed.metrics import TARGET_FILE
from asteria_core.runtime import Runtime
from asteria_core.telemetry.labels import IDLE_CAUSES, IdleCause

TARGETS_DIR = "targets"
MAX_RANKS = 128
"""Ranks shown; a larger run lists its first MAX_RANKS (`truncated`)."""
STACK_ORDER = (IdleCause.SYNC_WAIT.value,
               *(c for c in IDLE_CAUSES if c != IdleCause.SYNC_WAIT))
MAX_TARGET_BYTES = 16 * 1024
MAX_TARGET_DEPTH = 8
MAX_TARGET_NODES = 256
"""A rank's target file is a list of one group: about ten values, three levels deep."""
MAX_METRICS_BYTES = 1024 * 1024
"""A rank's exposition is a few kB; anything past this is cut off and the rank not shown."""
SCRAPE_SECONDS = 2.0
SCRAPE_WORKERS = 16
CACHE_SECONDS = 1.0
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]{2,45}\]")
"""A host name, an IPv4 or a bracketed IPv6 address: nothing that could add to the URL."""
HEADERS = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "identity",
           "User-Agent": "asteria-control-plane"}


class RankFigures(BaseModel):
    """One rank's figures, read from its Prometheus exposition (docs/metrics.md)."""

    step: int | None = Field(None, description="Steps done (asteria_steps_total).")
    idle_seconds: dict[str, float] = Field(
        default_factory=dict, description="Seconds waited since the start, by cause "
        "(asteria_device_idle_seconds_total): " + ", ".join(IDLE_CAUSES) + ".")
    staleness: int | None = Field(None, description="Largest block staleness at the last "
                                  "step (asteria_preconditioner_staleness_max_steps).")
    staleness_bound: int | None = Field(None, description="The bound S in force "
                                        "(asteria_policy_staleness_bound_steps).")
    refreshes: int | None = Field(None, description="Refreshes this rank ran "
                                  "(asteria_refresh_seconds_count).")
    refresh_failures: int | None = Field(None, description="asteria_refresh_failures_total.")
    refresh_seconds: float | None = Field(None, description="Refresh work: seconds spent "
                                          "refreshing (asteria_refresh_seconds_sum).")
    background_load: float | None = Field(None, description="asteria_refresh_background_load.")
    queue_depth: int | None = Field(None, description="asteria_refresh_queue_depth.")
    owned_blocks: int | None = Field(None, description="asteria_distributed_owned_blocks.")
    bytes_sent: int | None = Field(None, description="Logical bytes this rank's optimizer "
                                   "collectives sent: bases, headers, policy sync "
                                   "(asteria_distributed_exchange_bytes_total, sent).")
    bytes_received: int | None = Field(None, description="Logical bytes this rank's optimizer "
                                       "collectives received "
                                       "(asteria_distributed_exchange_bytes_total, received).")


class RankPublic(BaseModel):
    rank: int
    node: int | None = Field(description="The node it runs on (as the rank reports it).")
    source: str = Field(description="`control plane`: rank 0's own telemetry; `scrape`: the "
                        "rank's /metrics.")
    address: str | None = Field(description="host:port of its /metrics, from its target file "
                                "(token holders only; null for rank 0 and anonymous reads).")
    reachable: bool = Field(description="Its figures could be read.")
    error: str | None = Field(description="Why not (or why they were not used); anonymous reads "
                              "see the reason's kind only.")
    figures: RankFigures | None = None


class RanksPublic(BaseModel):
    run_id: str
    data_parallel: bool
    world: int = Field(description="Ranks in the run (1 for a single-process run).")
    truncated: bool = Field(False, description=f"More than {MAX_RANKS} ranks: the first "
                            f"{MAX_RANKS} are listed.")
    detail: str = Field(description="What the list holds, or why it is empty.")
    read_at: float = Field(description="Unix time the figures were read.")
    ranks: list[RankPublic]
    idle_causes: list[str] = Field(
        default_factory=lambda: list(STACK_ORDER),
        description="The causes of each rank's idle_seconds, in the order a stacked chart "
                    "shows them: sync_wait (the data-parallel wait) first, at the bottom.")


# ---------------------------------------------------------------------- target files
class TargetRefused(ValueError):
    """A target file that is not plain, small data."""


def load_target(text: str) -> Any:
    """A target file's YAML as plain data. Its events are checked before anything is built:
    anchors and aliases are refused (a few hundred bytes of nested aliases stand for billions
    of values, which whoever walks them then builds: a billion laughs), and so is nesting deeper
    than MAX_TARGET_DEPTH or more than MAX_TARGET_NODES values; what passes is small."""
    depth = nodes = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise TargetRefused("uses YAML anchors or aliases")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_TARGET_DEPTH:
                raise TargetRefused(f"nests deeper than {MAX_TARGET_DEPTH} levels")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        if isinstance(event, yaml.NodeEvent):
            nodes += 1
            if nodes > MAX_TARGET_NODES:
                raise TargetRefused(f"holds more than {MAX_TARGET_NODES} values")
    return yaml.safe_load(text)


def read_target(folder: Path, rank: int) -> tuple[str | None, str | None]:
    """(host:port, None) from rank `rank`'s file_sd target file, or (None, why not)."""
    name = f"{TARGETS_DIR}/{TARGET_FILE.format(rank=rank)}"
    path = folder / TARGET_FILE.format(rank=rank)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_TARGET_BYTES + 1)
    except FileNotFoundError:
        return None, (f"no target file: {name} is missing (the rank writes it when it serves "
                      "its /metrics)")
    except OSError as err:
        return None, f"target file: cannot read {name} ({type(err).__name__})"
    if len(raw) > MAX_TARGET_BYTES:
        return None, f"target file: {name} is larger than {MAX_TARGET_BYTES} bytes"
    try:
        groups = load_target(raw.decode("utf-8"))
    except TargetRefused as err:
        return None, f"target file: {name} {err}"
    except Exception as err:  # YAMLError, UnicodeDecodeError, ValueError (a huge integer)
        return None, f"target file: {name} is not YAML ({type(err).__name__})"
    return _target(groups, rank, name)


class TargetFiles:
    """The ranks' target files, each parsed again only when it changes (its mtime, size or
    inode: serve_rank_metrics replaces the file whole), so polling the view costs a stat per
    rank, not a parse."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._read: dict[int, tuple[tuple[int, int, int], tuple[str | None, str | None]]] = {}
        """rank -> (the file's (mtime, size, inode) when read, what it said)."""

    def address(self, rank: int) -> tuple[str | None, str | None]:
        """(host:port, None) from rank `rank`'s target file, or (None, why not)."""
        try:
            stat = (self.folder / TARGET_FILE.format(rank=rank)).stat()
        except OSError:
            return read_target(self.folder, rank)  # says why, without caching
        key = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        with self._lock:
            cached = self._read.get(rank)
        if cached is not None and cached[0] == key:
            return cached[1]
        answer = read_target(self.folder, rank)
        with self._lock:
            self._read[rank] = (key, answer)
        return answer


def _target(groups: Any, rank: int, name: str) -> tuple[str | None, str | None]:
    bad = f"target file: {name} is not a file_sd list of one target with rank \"{rank}\""
    if not isinstance(groups, list):
        return None, bad
    found = []
    for group in groups:
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            return None, bad
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or str(labels.get("rank")) != str(rank):
            continue
        found.extend(group["targets"])
    if len(found) != 1 or not isinstance(found[0], str):
        return None, bad
    return _address(found[0], name)


def _address(target: str, name: str) -> tuple[str | None, str | None]:
    host, sep, port = target.rpartition(":")
    digits = port.isascii() and port.isdigit()
    if len(target) > 300 or not sep or not HOST.fullmatch(host) or not digits or \
            not 0 < int(port) < 65536:
        return None, f"target file: {name} names {target[:80]!r}, not host:port"
    return f"{host}:{int(port)}", None


# ---------------------------------------------------------------------- scraping
def scrape(http: httpx.Client, address: str) -> tuple[str | None, str | None]:
    """(exposition text, None) from http://<address>/metrics, or (None, why not)."""
    deadline = time.monotonic() + SCRAPE_SECONDS
    try:
        with http.stream("GET", f"http://{address}/metrics") as response:
            if response.status_code != 200:
                return None, f"unexpected answer: HTTP {response.status_code}"
            body = bytearray()
            for chunk in response.iter_raw():
                body += chunk
                if len(body) > MAX_METRICS_BYTES:
                    return None, f"answer too large: over {MAX_METRICS_BYTES} bytes"
                if time.monotonic() > deadline:
                    return None, f"timed out: the answer took over {SCRAPE_SECONDS:g} s"
    except httpx.TimeoutException:
        return None, f"timed out: no answer within {SCRAPE_SECONDS:g} s"
    except Exception as err:  # refused, reset, bad name (httpx.InvalidURL, UnicodeError), ...
        return None, f"unreachable: {type(err).__name__}: {str(err)[:200]}"
    try:
        return body.decode("utf-8"), None
    except UnicodeDecodeError:
        return None, "not a Prometheus exposition: not UTF-8"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _int(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else int(value)


@dataclass
class Parsed:
    figures: RankFigures
    run_id: str | None
    rank: int | None
    node: int | None


def parse(text: str) -> tuple[Parsed | None, str | None]:
    """The figures of one exposition (only the names and label values the view knows, so a
    hostile answer cannot make the response large), or (None, why not)."""
    plain: dict[str, float] = {}
    idle: dict[str, float] = {}
    moved: dict[str, float] = {}
    run_ids: list[str] = []
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "asteria_device_idle_seconds_total":
                    if s.labels.get("cause") in IDLE_CAUSES:
                        idle[s.labels["cause"]] = s.value
                elif s.name == "asteria_distributed_exchange_bytes_total":
                    moved[s.labels.get("direction", "")] = s.value
                elif s.name == "asteria_run_info":
                    run_ids.append(s.labels.get("run_id", ""))
                elif s.name in WANTED and not s.labels:
                    plain[s.name] = s.value
    except Exception as err:  # the parser raises several kinds on input that is not its format
        return None, f"not a Prometheus exposition ({type(err).__name__})"
    if "asteria_steps_total" not in plain:
        return None, "not an Asteria exposition: no asteria_steps_total"
    get = plain.get
    figures = RankFigures(
        step=_int(get("asteria_steps_total")),
        idle_seconds={c: v for c, v in idle.items() if _finite(v) is not None},
        staleness=_int(get("asteria_preconditioner_staleness_max_steps")),
        staleness_bound=_int(get("asteria_policy_staleness_bound_steps")),
        refreshes=_int(get("asteria_refresh_seconds_count")),
        refresh_failures=_int(get("asteria_refresh_failures_total")),
        refresh_seconds=_finite(get("asteria_refresh_seconds_sum", math.nan)),
        background_load=_finite(get("asteria_refresh_background_load", math.nan)),
        queue_depth=_int(get("asteria_refresh_queue_depth")),
        owned_blocks=_int(get("asteria_distributed_owned_blocks")),
        bytes_sent=_int(moved.get("sent")), bytes_received=_int(moved.get("received")))
    return Parsed(figures, run_ids[0][:200] if len(run_ids) == 1 else None,
                  _int(get("asteria_distributed_rank")),
                  _int(get("asteria_distributed_node"))), None


WANTED = frozenset((
    "asteria_steps_total", "asteria_preconditioner_staleness_max_steps",
    "asteria_policy_staleness_bound_steps", "asteria_refresh_seconds_count",
    "asteria_refresh_seconds_sum", "asteria_refresh_failures_total",
    "asteria_refresh_background_load", "asteria_refresh_queue_depth",
    "asteria_distributed_owned_blocks", "asteria_distributed_rank", "asteria_distributed_node"))


# ---------------------------------------------------------------------- the view
def _entry(rank: int, source: str, address: str | None, parsed: Parsed | None,
           error: str | None, run_id: str) -> RankPublic:
    if parsed is not None and error is None:
        if parsed.run_id is not None and parsed.run_id != run_id:
            error = f"wrong run: it serves run {parsed.run_id!r}, not {run_id!r}"
        elif parsed.rank is not None and parsed.rank != rank:
            error = f"wrong rank: it serves rank {parsed.rank}'s figures"
    shown = parsed if error is None else None
    return RankPublic(rank=rank, node=shown.node if shown is not None else None, source=source,
                      address=address, reachable=shown is not None, error=error,
                      figures=shown.figures if shown is not None else None)


class RankScraper:
    """Reads every rank's figures for the control plane; one instance per app. Scrapes run on a
    small thread pool; a rank's answer is reused for CACHE_SECONDS, so many dashboards polling
    cost each rank one scrape a second at most."""

    def __init__(self, targets_dir: Path) -> None:
        self.targets_dir = targets_dir
        self.targets = TargetFiles(targets_dir)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Parsed | None, str | None]] = {}
        """address -> (when, its figures, why none): parsed, so it stays small."""

    def view(self, run_id: str, runtime: Runtime | None) -> RanksPublic:
        now = time.time()
        if runtime is None:
            return RanksPublic(run_id=run_id, data_parallel=False, world=1, read_at=now,
                               ranks=[], detail=f"run {run_id} is not active: the ranks' "
                               "figures are read live while a data-parallel run trains")
        world = runtime.world
        if world <= 1:
            return RanksPublic(run_id=run_id, data_parallel=False, world=1, read_at=now,
                               ranks=[], detail="a single-process run: one rank, whose figures "
                               "are the run's own (steps, /metrics)")
        shown = min(world, MAX_RANKS)
        telemetry = getattr(runtime, "telemetry", None)
        if telemetry is not None:
            text = telemetry.exposition()[0].decode("utf-8")
            parsed, error = parse(text)
        else:
            parsed, error = None, "telemetry is off on rank 0"
        ranks = [_entry(0, "control plane", None, parsed, error, run_id)]
        addresses = {r: self.targets.address(r) for r in range(1, shown)}
        answers = self._scrape(a for a, _ in addresses.values() if a is not None)
        for r, (address, error) in addresses.items():
            parsed, error = answers[address] if address is not None else (None, error)
            ranks.append(_entry(r, "scrape", address, parsed, error, run_id))
        down = sum(not r.reachable for r in ranks)
        return RanksPublic(
            run_id=run_id, data_parallel=True, world=world, truncated=world > shown,
            read_at=now, ranks=ranks,
            detail=f"{world} ranks" + (f", the first {shown} listed" if world > shown else "")
            + (f"; {down} without figures" if down else "; every rank answered"))

    def _scrape(self, addresses: Iterable[str]) -> dict[str, tuple[Parsed | None, str | None]]:
        with self._lock:  # one round at a time: concurrent readers share its answers
            now = time.monotonic()
            self._cache = {a: v for a, v in self._cache.items() if now - v[0] < CACHE_SECONDS}
            todo = sorted({a for a in addresses if a not in self._cache})
            if todo:
                for address, answer in zip(todo, _scrape_all(todo), strict=True):
                    self._cache[address] = (time.monotonic(), *answer)
            return {a: (parsed, error) for a, (_, parsed, error) in self._cache.items()}


def fetch(http: httpx.Client, address: str) -> tuple[Parsed | None, str | None]:
    """One rank's figures from its /metrics, or (None, why not)."""
    text, error = scrape(http, address)
    return parse(text) if text is not None else (None, error)


def _scrape_all(addresses: list[str]) -> list[tuple[Parsed | None, str | None]]:
    """Scrape on a small pool, within one deadline for the round: a scrape still running then
    (a host name whose lookup hangs, which no socket timeout covers) counts as timed out and
    is left to end on its own."""
    workers = min(SCRAPE_WORKERS, len(addresses))
    deadline = SCRAPE_SECONDS * math.ceil(len(addresses) / workers) + 1.0
    http = httpx.Client(timeout=httpx.Timeout(SCRAPE_SECONDS), follow_redirects=False,
                        trust_env=False, headers=HEADERS)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="asteria-rank-scrape")
    try:
        futures = [pool.submit(fetch, http, a) for a in addresses]
        done, _ = wait(futures, timeout=deadline)
        late = (None, f"timed out: no answer within {SCRAPE_SECONDS:g} s")
        return [f.result() if f in done else late for f in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        http.close()


def anonymous(view: RanksPublic) -> RanksPublic:
    """What a read without the token sees: no addresses, and each error's kind only."""
    ranks = [r.model_copy(update={"address": None,
                                  "error": r.error.split(":", 1)[0] if r.error else None})
             for r in view.ranks]
    return view.model_copy(update={"ranks": ranks})
