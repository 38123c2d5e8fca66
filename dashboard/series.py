"""Step records -> chart-ready tables: pure functions and one bounded buffer, no Streamlit.

A step record (GET /runs/{id}/steps) is flattened into a compact row when it arrives; a run's
rows live in a `StepBuffer` whose size is bounded however long the run: when it fills up, the
older part is thinned to every second row (the recent part stays at full resolution), so a
long live view keeps the whole curve at a coarser grain and memory stays flat.

Figures are read from the record's typed sections (timing, refresh, tiers, energy) by the names
asteria_core/telemetry/records.py gives them; a figure that is absent from every record is "not
reported by this run", never drawn as zeros.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pandas as pd

MEASURED = ("nvml", "rapl")
"""Energy sources that measure; `model` is an estimate (CPU seconds x configured watts)."""
# (record section, figure) -> row column. The names are those of the step record's sections
# (asteria_core/telemetry/records.py, docs/metrics.md): one name per figure, no aliases.
SCALARS = {
    ("refresh", "staleness_max"): "staleness_max",
    ("refresh", "staleness_bound"): "staleness_bound",
    ("refresh", "queue_depth"): "queue_depth",
    ("refresh", "background_load"): "background_load",
    ("refresh", "swap_lead"): "lead",
    ("refresh", "refresh_latency_steps"): "refresh latency p90",
    ("refresh", "workers_busy_ratio"): "workers_busy",
    ("timing", "device_busy_ratio"): "busy_ratio",
}
DICTS = {("timing", "idle_seconds"): "idle_", ("energy", "joules"): "joules_",
         ("tiers", "bytes"): "tier_", ("tiers", "capacity_bytes"): "cap_"}
CUMULATIVE_PREFIXES = ("joules_",)
POWER_WINDOW_S = 1.0
"""Power is drawn from energy readings at least this far apart."""


def compact(record: dict[str, Any], tokens_before: int) -> dict[str, Any]:
    """One step record as a flat row (what the charts need, nothing else)."""
    row = {k: record.get(k) for k in ("step", "time", "loss", "eval_loss", "lr", "tokens",
                                      "step_seconds", "policy_version")}
    row["tokens_total"] = tokens_before + int(record.get("tokens") or 0)
    timing = record.get("timing") or {}
    for name, value in (timing.get("compute_seconds") or record.get("phase_seconds") or
                        {}).items():
        row[f"phase_{name}"] = value
    for (section, key), prefix in DICTS.items():
        for name, value in ((record.get(section) or {}).get(key) or {}).items():
            row[prefix + name] = value
    for (section, key), column in SCALARS.items():
        value = (record.get(section) or {}).get(key)
        if value is not None:
            row[column] = value
    return row


class StepBuffer:
    """A run's rows, fed incrementally (`since` = last_step), bounded by `max_rows`."""

    def __init__(self, max_rows: int = 6000, keep_recent: int = 2000) -> None:
        if not 0 < keep_recent < max_rows:
            raise ValueError(f"keep_recent: got {keep_recent}; allowed: 0 < keep_recent < "
                             f"max_rows ({max_rows})")
        self.max_rows = max_rows
        self.keep_recent = keep_recent
        self.rows: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.last_step = 0
        self.tokens_total = 0
        self.staleness: Counter[tuple[int, int]] = Counter()
        """Steps per (staleness max, bound in force at that step), over every record seen:
        exact however the rows are thinned, and small (a few distinct values)."""

    def extend(self, records: list[dict[str, Any]]) -> int:
        """Add records newer than last_step; returns how many were new."""
        added = 0
        for record in records:
            if record["step"] <= self.last_step:
                continue
            row = compact(record, self.tokens_total)
            self.tokens_total = row["tokens_total"]
            self.last_step = record["step"]
            self.rows.append(row)
            if row.get("staleness_max") is not None and row.get("staleness_bound") is not None:
                self.staleness[(row["staleness_max"], row["staleness_bound"])] += 1
            if row.get("eval_loss") is not None:
                self.evals.append(row)
            added += 1
        while len(self.rows) > self.max_rows:  # a page can be larger than the room left
            old, recent = self.rows[:-self.keep_recent], self.rows[-self.keep_recent:]
            self.rows = old[::2] + recent
        while len(self.evals) > self.max_rows // 4:
            self.evals = self.evals[::2]
        return added


def frame(buffer: StepBuffer) -> pd.DataFrame:
    """All rows as a table, with `elapsed`: wall-clock seconds since the run's first step began."""
    df = pd.DataFrame(buffer.rows)
    if df.empty:
        return df
    evals = pd.DataFrame(buffer.evals)
    if not evals.empty:  # thinning may have dropped an eval row from rows; put it back
        df = pd.concat([df, evals[~evals["step"].isin(df["step"])]]).sort_values("step")
    first = df.iloc[0]
    t0 = first["time"] - (first["step_seconds"] or 0.0)
    df["elapsed"] = df["time"] - t0
    return df.reset_index(drop=True)


