"""The distributed suite's words: each configuration at each world size (medians over seeds),
and Asteria SOAP against the synchronous exchange, Distributed Shampoo and DDP AdamW."""

from __future__ import annotations

import statistics
from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites.distributed import (
    ADAMW,
    DS_FP32,
    FSDP_DS,
    FSDP_SOAP,
    FULL,
    HOW_TO_GET,
    SHARDED,
    SYNC,
    merge,
)


def _kib(values: list[int]) -> str:
    return "/".join(f"{b / 1024:,.0f}" for b in values)


def _find(rows: list[dict], world: int, label: str) -> dict | None:
    return next((r for r in rows if r["world"] == world and r["label"] == label), None)


def loss_gap(row: dict, sync: dict) -> float:
    """Mean over seeds of the row's eval loss minus the synchronous exchange's, seed by seed."""
    return statistics.fmean(a - b for a, b in zip(row["eval_loss_runs"],
                                                  sync["eval_loss_runs"], strict=True))


def _first_three(row: dict, sync: dict) -> str:
    """With more than the default 3 seeds, the gap over the first 3 alone (the default run's)."""
    if len(row["seeds"]) <= FULL.seeds:
        return ""
    n = FULL.seeds
    first = statistics.fmean(a - b for a, b in zip(row["eval_loss_runs"][:n],
                                                   sync["eval_loss_runs"][:n], strict=True))
    return f" ({first:+.4f} over the first {n} seeds alone)"


def render(data: dict[str, Any], words: Words) -> None:
    config = data["config"]
    if not config["distributed_shampoo"]:
        words.findings.append(HOW_TO_GET + ".")
    rows = [merge([r for r in data["runs"] if r["world"] == world and r["label"] == label])
            for world, label, _ in config["configurations"]]
    steps = config["steps"]
    evals = [f"eval loss at {step}" for step in config["eval_at"]]
    t = words.table(
        f"Data-parallel SOAP and Distributed Shampoo on gloo ({steps} steps, refresh "
        f"every {config['interval']}, lr 3e-3; timings after the first round, medians over "
        "seeds; losses means over seeds)",
        ["world", "configuration", "seeds", "step p50 ms", "step mean ms", "sync_wait ms/step",
         "staleness max", "state KiB per rank", "bytes/step/rank", "bytes/round/rank",
         "first round bytes/rank", *evals, f"eval loss at {steps}"],
        note="bytes: sent + received per rank, every collective the optimizer posts (not DDP's "
             "gradient all-reduce); Distributed Shampoo all-gathers every step, Asteria sends "
             "bases once per round plus an 8-byte policy header per step")
    for r in rows:
        t.add(r["world"], r["label"], len(r["seeds"]), round(r["step_ms"], 2),
              round(r["step_ms_mean"], 2),
              "-" if r["sync_wait_ms_per_step"] is None else round(r["sync_wait_ms_per_step"], 3),
              r["staleness_max"], _kib(r["state_bytes_per_rank"]),
              round(r["bytes_per_step_per_rank"]),
              "-" if r["bytes_per_round_per_rank"] is None else
              round(r["bytes_per_round_per_rank"]),
              round(r["first_round_bytes_per_rank"]),
              *(round(r["eval_at"][str(step)], 4) for step in config["eval_at"]),
              round(r["eval_loss"], 4))
    for world in config["worlds"]:
        _findings(words, rows, world)


def _against(row: dict, ds: dict) -> tuple[float, float]:
    """`row`'s bytes per step per rank and state on its largest rank, each over Distributed
    Shampoo's."""
    return (row["bytes_per_step_per_rank"] / ds["bytes_per_step_per_rank"],
            max(row["state_bytes_per_rank"]) / max(ds["state_bytes_per_rank"]))


