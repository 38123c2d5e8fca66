"""The straggler suite's words: each straggler with owners fixed and with rebalancing, against
no straggler (medians over repeats)."""

from __future__ import annotations

from typing import Any

from asteria_bench.results import Words
from asteria_bench.suites.straggler import merge


def render(data: dict[str, Any], words: Words) -> None:
    config = data["config"]
    rows = [merge([r for r in data["runs"] if r["label"] == c["label"]])
            for c in config["configurations"]]
    slower = config["slower"]
    t = words.table(
        f"2 ranks, each pinned to a CPU with its refresh worker; rank 1 a straggler "
        f"({config['steps']} steps, width {config['n_embd']}, refresh every "
        f"{config['interval']}, S = 2; medians of {config['repeats']} repeats, timings after "
        "the first round)",
        ["configuration", "step p50 ms", "step mean ms", "sync_wait ms/step",
         "refresh_wait ms/step", "staleness max", "refresh seconds per rank", "blocks moved",
         "eval loss"],
        note="sync_wait and refresh_wait: the mean over ranks; refresh seconds: the work each "
             "rank's worker did (last repeat); blocks moved: ownership changes (last repeat)")
    for r in rows:
        t.add(r["label"], round(r["step_ms"], 1), round(r["step_ms_mean"], 1),
              round(r["sync_wait_ms_per_step"], 2), round(r["refresh_wait_ms_per_step"], 2),
              r["staleness_max"], "/".join(f"{s:.1f}" for s in r["refresh_seconds_per_rank"]),
              r["blocks_moved"], round(r["eval_loss"], 4))
    base, pairs = rows[0], [rows[i:i + 2] for i in range(1, len(rows), 2)]
    for fixed, moving in pairs:
        what = ("With a busy loop on rank 1's CPU" if fixed["with_hog"] else
                f"With rank 1's refreshes {slower:g}x slower")
        words.findings.append(
            f"{what} and owners fixed, the mean step took "
            f"{fixed['step_ms_mean']:.1f} ms and waited {fixed['sync_wait_ms_per_step']:.2f} ms "
            f"per step for other ranks' bases; with rebalancing {moving['step_ms_mean']:.1f} ms "
            f"and {moving['sync_wait_ms_per_step']:.2f} ms (no straggler: "
            f"{base['step_ms_mean']:.1f} ms and {base['sync_wait_ms_per_step']:.2f} ms).")
        if moving["blocks_moved"]:
            words.findings.append(
                f"{what}, rebalancing moved {moving['blocks_moved']} "
                f"blocks (owned per rank {moving['owned_first']} -> {moving['owned_last']}); "
                f"rank 1's worker refreshed for {moving['refresh_seconds_per_rank'][1]:.1f} s "
                f"against {fixed['refresh_seconds_per_rank'][1]:.1f} s with owners fixed.")
        else:
            words.findings.append(
                f"{what}, no block moved: the ranks' measured refresh "
                "speeds stayed within the 20% rule, so any difference between the two rows is "
                "not ownership" + (" (the busy loop slows rank 1's training as much as its "
                                  "worker, and rank 0's worker shares its CPU with rank 0's "
                                  "training: both workers get about half a CPU)."
                                  if fixed["with_hog"] else "."))
        same = fixed["eval_loss_runs"] == moving["eval_loss_runs"]
        words.findings.append(
            f"{what}, the eval loss with owners fixed and with rebalancing "
            "is " + ("the same in every repeat, bit for bit: ownership changes who computes a "
                     "refresh, not its numbers." if same else
                     f"not the same ({fixed['eval_loss_runs']} against "
                     f"{moving['eval_loss_runs']})."))
    fixed, moving = pairs[0]
    words.quote("blocks_moved", moving["blocks_moved"],
                f"with rank 1's refreshes {slower:g}x slower, rebalancing moved {{value}} "
                "blocks")
    words.quote("sync_wait_ms_fixed", round(fixed["sync_wait_ms_per_step"], 3),
                "owners fixed wait {value:.2f} ms per step for bases, rebalancing "
                f"{moving['sync_wait_ms_per_step']:.2f} ms")