def columns(df: pd.DataFrame, prefix: str, order: tuple[str, ...] = ()) -> list[str]:
    """Columns with data whose name starts with prefix; those named in `order` come first, the
    rest in the records' own order (phases, causes and tiers as the runtime lists them)."""
    found = [c for c in df.columns if c.startswith(prefix) and df[c].notna().any()]
    rank = {prefix + name: i for i, name in enumerate(order)}
    return sorted(found, key=lambda c: rank.get(c, len(rank)))


def binned(df: pd.DataFrame, max_points: int = 400) -> pd.DataFrame:
    """At most max_points rows: means per step bin, last value for cumulative figures."""
    if len(df) <= max_points:
        return df
    bins = (df["step"] - df["step"].min()) * max_points // (df["step"].max() - df["step"].min()
                                                           + 1)
    last = ["step", "time", "elapsed", "tokens_total"] + [
        c for c in df.columns if c.startswith(CUMULATIVE_PREFIXES)]
    agg = {c: ("last" if c in last else "mean") for c in df.columns
           if c in last or pd.api.types.is_numeric_dtype(df[c])}
    return df.groupby(bins).agg(agg).reset_index(drop=True)


def long(df: pd.DataFrame, cols: list[str], prefix: str = "") -> pd.DataFrame:
    """Wide -> long (step, elapsed, series, value, order) for stacked and multi-line charts;
    `order` is the column's place in `cols` (a stack draws the first at the bottom)."""
    out = df[["step", "elapsed", *cols]].melt(id_vars=["step", "elapsed"], var_name="series",
                                               value_name="value").dropna(subset=["value"])
    out["order"] = out["series"].map({c: i for i, c in enumerate(cols)})
    out["series"] = out["series"].str.removeprefix(prefix)
    return out


def spaced(elapsed: pd.Series, gap: float) -> list[bool]:
    """Which of the (increasing) times to keep: the first, then each at least `gap` after the
    last one kept."""
    keep, last = [], None
    for t in elapsed:
        keep.append(last is None or t - last >= gap)
        if keep[-1]:
            last = t
    return keep


def energy(df: pd.DataFrame) -> pd.DataFrame:
    """Per source: cumulative joules, power (W) and joules per token, long form."""
    parts = []
    for col in columns(df, "joules_"):
        source = col.removeprefix("joules_")
        d = df[["step", "elapsed", "tokens_total", col]].dropna().rename(columns={col: "joules"})
        # Measured meters are read every few steps (telemetry.energy_poll_seconds): power is
        # the energy difference between successive readings over their time, not between
        # steps. The estimate is credited at every step's end, so each step is a reading; a
        # record's time is stamped a moment after its reading (another thread may hold the
        # GIL in between), which over a step of a few ms would show power no machine draws,
        # so readings at least POWER_WINDOW_S apart are taken.
        polls = d[d["joules"].diff().fillna(1.0) != 0]
        polls = polls[spaced(polls["elapsed"], POWER_WINDOW_S)]
        dt = polls["elapsed"].diff()
        d["watts"] = (polls["joules"].diff() / dt).where(dt > 0)
        d["joules_per_token"] = d["joules"] / d["tokens_total"]
        d["source"] = source
        d["kind"] = "measured" if source in MEASURED else "estimate"
        parts.append(d)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def energy_parts(sources: list[str]) -> list[str]:
    """The sources a run's energy sums, as runs are compared: its device part (nvml) and its
    host part (rapl where measured, else the model estimate)."""
    host = next((s for s in ("rapl", "model") if s in sources), None)
    return [s for s in ("nvml", host) if s is not None and s in sources]


def source_note(sources: list[str]) -> str:
    kinds = [f"{s} ({'measured' if s in MEASURED else 'estimate'})" for s in sources]
    return "energy source: " + ", ".join(kinds)


