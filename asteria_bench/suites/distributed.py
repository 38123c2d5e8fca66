"""`distributed`: data-parallel SOAP: bytes, waits, refresh work and factor memory per rank.

Every configuration is a real torchrun job (gloo, `asteria_bench.ddp_rank`): a 0.43M-parameter
GPT (n_embd 128, 2 layers, 8 x 64 tokens per rank), 40 steps, refresh every 10, the first round
(every block's first eigendecomposition) left out of the per-step figures. Configurations:

- DDP AdamW: the first-order baseline at the same world size;
- Asteria SOAP, S in {1, 3, 5}: owner ranks refresh on one host worker each, the new bases
  travel in the background and every rank swaps them at step t + S;
- synchronous baseline: the owner refreshes inline at the refresh step and broadcasts at once,
  every rank waiting for it there (workers 0, swap delay 0: the same bytes, all waited for);
- Distributed Shampoo's scheme (each rank preconditions its own blocks and all-gathers the
  search directions every step): its bytes per step are the model's size x (world - 1) / world
  per rank; an AdamW run that also all-gathers a buffer of that size every step times it here.

Each repeat runs every configuration once, in turn (so drift falls on all alike); the tables
give medians over repeats. Absolute times on a few cores shared by up to 4 ranks (each with a
refresh worker) are not what a cluster sees; compare within a world size. --quick runs world
sizes 1 and 2 only, fewer configurations and steps.
"""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from asteria_bench.options import BenchOptions, progress
from asteria_bench.plots import pyplot, save
from asteria_bench.results import SuiteResult

TITLE = "Data-parallel SOAP: bytes and waits per step"
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Sizes:
    steps: int
    interval: int       # refresh interval; the first round is left out of per-step figures
    repeats: int
    worlds: tuple[int, ...]
    quick_configs: bool  # the reduced set of configurations
    n_layer: int = 2
    n_embd: int = 128
    block_size: int = 64


FULL = Sizes(steps=40, interval=10, repeats=3, worlds=(1, 2, 4), quick_configs=False)
QUICK = Sizes(steps=30, interval=10, repeats=1, worlds=(1, 2), quick_configs=True)

ADAMW = "DDP AdamW"
GATHER = "DDP AdamW + all-gather of the model per step (Distributed Shampoo's exchange)"
SYNC = "synchronous baseline (inline refresh, broadcast at the refresh step)"
# (world, label, short label for the plot, rank arguments, in the quick set)
CONFIGS = [
    (1, ADAMW, "AdamW", ["--optimizer", "adamw"], False),
    (1, "SOAP S=5", "SOAP S=5", ["--bound", "5"], True),
    (2, ADAMW, "AdamW", ["--optimizer", "adamw"], True),
    (2, GATHER, "AdamW +\nall-gather", ["--optimizer", "adamw", "--allgather"], True),
    (2, "Asteria SOAP S=1", "SOAP S=1", ["--bound", "1"], False),
    (2, "Asteria SOAP S=3", "SOAP S=3", ["--bound", "3"], False),
    (2, "Asteria SOAP S=5", "SOAP S=5", ["--bound", "5"], True),
    (2, SYNC, "sync\nbaseline", ["--bound", "5", "--workers", "0", "--delay", "0"], True),
    (4, ADAMW, "AdamW", ["--optimizer", "adamw"], False),
    (4, GATHER, "AdamW +\nall-gather", ["--optimizer", "adamw", "--allgather"], False),
    (4, "Asteria SOAP S=5", "SOAP S=5", ["--bound", "5"], False),
    (4, SYNC, "sync\nbaseline", ["--bound", "5", "--workers", "0", "--delay", "0"], False),
]


def configs(sizes: Sizes) -> list[tuple[int, str, str, list[str], bool]]:
    return [c for c in CONFIGS if c[0] in sizes.worlds and (c[4] or not sizes.quick_configs)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world: int, sizes: Sizes, args: list[str]) -> list[dict]:
    """One torchrun job of `world` ranks; each rank's report. A port another process took
    between choosing it and binding it fails the rendezvous: one retry on a new port."""
    for attempt in range(2):
        with tempfile.TemporaryDirectory(prefix="asteria-bench-ddp-") as out:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                   str(world), "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
                   "-m", "asteria_bench.ddp_rank", "--out", out, "--steps", str(sizes.steps),
                   "--interval", str(sizes.interval), "--n-layer", str(sizes.n_layer),
                   "--n-embd", str(sizes.n_embd), "--block-size", str(sizes.block_size), *args]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
            if proc.returncode == 0:
                return [json.loads((Path(out) / f"rank{r}.json").read_text())
                        for r in range(world)]
            text = proc.stdout[-3000:] + proc.stderr[-3000:]
            if attempt == 0 and "address already in use" in text.lower():
                continue
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text}")
    raise AssertionError("unreachable")