def _findings(words: Words, rows: list[dict], world: int) -> None:
    soap, sync, ds, adamw = (_find(rows, world, "Asteria SOAP S=5"), _find(rows, world, SYNC),
                             _find(rows, world, DS_FP32), _find(rows, world, ADAMW))
    if soap and ds:
        ratio, state = _against(soap, ds)
        words.findings.append(
            f"At {world} ranks Asteria SOAP (S = 5) moves {soap['bytes_per_step_per_rank']:,.0f}"
            f" bytes per step per rank, {ratio:.2f}x Distributed Shampoo's fp32 all-gather "
            f"({ds['bytes_per_step_per_rank']:,.0f}), both sent + received; it keeps "
            f"{state:.2f}x Distributed Shampoo's optimizer state on its largest rank "
            f"({_kib(soap['state_bytes_per_rank'])} against "
            f"{_kib(ds['state_bytes_per_rank'])} KiB): every rank holds every basis and moment, "
            f"only factors are split. Eval loss after the run: {soap['eval_loss']:.4f} against "
            f"{ds['eval_loss']:.4f}; step p50 {soap['step_ms']:.1f} against "
            f"{ds['step_ms']:.1f} ms.")
        if world == 2:
            words.quote("bytes_vs_distributed_shampoo_2", round(ratio, 4),
                        "at 2 ranks its bytes per step per rank are {value:.2f}x Distributed "
                        "Shampoo's fp32 all-gather (sent + received, every collective)")
    if sync:
        for s in (1, 3, 5):
            row = _find(rows, world, f"Asteria SOAP S={s}")
            if row and len(row["seeds"]) == len(sync["seeds"]):
                gap = loss_gap(row, sync)
                words.findings.append(
                    f"At {world} ranks, S = {s} ends {gap:+.4f} eval loss from the synchronous "
                    f"exchange (mean of {len(row['seeds'])} seeds' differences: "
                    + ", ".join(f"{a - b:+.4f}" for a, b in zip(
                        row["eval_loss_runs"], sync["eval_loss_runs"], strict=True))
                    + ")" + _first_three(row, sync)
                    + f", waiting {row['sync_wait_ms_per_step']:.2f} ms per step for other "
                      f"ranks' bases against {sync['sync_wait_ms_per_step']:.2f} ms.")
                if world == 2 and s == 5:
                    words.quote("loss_gap_s5_2", round(gap, 4),
                                "S = 5 ends {value:+.3f} eval loss from the synchronous "
                                "exchange at 2 ranks (mean over seeds)")
    fsdp, fsdp_ds = _find(rows, world, FSDP_SOAP), _find(rows, world, FSDP_DS)
    if fsdp and fsdp_ds:
        state = max(fsdp["state_bytes_per_rank"]) / max(fsdp_ds["state_bytes_per_rank"])
        words.findings.append(
            f"Under FSDP2 at {world} ranks each rank preconditions its own shards: Asteria "
            f"(S = 5) moves {fsdp['bytes_per_step_per_rank']:,.0f} bytes per step per rank "
            f"(the policy header), Distributed Shampoo's fully-shard distributor "
            f"{fsdp_ds['bytes_per_step_per_rank']:,.0f}; Asteria keeps {state:.2f}x its "
            f"optimizer state on the largest rank ({_kib(fsdp['state_bytes_per_rank'])} against "
            f"{_kib(fsdp_ds['state_bytes_per_rank'])} KiB); step p50 {fsdp['step_ms']:.1f} "
            f"against {fsdp_ds['step_ms']:.1f} ms; eval loss {fsdp['eval_loss']:.4f} against "
            f"{fsdp_ds['eval_loss']:.4f} ({len(fsdp['seeds'])} seed).")
    sharded = _find(rows, world, SHARDED)
    if sharded and ds:
        ratio, state = _against(sharded, ds)
        words.findings.append(
            f"At {world} ranks the sharded mode keeps {state:.2f}x Distributed Shampoo's "
            f"optimizer state on its largest rank ({_kib(sharded['state_bytes_per_rank'])} "
            f"against {_kib(ds['state_bytes_per_rank'])} KiB) and moves {ratio:.2f}x its bytes "
            f"per step ({sharded['bytes_per_step_per_rank']:,.0f}): the updates travel every "
            f"step, as Distributed Shampoo's do; step p50 {sharded['step_ms']:.1f} against "
            f"{ds['step_ms']:.1f} ms, eval loss {sharded['eval_loss']:.4f}.")
        if world == 2:
            words.quote("sharded_state_vs_distributed_shampoo_2", round(state, 4),
                        "in the sharded mode it keeps {value:.2f}x Distributed Shampoo's "
                        "state per rank")
    if soap and adamw:
        words.findings.append(
            f"A SOAP step at {world} ranks took {soap['step_ms'] / adamw['step_ms']:.2f}x "
            f"DDP AdamW's ({soap['step_ms']:.1f} against {adamw['step_ms']:.1f} ms, p50).")