def markers(history: list[dict[str, Any]], df: pd.DataFrame) -> pd.DataFrame:
    """One row per applied policy change: its effective step, wall-clock position and label."""
    rows = []
    for change in sorted(history, key=lambda c: c["version"]):
        diff = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in change["diff"].items())
        text = diff or "(no field changed)"
        if change.get("client") == "autopilot":  # its decisions say why, on every marker
            text += f" (autopilot: {change.get('reason') or 'no reason given'})"
        rows.append({"step": change["effective_step"], "version": change["version"],
                     "label": f"v{change['version']}", "text": text,
                     "applied_at": change.get("applied_at")})
    out = pd.DataFrame(rows, columns=["step", "version", "label", "text", "applied_at"])
    if out.empty or df.empty:
        out["elapsed"] = pd.Series(dtype=float)
        return out
    t0 = df["time"].iloc[0] - df["elapsed"].iloc[0]
    steps, elapsed = df["step"].to_numpy(), df["elapsed"].to_numpy()
    first = steps.searchsorted(out["step"].to_numpy())  # first recorded step >= effective step
    out["elapsed"] = [elapsed[i] if i < len(steps) else (a - t0 if a else None)
                      for i, a in zip(first, out["applied_at"], strict=True)]
    return out


def bound_by_step(history: list[dict[str, Any]], current: int, steps: pd.Series) -> pd.Series:
    """The staleness bound in force at each step, rebuilt from the audited changes."""
    changes = sorted((c for c in history if "staleness_bound" in c["diff"]),
                     key=lambda c: c["version"])
    first = changes[0]["diff"]["staleness_bound"][0] if changes else current
    bound = pd.Series(first, index=steps.index, dtype=float)
    for change in changes:
        bound[steps >= change["effective_step"]] = change["diff"]["staleness_bound"][1]
    return bound


WITHIN, OVER = "within its bound", "over its bound"


def staleness_distribution(buffer: StepBuffer) -> pd.DataFrame:
    """Steps per staleness max, each judged against the bound in force at that step.

    A record's `refresh` section is the state after its boundary: its staleness max and its
    staleness bound are both what the next step sees, so each step is compared with its own
    bound, never with the bound in force now (after S went 10 -> 6, a step at 8 under S = 10 was
    within its bound). Columns: staleness, verdict (WITHIN or OVER), steps; by staleness.
    """
    counts: Counter[tuple[int, str]] = Counter()
    for (value, bound), steps in buffer.staleness.items():
        counts[(value, OVER if value > bound else WITHIN)] += steps
    out = pd.DataFrame([{"staleness": v, "verdict": k, "steps": n}
                        for (v, k), n in counts.items()], columns=["staleness", "verdict", "steps"])
    return out.sort_values(["staleness", "verdict"]).reset_index(drop=True)


# ---------------------------------------------------------------------- ranks
def rank_label(entry: dict[str, Any]) -> str:
    """A rank's name on the charts' axis; an unreachable rank says so (it has no bars)."""
    return f"rank {entry['rank']}" + ("" if entry["reachable"] else " (unreachable)")


def ranks_table(view: dict[str, Any]) -> pd.DataFrame:
    """One row per rank of GET /runs/{id}/ranks: where it runs, whether it answered, its
    figures (blank where it did not answer or does not report the figure)."""
    rows = []
    for entry in view["ranks"]:
        f = entry.get("figures") or {}
        idle = f.get("idle_seconds") or {}
        bound = f.get("staleness_bound")
        rows.append({
            "rank": entry["rank"], "node": entry["node"],
            "status": "answering" if entry["reachable"] else entry["error"] or "no figures",
            "step": f.get("step"), "idle (s)": sum(idle.values()) if idle else None,
            "sync_wait (s)": idle.get("sync_wait"),
            "staleness": None if f.get("staleness") is None else
            f"{f['staleness']} / {bound if bound is not None else '-'}",
            "refreshes": f.get("refreshes"), "failed": f.get("refresh_failures"),
            "refresh work (s)": f.get("refresh_seconds"), "blocks owned": f.get("owned_blocks"),
            "bytes sent": f.get("bytes_sent"), "bytes received": f.get("bytes_received")})
    return pd.DataFrame(rows)


def idle_by_rank(view: dict[str, Any]) -> pd.DataFrame:
    """Idle seconds since the start per (rank, cause), long form: rank, series, value, order
    (sync_wait first, so it sits at the bottom of each rank's stack)."""
    order = tuple(view.get("idle_causes", ()))  # the API's stacking order
    rows = [{"rank": rank_label(e), "series": cause, "value": seconds,
             "order": order.index(cause) if cause in order else len(order)}
            for e in view["ranks"] if e["reachable"]
            for cause, seconds in (e["figures"].get("idle_seconds") or {}).items()]
    return pd.DataFrame(rows, columns=["rank", "series", "value", "order"])


def rank_figures(view: dict[str, Any], fields: dict[str, str]) -> pd.DataFrame:
    """{figure: series name} of every rank that answered, long form: rank, series, value."""
    rows = [{"rank": rank_label(e), "series": name, "value": e["figures"][field]}
            for e in view["ranks"] if e["reachable"]
            for field, name in fields.items() if e["figures"].get(field) is not None]
    return pd.DataFrame(rows, columns=["rank", "series", "value"])
