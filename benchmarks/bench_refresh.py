"""Refresh off the critical path: step-time smoothness and speed of Asteria vs native.

    .venv/bin/python benchmarks/bench_refresh.py --steps 120            # the comparison
    .venv/bin/python benchmarks/bench_refresh.py --steps 120 --sweep    # + staleness sweep

Model: a 3.3M-parameter GPT (n_embd 256, 4 layers, batch 16 x 128 tokens) whose SOAP refresh
(every 10 steps) is a large share of a native step on a CPU. Each configuration trains the same
seed for the same steps; the table gives step-time p50/p99/max/mean (steps after the first 10,
which hold the initial eigendecompositions of every variant), and the final validation loss.
Writes benchmarks/results/refresh.json and a step-time trace plot refresh_steps.png
(both named after --out).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from asteria_core.cli import resolve_config
from asteria_core.train.trainer import Trainer

MODEL = ["--model.n_embd", "256", "--model.n_head", "4", "--model.n_layer", "4",
         "--data.batch_size", "16", "--policy.refresh_interval", "10"]


def configs(sweep: bool) -> list[tuple[str, list[str]]]:
    soap, kl = ["--optim.name", "soap", "--optim.lr", "3e-3"], \
        ["--optim.name", "kl_shampoo", "--optim.lr", "1e-3"]
    native = ["--policy.workers", "0", "--policy.swap_delay", "0"]

    def asteria(bound: int, train_threads: int = 2, kind: str = "thread", pace: bool = True
                ) -> list[str]:
        # d = S: a round's result is swapped in `bound` steps after its statistics, which
        # lets pacing spread the round over min(d, S, interval) steps.
        return ["--policy.workers", "1", "--policy.staleness_bound", str(bound),
                "--policy.swap_delay", str(bound), "--train.threads", str(train_threads),
                "--policy.worker_kind", kind, "--policy.pace", str(pace).lower()]

    out = [
        ("AdamW", ["--optim.name", "adamw", "--optim.lr", "3e-3"]),
        ("native SOAP", soap + native),
        ("Asteria-SOAP (train 2 thr + 1 worker thread, paced)", soap + asteria(10)),
        ("Asteria-SOAP (train 2 thr + 1 worker thread, burst)", soap + asteria(10, pace=False)),
        ("Asteria-SOAP (train 2 thr + 1 worker process, paced)",
         soap + asteria(10, kind="process")),
        ("Asteria-SOAP (train 1 thr + 1 worker thread, paced)", soap + asteria(10, 1)),
        ("native KL-Shampoo", kl + native),
        ("Asteria-KL-Shampoo (train 2 thr + 1 worker thread, paced)", kl + asteria(10)),
    ]
    if sweep:
        out += [(f"Asteria-SOAP S={s}", soap + asteria(s)) for s in (1, 2, 3, 5, 10)]
    return out


def run(label: str, args: list[str], steps: int, out_dir: str) -> dict:
    config = resolve_config(None, [*MODEL, "--train.steps", str(steps), "--train.eval_interval",
                                   str(steps), "--train.out_dir", out_dir, *args])
    torch.set_num_threads(config.train.threads or 2)
    trainer = Trainer(config, jsonl=False)
    records = []
    trainer.record_sinks.append(records.append)
    t0 = time.perf_counter()
    result = trainer.train(progress=False)
    wall = time.perf_counter() - t0
    trainer.close()
    steady = sorted(r.step_seconds for r in records[10:])
    waits = [r.extra.get("idle_seconds", {}).get("refresh_wait", 0.0) for r in records]
    return {
        "label": label, "args": args, "params": trainer.model_params, "wall_s": wall,
        "p50_ms": 1e3 * steady[len(steady) // 2],
        "p99_ms": 1e3 * steady[min(len(steady) - 1, int(len(steady) * 0.99))],
        "max_ms": 1e3 * steady[-1], "mean_ms": 1e3 * statistics.fmean(steady),
        "refresh_wait_s": sum(waits),
        "staleness_max": max((r.extra.get("staleness_max", 0) for r in records), default=0),
        "final_val_loss": result.eval_losses[max(result.eval_losses)],
        "trace_ms": [1e3 * r.step_seconds for r in records],
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in results:
        if "S=" not in r["label"]:
            ax.plot(r["trace_ms"], label=r["label"], linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("step time (ms, measured; log scale)")
    ax.set_yscale("log")
    ax.set_title("Step time per step, refresh every 10 steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--only", help="run only configurations whose label contains this")
    parser.add_argument("--out", default="benchmarks/results/refresh.json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, extra in configs(args.sweep):
            if args.only and args.only not in label:
                continue
            results.append(run(label, extra, args.steps, tmp))
            r = results[-1]
            print(f"{label}: p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, mean "
                  f"{r['mean_ms']:.0f} ms, val {r['final_val_loss']:.4f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": args.steps, "results": results}, indent=2))
    plot(results, out.with_name(out.stem + "_steps.png"))
    print(f"\n{results[0]['params'] / 1e6:.1f}M parameters, {args.steps} steps, refresh every "
          "10 steps\n\n| config | p50 ms | p99 ms | max ms | mean ms | p99/p50 | refresh wait s "
          "| max staleness | val loss | wall s |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['label']} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_ms']:.0f} | "
              f"{r['mean_ms']:.0f} | {r['p99_ms'] / r['p50_ms']:.2f} | {r['refresh_wait_s']:.2f} | "
              f"{r['staleness_max']} | {r['final_val_loss']:.4f} | {r['wall_s']:.0f} |")


if __name__ == "__main__":
    main()
