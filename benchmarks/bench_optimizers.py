"""AdamW vs SOAP vs Shampoo vs KL-Shampoo on the default GPT and the embedded corpus.

    .venv/bin/python benchmarks/bench_optimizers.py                 # 500 steps, 3 lrs each
    .venv/bin/python benchmarks/bench_optimizers.py --steps 100 --optimizers soap --lrs 3e-3

Each optimizer trains the default model with the trainer's defaults (warmup, cosine decay, grad
clipping, weight decay on matrices) at each lr of its grid; the best lr is the one with the
lowest final validation loss. Second-order optimizers run in the native synchronous mode (the
reference: refreshes inline at the step boundary, no delay, policy workers = 0) with the policy's
refresh interval. Reports final validation loss per lr, step time (median of non-refresh steps,
mean, p99, max, median of refresh steps), and the time of one full refresh: refresh_fn over every
block of the final optimizer state, timed one block at a time. Writes JSON after every run (so a
partial run keeps its results) and a loss-vs-step PNG at the end. On a shared machine the
per-run step times drift with the load, so the step-time table comes from a separate pass that
steps all optimizers in turn (`--timing-steps`, `--timing-only` to redo just that pass).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from asteria_core.cli import resolve_config
from asteria_core.optim import BlockPreconditioner, refresh_fn
from asteria_core.train.trainer import Trainer

OPTIMIZERS = ("adamw", "soap", "shampoo", "kl_shampoo")
DEFAULT_LRS = (1e-3, 3e-3, 1e-2)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def time_full_refresh(optimizer: BlockPreconditioner) -> dict:
    """Snapshot + refresh_fn for every block, one after another (what one refresh step costs)."""
    per_block = []
    for block in optimizer.refresh_blocks():
        t0 = time.perf_counter()
        refresh_fn(optimizer.snapshot(block.key), optimizer.refresh_config(block.key))
        per_block.append((time.perf_counter() - t0, block.size))
    seconds = [s for s, _ in per_block]
    return {"blocks": len(per_block), "total_s": sum(seconds), "max_block_s": max(seconds),
            "largest_block": max(size for _, size in per_block)}


def one_run(name: str, lr: float, args, overrides: list[str], out_dir: str) -> dict:
    config = resolve_config(None, [
        "--train.steps", str(args.steps), "--train.out_dir", out_dir,
        "--train.eval_interval", str(args.eval_interval), "--train.threads", str(args.threads),
        "--optim.name", name, "--optim.lr", str(lr), "--policy.workers", "0",
        "--policy.swap_delay", "0", "--telemetry.enabled", "false", *overrides])
    trainer = Trainer(config, jsonl=False)
    records, refresh_steps = [], set()
    trainer.runtime.add_listener(records.append)
    if isinstance(trainer.optimizer, BlockPreconditioner):
        trainer.runtime.at_boundary(
            lambda step: refresh_steps.add(step) if trainer.optimizer.due_blocks() else None)
    t0 = time.perf_counter()
    result = trainer.train(progress=False)
    wall = time.perf_counter() - t0
    refresh = None
    if isinstance(trainer.optimizer, BlockPreconditioner):
        refresh = time_full_refresh(trainer.optimizer)
    trainer.close()

    steps = [r.step_seconds for r in records[5:]]  # the first steps warm up allocators
    plain = [r.step_seconds for r in records[5:] if r.step not in refresh_steps]
    at_refresh = [r.step_seconds for r in records[5:] if r.step in refresh_steps]
    return {
        "optimizer": name, "lr": lr, "params": trainer.model_params, "wall_s": wall,
        "final_val_loss": result.eval_losses[max(result.eval_losses)],
        "val_losses": {str(k): v for k, v in sorted(result.eval_losses.items())},
        "train_losses": [r.loss for r in records],
        "step_ms": {"median_plain": 1e3 * statistics.median(plain),
                    "mean": 1e3 * statistics.mean(steps), "p99": 1e3 * percentile(steps, 0.99),
                    "max": 1e3 * max(steps),
                    "median_refresh_step": 1e3 * statistics.median(at_refresh)
                    if at_refresh else None},
        "refresh_steps": len(refresh_steps), "full_refresh": refresh,
    }


def interleaved_timing(best: dict[str, dict], args, overrides: list[str], out_dir: str) -> dict:
    """Step times of every optimizer at its best lr, one step of each in turn.

    On a shared machine the load drifts over a long benchmark; interleaving puts every optimizer
    under the same drift, so their ratios are comparable even when absolute times are noisy.
    """
    trainers, times, refresh = {}, {}, {}
    for name, run in best.items():
        config = resolve_config(None, [
            "--train.steps", str(args.steps), "--train.out_dir", out_dir,
            "--train.threads", str(args.threads), "--optim.name", name,
            "--optim.lr", str(run["lr"]), "--policy.workers", "0", "--policy.swap_delay", "0",
            "--telemetry.enabled", "false", *overrides])
        trainers[name] = Trainer(config, jsonl=False)
        times[name], refresh[name] = [], []
    for _ in range(args.timing_steps):
        for name, trainer in trainers.items():
            record = trainer.train_step()
            due = isinstance(trainer.optimizer, BlockPreconditioner) and \
                bool(trainer.optimizer.due_blocks())
            (refresh if due else times)[name].append(record.step_seconds)
    summary = {}
    for name, trainer in trainers.items():
        plain, at_refresh = times[name][5:], refresh[name][1:]  # skip warm-up and first refresh
        every = plain + at_refresh
        summary[name] = {
            "median_plain_ms": 1e3 * statistics.median(plain),
            "mean_ms": 1e3 * statistics.mean(every), "p99_ms": 1e3 * percentile(every, 0.99),
            "max_ms": 1e3 * max(every),
            "median_refresh_step_ms": 1e3 * statistics.median(at_refresh) if at_refresh else None,
            "full_refresh": time_full_refresh(trainer.optimizer)
            if isinstance(trainer.optimizer, BlockPreconditioner) else None}
        trainer.close()
    return summary


def timing_table(timing: dict) -> str:
    lines = ["| optimizer | step ms median (no refresh) | mean | p99 | max | refresh step ms "
             "(median) | one full refresh s (blocks, largest b) |", "|" + "---|" * 7]
    for name, t in timing.items():
        refresh_ms = "-" if t["median_refresh_step_ms"] is None else \
            f"{t['median_refresh_step_ms']:.0f}"
        full = t["full_refresh"]
        full_s = "-" if full is None else \
            f"{full['total_s']:.3f} ({full['blocks']}, {full['largest_block']})"
        lines.append(f"| {name} | {t['median_plain_ms']:.0f} | {t['mean_ms']:.0f} | "
                     f"{t['p99_ms']:.0f} | {t['max_ms']:.0f} | {refresh_ms} | {full_s} |")
    return "\n".join(lines)


def best_runs(runs: list[dict]) -> dict[str, dict]:
    best: dict[str, dict] = {}
    for run in runs:
        if run["optimizer"] not in best or run["final_val_loss"] < \
                best[run["optimizer"]]["final_val_loss"]:
            best[run["optimizer"]] = run
    return best


def table(runs: list[dict]) -> str:
    best = best_runs(runs)
    lines = ["| optimizer | val loss per lr | best lr | best val | step ms median | mean | "
             "p99 | max | refresh step ms | full refresh s |", "|" + "---|" * 10]
    for name, run in best.items():
        per_lr = ", ".join(f"{r['lr']:g}: {r['final_val_loss']:.4f}" for r in runs
                           if r["optimizer"] == name)
        ms, full = run["step_ms"], run["full_refresh"]
        refresh_ms = "-" if ms["median_refresh_step"] is None else \
            f"{ms['median_refresh_step']:.0f}"
        full_s = "-" if full is None else f"{full['total_s']:.3f} ({full['blocks']} blocks)"
        lines.append(f"| {name} | {per_lr} | {run['lr']:g} | {run['final_val_loss']:.4f} | "
                     f"{ms['median_plain']:.0f} | {ms['mean']:.0f} | {ms['p99']:.0f} | "
                     f"{ms['max']:.0f} | {refresh_ms} | {full_s} |")
    return "\n".join(lines)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_train, ax_val) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, run in best_runs(runs).items():
        losses, smooth, ema = run["train_losses"], [], None
        for loss in losses:
            ema = loss if ema is None else 0.95 * ema + 0.05 * loss
            smooth.append(ema)
        label = f"{name} (lr {run['lr']:g})"
        ax_train.plot(range(1, len(losses) + 1), smooth, label=label)
        val = run["val_losses"]
        ax_val.plot([int(k) for k in val], list(val.values()), marker="o", label=label)
    ax_train.set(xlabel="step", ylabel="train loss (EMA 0.95)", title="training loss")
    ax_val.set(xlabel="step", ylabel="validation loss", title="validation loss")
    for ax in (ax_train, ax_val):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--eval-interval", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS))
    parser.add_argument("--lrs", default=",".join(map(str, DEFAULT_LRS)))
    parser.add_argument("--out", default="benchmarks/results/optimizers.json")
    parser.add_argument("--plot", default="benchmarks/results/optimizers_loss.png")
    parser.add_argument("--timing-steps", type=int, default=60,
                        help="interleaved steps per optimizer for the step-time table (0: skip)")
    parser.add_argument("--timing-only", action="store_true",
                        help="reuse the runs in --out; only redo the interleaved timing")
    parser.add_argument("--append", action="store_true",
                        help="add these runs to those in --out (e.g. to extend an lr grid)")
    args, overrides = parser.parse_known_args()  # the rest: trainer overrides (--model.n_embd)
    lrs = [float(x) for x in args.lrs.split(",")]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    summary = {"machine": f"{platform.machine()}, {args.threads} torch threads, "
                          f"torch {torch.__version__}",
               "steps": args.steps, "overrides": overrides, "lrs": lrs, "runs": []}
    if args.timing_only or args.append:
        summary = json.loads(out.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        for name in ([] if args.timing_only else args.optimizers.split(",")):
            for lr in lrs:
                run = one_run(name, lr, args, overrides, tmp)
                summary["runs"].append(run)
                print(f"{name} lr {lr:g}: val {run['final_val_loss']:.4f}, step "
                      f"{run['step_ms']['median_plain']:.0f} ms, {run['wall_s']:.0f} s",
                      flush=True)
                out.write_text(json.dumps(summary, indent=1))
        if args.timing_steps:
            summary["interleaved_timing"] = interleaved_timing(best_runs(summary["runs"]), args,
                                                               overrides, tmp)
            out.write_text(json.dumps(summary, indent=1))
    plot(summary["runs"], Path(args.plot))
    print("\n" + table(summary["runs"]))
    if "interleaved_timing" in summary:
        print("\n" + timing_table(summary["interleaved_timing"]))


if __name__ == "__main__":
    main()