def summary(label: str, world: int, ranks: list[dict], sizes: Sizes) -> dict:
    rounds = max(1, sizes.steps // sizes.interval)
    sent = sum(r["bytes_sent"] for r in ranks)
    return {
        "label": label, "world": world,
        "step_ms": statistics.median(r["step_ms_median"] for r in ranks),
        "step_ms_mean": statistics.fmean(r["step_ms_mean"] for r in ranks),
        "sync_wait_ms_per_step": statistics.fmean(r["sync_wait_ms_per_step"] for r in ranks),
        "refresh_wait_ms_per_step": statistics.fmean(r["refresh_wait_ms_per_step"]
                                                     for r in ranks),
        "staleness_max": max(r["staleness_max"] for r in ranks),
        "refreshes_per_rank": [r["refreshes"] for r in ranks],
        "refresh_seconds_per_rank": [round(r["refresh_seconds"], 4) for r in ranks],
        "factor_bytes_per_rank": [r["factor_bytes"] for r in ranks],
        "bytes_per_step_per_rank": statistics.fmean(
            (r["bytes_sent"] + r["bytes_received"]) / sizes.steps for r in ranks),
        "bytes_sent_per_round": sent / rounds,
        "allgather_ms_per_step": ranks[0]["allgather_ms_per_step"],
        "allgather_bytes_per_step_per_rank": ranks[0]["allgather_bytes_per_step"],
        "eval_loss": ranks[0]["eval_loss"],
        "ranks": ranks,
    }


def merge(repeats: list[dict]) -> dict:
    """One configuration over repeats: medians of the timed figures, the rest as measured."""
    row = {k: v for k, v in repeats[-1].items() if k != "ranks"}
    for key in ("step_ms", "step_ms_mean", "sync_wait_ms_per_step", "refresh_wait_ms_per_step",
                "allgather_ms_per_step"):
        values = [r[key] for r in repeats if r[key] is not None]
        row[key] = statistics.median(values) if values else None
        row[f"{key}_runs"] = values
    row["staleness_max"] = max(r["staleness_max"] for r in repeats)
    return row


def run(opts: BenchOptions) -> SuiteResult:
    sizes = opts.pick(QUICK, FULL)
    chosen = configs(sizes)
    result = SuiteResult("distributed", TITLE, opts.quick, opts.command,
                         config={**asdict(sizes), "backend": "gloo", "batch_per_rank": 8,
                                 "configurations": [[w, label, args]
                                                    for w, label, _, args, _ in chosen]})
    per_config: list[list[dict]] = [[] for _ in chosen]
    for repeat in range(sizes.repeats):
        for i, (world, label, _, args, _) in enumerate(chosen):
            with progress(1, f"distributed: world {world}, {label.split(' (')[0]}", opts) as bar:
                s = summary(label, world, launch(world, sizes, args), sizes)
                bar.update(1)
            per_config[i].append(s)
            result.runs.append({"repeat": repeat, **s})
            result.save(opts.out_dir)
    rows = [merge(r) for r in per_config]
    summarize(result, rows, chosen, sizes)
    plot(result, rows, chosen, opts)
    result.save(opts.out_dir)
    return result


def summarize(result: SuiteResult, rows: list[dict], chosen: list, sizes: Sizes) -> None:
    t = result.table(
        f"Data-parallel SOAP on gloo ({sizes.steps} steps, refresh every {sizes.interval}, the "
        f"first round left out; medians of {sizes.repeats} repeats)",
        ["world", "configuration", "step p50 ms", "step mean ms", "sync_wait ms/step",
         "refresh_wait ms/step", "staleness max", "refreshes per rank", "factor KiB per rank",
         "exchange bytes/step/rank", "bytes sent per round", "eval loss"],
        note="exchange bytes of the all-gather row: the all-gather's own bytes per step per rank")
    for r in rows:
        per_step = r["allgather_bytes_per_step_per_rank"] or r["bytes_per_step_per_rank"]
        soap = any(r["refreshes_per_rank"])
        t.add(r["world"], r["label"], round(r["step_ms"], 2), round(r["step_ms_mean"], 2),
              round(r["sync_wait_ms_per_step"], 3), round(r["refresh_wait_ms_per_step"], 3),
              r["staleness_max"],
              "/".join(map(str, r["refreshes_per_rank"])) if soap else "-",
              "/".join(str(b // 1024) for b in r["factor_bytes_per_rank"]) if soap else "-",
              round(per_step), round(r["bytes_sent_per_round"]), round(r["eval_loss"], 4))

    def find(world: int, label: str) -> dict | None:
        return next((r for r in rows if r["world"] == world and r["label"] == label), None)

    one = find(1, "SOAP S=5")
    for world in sizes.worlds:
        if world == 1:
            continue
        soap, sync, gather, adamw = (find(world, "Asteria SOAP S=5"), find(world, SYNC),
                                     find(world, GATHER), find(world, ADAMW))
        if soap and one:
            mem = sum(soap["factor_bytes_per_rank"]) / world / sum(one["factor_bytes_per_rank"])
            result.findings.append(
                f"Factor memory per rank at {world} ranks is {mem:.2f}x one process's "
                f"({'/'.join(str(b // 1024) for b in soap['factor_bytes_per_rank'])} KiB "
                f"against {one['factor_bytes_per_rank'][0] // 1024} KiB): every block has one "
                f"owner.")
            if world == 2:
                result.quote("factor_memory_per_rank_2", round(mem, 3),
                             "at 2 ranks each rank keeps {value:.2f}x the factor memory of one "
                             "process")
        if soap and sync:
            result.findings.append(
                f"At {world} ranks, SOAP with S = 5 waited {soap['sync_wait_ms_per_step']:.2f} "
                f"ms per step for other ranks' bases, against "
                f"{sync['sync_wait_ms_per_step']:.2f} ms for the synchronous baseline (inline "
                f"refresh, broadcast at the refresh step); step mean {soap['step_ms_mean']:.1f} "
                f"against {sync['step_ms_mean']:.1f} ms.")
            if world == 2:
                result.quote("sync_wait_ms_async_2", round(soap["sync_wait_ms_per_step"], 3),
                             "at 2 ranks the asynchronous exchange (S = 5) waits {value:.2f} ms "
                             f"per step, the synchronous baseline "
                             f"{sync['sync_wait_ms_per_step']:.2f} ms")
        if soap and gather and gather["allgather_bytes_per_step_per_rank"]:
            ratio = soap["bytes_per_step_per_rank"] / gather["allgather_bytes_per_step_per_rank"]
            result.findings.append(
                f"At {world} ranks and refresh interval {sizes.interval}, Asteria's exchange "
                f"moves {soap['bytes_per_step_per_rank']:,.0f} bytes per step per rank, "
                f"{ratio:.2f}x Distributed Shampoo's per-step all-gather "
                f"({gather['allgather_bytes_per_step_per_rank']:,.0f}), which cost "
                f"{gather['allgather_ms_per_step']:.2f} ms per step here.")
            if world == 2:
                result.quote("bytes_vs_allgather_2", round(ratio, 3),
                             f"at refresh interval {sizes.interval} its bytes per step are "
                             "{value:.2f}x Distributed Shampoo's per-step all-gather")
        if soap and adamw:
            result.findings.append(
                f"A SOAP step at {world} ranks took {soap['step_ms'] / adamw['step_ms']:.2f}x "
                f"DDP AdamW's ({soap['step_ms']:.1f} against {adamw['step_ms']:.1f} ms, p50).")


def plot(result: SuiteResult, rows: list[dict], chosen: list, opts: BenchOptions) -> None:
    plt = pyplot()

    worlds = sorted({r["world"] for r in rows})
    fig, axes = plt.subplots(2, len(worlds), figsize=(3.6 * len(worlds) + 1, 5.6),
                             squeeze=False)
    for j, world in enumerate(worlds):
        picked = [(c[2], r) for c, r in zip(chosen, rows, strict=True) if r["world"] == world]
        names = [n for n, _ in picked]
        axes[0][j].bar(names, [r["step_ms"] for _, r in picked], color="#3b75af")
        axes[0][j].set_title(f"world {world}")
        axes[1][j].bar(names, [r["sync_wait_ms_per_step"] for _, r in picked], color="#d9822b")
        for ax in axes[0][j], axes[1][j]:
            ax.tick_params(axis="x", labelsize=7)
    axes[0][0].set_ylabel("step p50 (ms)")
    axes[1][0].set_ylabel("sync_wait (ms/step)")
    fig.tight_layout()
    result.plots.append(save(fig, opts.out_dir / "distributed.png", "Step time (p50) and time "
        "spent waiting for other ranks' bases per step, per configuration and "
        "world size (gloo).", dpi=120))
